"""Which shard strategy each operator gets, and which pipeline stage each layer runs on.

Pure Python, so the tests can check the layout of any config without MindSpore. models.py looks
every strategy up here by operator name. A strategy is one tuple per operator input, each giving
how many ways that input's dimensions are split (MindSpore's `Primitive.shard` format).

The layout follows the seed tutorial's Transformer (Megatron-style): Q, K, V and the first FFN
matmul are split by output columns over the model-parallel devices, the attention output and
the second FFN matmul by input rows, so each block needs one all-reduce forward and one backward.
Attention runs head-parallel in between; norms, residuals and the loss split only the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

from backends.mindspore_auto.parallel_config import ParallelConfig
from common.layout import cnn_layers
from common.spec import BertSpec, CnnSpec

Strategy = tuple[tuple[int, ...], ...]


def _linear(prefix: str, dp: int, mp: int, split: str) -> dict[str, Strategy]:
    """A dense layer whose weight is [out, in] (matmul with transpose_b).

    column: each device holds out/mp rows of the weight and produces out/mp columns;
    row: each device holds in/mp columns and produces a partial sum (all-reduced by MindSpore);
    none: replicated weight, batch split only.
    """
    if split == "column":
        return {f"{prefix}.matmul": ((dp, 1), (mp, 1)), f"{prefix}.bias": ((dp, mp), (mp,))}
    if split == "row":
        return {f"{prefix}.matmul": ((dp, mp), (1, mp)), f"{prefix}.bias": ((dp, 1), (1,))}
    return {f"{prefix}.matmul": ((dp, 1), (1, 1)), f"{prefix}.bias": ((dp, 1), (1,))}


def _layer_norm(name: str, dp: int) -> dict[str, Strategy]:
    return {name: ((dp, 1), (1,), (1,))}


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
        # vocab_emb_dp: the table is replicated and the token ids split by batch; otherwise the
        # table's rows are split and every device looks up the whole batch in its slice.
        "embedding.token": ((1, 1), (dp, 1)) if cfg.vocab_emb_dp else ((mp, 1), (1, 1)),
        "embedding.add_position": ((dp, 1, 1), (1, 1)),
        "embedding.add_segment": ((dp, 1, 1), (1,)),
        "embedding.norm": ((dp, 1, 1), (1,), (1,)),
        "attention.mask": ((dp, 1, 1, 1), (1, 1, 1, 1)),
    }
    for proj in ("query", "key", "value"):
        table.update(_linear(f"attention.{proj}", dp, mp, "column"))
    table.update({
        "attention.split_heads": ((dp, 1, mp, 1),),
        "attention.scores": ((dp, mp, 1, 1), (dp, mp, 1, 1)),
        "attention.scale": ((dp, mp, 1, 1), ()),
        "attention.add_mask": ((dp, mp, 1, 1), (dp, 1, 1, 1)),
        # Softmax over keys: the batch by dp and the heads by mp, as Q/K/V left them.
        "attention.softmax": ((dp, mp, 1, 1),),
        "attention.context": ((dp, mp, 1, 1), (dp, mp, 1, 1)),
        "attention.merge_heads": ((dp, mp, 1, 1),),
    })
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


def operator_strategies(workload: str, cfg: ParallelConfig, spec: CnnSpec | BertSpec) -> dict[str, Strategy]:
    return bert_strategies(cfg) if workload == "mlm" else cnn_strategies(cfg, spec)


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


def stage_plan(workload: str, cfg: ParallelConfig, spec: CnnSpec | BertSpec) -> dict[str, int]:
    """Pipeline stage of every stage-assigned part of a model, by the part's name in models.py."""
    last = cfg.pipeline_stage - 1
    if workload == "mlm":
        plan = {"embedding": 0}
        plan.update({f"layers.{i}": layer_placement(i, spec.layers, cfg).stage for i in range(spec.layers)})
        plan["head"] = last
        return plan
    units = cnn_layers(spec)
    names = [f"conv{i}" for i in range(len(spec.conv_channels))] + [f"fc{i}" for i in range(len(spec.fc_sizes) + 1)]
    return {name: layer_placement(i, units, cfg).stage for i, name in enumerate(names)}
