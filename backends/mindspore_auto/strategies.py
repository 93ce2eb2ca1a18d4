"""Which shard strategy each operator gets, and which pipeline stage each layer runs on.

Pure Python, so the tests can check the layout of any config without MindSpore. models.py looks
every strategy up here by operator name. A strategy is one tuple per operator input, each giving
how many ways that input's dimensions are split (MindSpore's `Primitive.shard` format).

The layout follows the seed tutorial's Transformer (Megatron-style): Q, K, V and the first FFN
matmul (the decoder LM's gate and up, w1 and w3) are split by output columns over the model-parallel
devices, the attention output and the second FFN matmul (w2) by input rows, so each block needs one
all-reduce forward and one backward. Attention runs head-parallel in between; norms, residuals and
the loss split only the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

from backends.mindspore_auto.parallel_config import ParallelConfig
from common.layout import cnn_layers
from common.spec import CnnSpec

Strategy = tuple[tuple[int, ...], ...]


def _linear(prefix: str, dp: int, mp: int, split: str, bias: bool = True) -> dict[str, Strategy]:
    """A dense layer whose weight is [out, in] (matmul with transpose_b).

    column: each device holds out/mp rows of the weight and produces out/mp columns;
    row: each device holds in/mp columns and produces a partial sum (all-reduced by MindSpore);
    none: replicated weight, batch split only.
    """
    if split == "column":
        table = {f"{prefix}.matmul": ((dp, 1), (mp, 1)), f"{prefix}.bias": ((dp, mp), (mp,))}
    elif split == "row":
        table = {f"{prefix}.matmul": ((dp, mp), (1, mp)), f"{prefix}.bias": ((dp, 1), (1,))}
    else:
        table = {f"{prefix}.matmul": ((dp, 1), (1, 1)), f"{prefix}.bias": ((dp, 1), (1,))}
    return table if bias else {f"{prefix}.matmul": table[f"{prefix}.matmul"]}


def _layer_norm(name: str, dp: int) -> dict[str, Strategy]:
    return {name: ((dp, 1), (1,), (1,))}


def _rms_norm(name: str, dp: int) -> dict[str, Strategy]:
    """models.RMSNorm's primitives on [rows, hidden]: the rows split by batch, the hidden axis whole."""
    rows = (dp, 1)
    return {f"{name}.square": (rows,), f"{name}.mean": (rows,), f"{name}.add_eps": (rows, ()),
            f"{name}.rsqrt": (rows,), f"{name}.normalize": (rows, rows), f"{name}.scale": (rows, (1,))}


def _token_table(cfg: ParallelConfig) -> Strategy:
    """vocab_emb_dp: the table is replicated and the token ids split by batch; otherwise the table's rows (the
    vocabulary) are split and every device looks up the whole batch in its slice."""
    return ((1, 1), (cfg.data_parallel, 1)) if cfg.vocab_emb_dp else ((cfg.model_parallel, 1), (1, 1))


def _head_parallel_attention(dp: int, mp: int) -> dict[str, Strategy]:
    """Between the column-split projections and the row-split output: [batch, heads, seq, head_dim] split by
    batch and by heads, as the projections left them; the softmax over keys stays whole."""
    heads = (dp, mp, 1, 1)
    return {"attention.split_heads": ((dp, 1, mp, 1),), "attention.scores": (heads, heads),
            "attention.scale": (heads, ()), "attention.softmax": (heads,), "attention.context": (heads, heads),
            "attention.merge_heads": (heads,)}


def _cross_entropy(dp: int, classes: int) -> dict[str, Strategy]:
    """Log-sum-exp cross-entropy from primitives, so that the class dimension may stay split."""
    return {
        "loss.max": ((dp, classes),),
        "loss.shift": ((dp, classes), (dp, 1)),
        "loss.exp": ((dp, classes),),
        "loss.sum_exp": ((dp, classes),),
        "loss.log": ((dp, 1),),
        "loss.one_hot": ((dp, classes), (), ()),
        "loss.pick": ((dp, classes), (dp, classes)),
        "loss.picked": ((dp, classes),),
    }


def bert_strategies(cfg: ParallelConfig) -> dict[str, Strategy]:
    dp, mp = cfg.data_parallel, cfg.model_parallel
    vocab = 1 if cfg.vocab_emb_dp else mp
    table: dict[str, Strategy] = {
        "embedding.token": _token_table(cfg),
        "embedding.add_position": ((dp, 1, 1), (1, 1)),
        "embedding.add_segment": ((dp, 1, 1), (1,)),
        "embedding.norm": ((dp, 1, 1), (1,), (1,)),
        "attention.mask": ((dp, 1, 1, 1), (1, 1, 1, 1)),
    }
    for proj in ("query", "key", "value"):
        table.update(_linear(f"attention.{proj}", dp, mp, "column"))
    table.update(_head_parallel_attention(dp, mp))
    table["attention.add_mask"] = ((dp, mp, 1, 1), (dp, 1, 1, 1))  # the padding mask: per sequence
    table.update(_linear("attention.output", dp, mp, "row"))
    table["attention.residual"] = ((dp, 1), (dp, 1))
    table.update(_layer_norm("attention.norm", dp))
    table.update(_linear("ffn.in", dp, mp, "column"))
    table["ffn.gelu"] = ((dp, mp),)
    table.update(_linear("ffn.out", dp, mp, "row"))
    table["ffn.residual"] = ((dp, 1), (dp, 1))
    table.update(_layer_norm("ffn.norm", dp))
    # The head works on the <= 20 gathered positions per sequence: one-hot rows select them with
    # a batched matmul that splits cleanly by batch (a gather would replicate the activations).
    table.update({"head.one_hot": ((dp, 1, 1), (), ()), "head.gather": ((dp, 1, 1), (dp, 1, 1))})
    table.update(_linear("head.dense", dp, mp, "none"))
    table["head.gelu"] = ((dp, 1),)
    table.update(_layer_norm("head.norm", dp))
    # The decoder is tied to the token table: split its vocabulary exactly when the table is.
    table["head.decoder.matmul"] = ((dp, 1), (vocab, 1))
    table["head.decoder.bias"] = ((dp, vocab), (vocab,))
    table.update(_cross_entropy(dp, vocab))
    return table


def decoder_strategies(cfg: ParallelConfig) -> dict[str, Strategy]:
    """The decoder LM (models.DecoderLM): Megatron's split of its projections, attention head-parallel by
    key/value head (each device holds whole groups of query heads: the key/value heads must divide by mp), and
    the untied output layer split by vocabulary exactly when the token table is (--vocab-split)."""
    dp, mp = cfg.data_parallel, cfg.model_parallel
    vocab = 1 if cfg.vocab_emb_dp else mp
    table: dict[str, Strategy] = {"embedding.token": _token_table(cfg)}
    for norm in ("attention_norm", "ffn_norm", "head.norm"):
        table.update(_rms_norm(norm, dp))
    for proj in ("wq", "wk", "wv"):
        table.update(_linear(f"attention.{proj}", dp, mp, "column", bias=False))
    table.update(_head_parallel_attention(dp, mp))
    heads, positions = (dp, mp, 1, 1), (1, 1)  # the rotary tables and the causal bias are [seq, ...] constants
    table.update({"attention.rotary.halves": (heads,), "attention.rotary.negate": (heads,),
                  "attention.rotary.join": (heads, heads), "attention.rotary.cos": (heads, positions),
                  "attention.rotary.sin": (heads, positions), "attention.rotary.add": (heads, heads),
                  "attention.add_mask": (heads, positions)})
    table.update(_linear("attention.wo", dp, mp, "row", bias=False))
    table["attention.residual"] = ((dp, 1), (dp, 1))
    for proj in ("w1", "w3"):
        table.update(_linear(f"ffn.{proj}", dp, mp, "column", bias=False))
    table.update({"ffn.sigmoid": ((dp, mp),), "ffn.silu": ((dp, mp), (dp, mp)), "ffn.gate": ((dp, mp), (dp, mp))})
    table.update(_linear("ffn.w2", dp, mp, "row", bias=False))
    table["ffn.residual"] = ((dp, 1), (dp, 1))
    table["head.output.matmul"] = ((dp, 1), (vocab, 1))
    table.update(_cross_entropy(dp, vocab))
    return table


def cnn_strategies(cfg: ParallelConfig, spec: CnnSpec) -> dict[str, Strategy]:
    """Convolutions and BatchNorm split the batch; the first two fc layers form a column/row pair."""
    dp, mp = cfg.data_parallel, cfg.model_parallel
    table: dict[str, Strategy] = {}
    for i in range(len(spec.conv_channels)):
        table[f"conv{i}.conv"] = ((dp, 1, 1, 1), (1, 1, 1, 1))
        table[f"conv{i}.bias"] = ((dp, 1, 1, 1), (1,))
        table[f"conv{i}.relu"] = ((dp, 1, 1, 1),)
    table.update(_linear("fc0", dp, mp, "column"))
    table["fc0.relu"] = ((dp, mp),)
    table.update(_linear("fc1", dp, mp, "row"))
    table["fc1.relu"] = ((dp, 1),)
    table.update(_linear("fc2", dp, mp, "none"))
    table.update(_cross_entropy(dp, 1))
    return table


def operator_strategies(workload: str, cfg: ParallelConfig, spec) -> dict[str, Strategy]:
    if workload == "cnn":
        return cnn_strategies(cfg, spec)
    return decoder_strategies(cfg) if workload == "lm" else bert_strategies(cfg)


@dataclass(frozen=True)
class Placement:
    stage: int          # pipeline stage the layer runs on
    fusion_group: int   # gradient communication-fusion group of its parameters


def layer_placement(layer_id: int, layers: int, cfg: ParallelConfig) -> Placement:
    """Contiguous layers per stage, the last stage taking any remainder (the tutorial's rule).

    With a pipeline every gradient goes in one fusion group: the stages reduce separately anyway.
    """
    stage = cfg.layout.stage_of_layer(layer_id, layers)
    per_group = max((layers + 1) // cfg.gradient_aggregation_group, 1)
    fusion = 2 if cfg.pipeline_stage > 1 else layer_id // per_group + 1
    return Placement(stage, fusion)


def stage_plan(workload: str, cfg: ParallelConfig, spec) -> dict[str, int]:
    """Pipeline stage of every stage-assigned part of a model, by the part's name in models.py (the MLM's and the
    decoder LM's: the embedding first, the layers, the head last)."""
    last = cfg.pipeline_stage - 1
    if workload in ("mlm", "lm"):
        plan = {"embedding": 0}
        plan.update({f"layers.{i}": layer_placement(i, spec.layers, cfg).stage for i in range(spec.layers)})
        plan["head"] = last
        return plan
    units = cnn_layers(spec)
    names = [f"conv{i}" for i in range(len(spec.conv_channels))] + [f"fc{i}" for i in range(len(spec.fc_sizes) + 1)]
    return {name: layer_placement(i, units, cfg).stage for i, name in enumerate(names)}
