"""The workload spec: model shapes, training hyperparameters and analytical formulas.

Every backend builds its models and optimizers from these objects and reports
parameter counts and FLOPs from the formulas here, so that a table comparing
backends compares frameworks, not configurations.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

WORKLOADS = ("cnn", "mlm", "lm")
# What a sweep runs unless asked: the decoder LM (lm) is asked for by name (bench.compare --workloads lm).
DEFAULT_WORKLOADS = ("cnn", "mlm")
# The workloads whose samples are token sequences: their throughput is also counted in tokens.
TOKEN_WORKLOADS = ("mlm", "lm")

# ----------------------------------------------------------------------------- work: GEMMs and attention
# Every model (CnnSpec, BertSpec, common.predict.decoder.DecoderSpec) describes its forward work as GEMMs at their
# shapes (`gemms(samples)`) and attention's two products (`attention_flops(samples)`): the record's FLOPs, the
# predictor's compute and the planner's are counted from them here, once (forward_flops).


@dataclass(frozen=True)
class Linear:
    """One linear layer: `inputs` x `outputs` weights; `split` how Megatron's tensor parallel plan cuts it (column:
    outputs split; row: inputs split, its output all-reduced or reduce-scattered)."""
    name: str
    inputs: int
    outputs: int
    split: str


@dataclass(frozen=True)
class Gemm:
    """One GEMM C[m, n] = A[m, k] B[k, n] of a micro-batch on one rank."""
    name: str
    m: int
    n: int
    k: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


def linear_gemms(linears: Sequence[Linear], tokens: int, tp: int = 1) -> list[Gemm]:
    """The forward GEMMs of `linears` for `tokens` rows on one tensor-parallel rank."""
    return [Gemm(lin.name, tokens, lin.outputs // tp if lin.split == "column" else lin.outputs,
                 lin.inputs // tp if lin.split == "row" else lin.inputs) for lin in linears]


def attention_flops(queries: float, keys: int, width: float, causal: bool = False) -> float:
    """Forward FLOPs of attention's scores (Q K^T) and context (P V) for `queries` queries over `keys` keys each,
    `width` the heads' total width: 2 x 2 x queries x keys x width; half of it under a causal mask (flash attention
    skips the masked blocks; the flash-attention papers' convention, whose backward is 2.5 x this)."""
    return 4.0 * queries * keys * width * (0.5 if causal else 1.0)


class Model(Protocol):
    """What every model describes of itself to the record's FLOPs, the predictor and the planner."""

    def param_count(self) -> int: ...

    def gemms(self, samples: int) -> list[Gemm]: ...

    def attention_flops(self, samples: int) -> float: ...

    # Bytes one layer (the CNN: its whole body) keeps for its backward on one tensor-parallel rank, for `rows`
    # rows (tokens; the CNN's: samples), without recomputation: a stage under recompute keeps its layers' inputs
    # and one layer's of these (common.predict.memory).
    def stored_activation_bytes(self, rows: int, tp: int = 1, sequence_parallel: bool = False) -> float: ...


def forward_flops(model: Model, samples: int = 1) -> float:
    """Forward FLOPs of `samples` samples (a decoder's: sequences): its GEMMs and attention. Only matmuls and
    convolutions count; norms, activations and pools are a few percent."""
    return sum(g.flops for g in model.gemms(samples)) + model.attention_flops(samples)

# ----------------------------------------------------------------------------- CNN


@dataclass(frozen=True)
class CnnSpec:
    """SimpleCNN of the seed notebooks: four 3x3 valid convs (+BN+ReLU), two 2x2 max-pools, three FCs.

    28 -> 26 -> 24 -> pool 12 -> 10 -> 8 -> pool 4, so the flattened size is 128 * 4 * 4 = 2048.
    """
    image_size: int = 28
    in_channels: int = 1
    conv_channels: tuple[int, ...] = (16, 32, 64, 128)
    pool_after: tuple[bool, ...] = (False, True, False, True)
    kernel: int = 3
    fc_sizes: tuple[int, ...] = (1024, 128)
    num_classes: int = 10
    bn_eps: float = 1e-5
    bn_momentum: float = 0.1  # torch convention: weight of the new batch statistic

    def feature_maps(self) -> list[int]:
        """Spatial size after each conv (before its pool)."""
        size, sizes = self.image_size, []
        for pool in self.pool_after:
            size -= self.kernel - 1
            sizes.append(size)
            if pool:
                size //= 2
        return sizes

    @property
    def flat_features(self) -> int:
        last = self.feature_maps()[-1] // (2 if self.pool_after[-1] else 1)
        return self.conv_channels[-1] * last * last

    def param_count(self) -> int:
        total, cin = 0, self.in_channels
        for cout in self.conv_channels:
            total += cin * cout * self.kernel**2 + cout  # conv weight + bias
            total += 2 * cout                            # BatchNorm gamma, beta
            cin = cout
        fin = self.flat_features
        for fout in (*self.fc_sizes, self.num_classes):
            total += fin * fout + fout
            fin = fout
        return total

    def gemms(self, samples: int) -> list[Gemm]:
        """Each conv as the GEMM it lowers to (im2col: an output pixel a row, cin x k x k its reduction), the FCs."""
        out, cin = [], self.in_channels
        for i, (cout, size) in enumerate(zip(self.conv_channels, self.feature_maps())):
            out.append(Gemm(f"conv{i}", samples * size * size, cout, cin * self.kernel**2))
            cin = cout
        fin = self.flat_features
        for i, fout in enumerate((*self.fc_sizes, self.num_classes)):
            out.append(Gemm(f"fc{i}", samples, fout, fin))
            fin = fout
        return out

    def attention_flops(self, samples: int) -> float:
        return 0.0

    def stored_activation_bytes(self, rows: int, tp: int = 1, sequence_parallel: bool = False,
                                value_bytes: int = 4) -> float:
        """Each conv's output and its BatchNorm/ReLU copies (3 per conv), the FC inputs, per sample."""
        maps = sum(3 * size * size * c for size, c in zip(self.feature_maps(), self.conv_channels))
        return value_bytes * rows * (maps + self.flat_features + sum(self.fc_sizes))

    def forward_macs(self) -> int:
        return int(forward_flops(self)) // 2


# ----------------------------------------------------------------------------- BERT MLM

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
# The 33,277 distinct words of wiki.train.tokens (<unk> is one of them) plus the specials.
# tests/test_data.py checks this against the real file.
WIKITEXT2_VOCAB_SIZE = 33277 + len(SPECIAL_TOKENS)


@dataclass(frozen=True)
class BertSpec:
    """A post-LN BERT encoder with learned positions and a tied masked-LM head (keras-hub layout).

    Parameters: token, position and segment (2 types) embeddings + LayerNorm; per layer
    Q, K, V, O projections, LayerNorm, FFN (GELU), LayerNorm; MLM head dense + GELU +
    LayerNorm + an output bias, the decoder weight tied to the token embedding. No pooler:
    the MLM loss never reaches it.
    """
    name: str
    layers: int
    hidden: int
    heads: int
    intermediate: int
    seq_len: int = 128
    vocab_size: int = WIKITEXT2_VOCAB_SIZE
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    # Dropout is 0 by spec: dropout masks come from each framework's own RNG, which would
    # make the backends run different experiments. Recorded in every record's config.
    dropout: float = 0.0
    mask_rate: float = 0.15
    # keras-hub's BertBackbone uses tanh-approximated GELU in the encoder FFN and exact GELU
    # in the MaskedLMHead; every backend follows it.
    ffn_gelu_approximate: bool = True
    head_gelu_approximate: bool = False
    init_stddev: float = 0.02  # truncated normal (+-2 std) for kernels and embeddings

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def max_predictions(self) -> int:
        """Masked positions per sequence are padded to this many (keras-hub `mask_selection_length`)."""
        return math.ceil(self.mask_rate * self.seq_len)

    # The parts a pipeline places (common.stage_split): the embeddings on the first stage, the layers, the MLM
    # head on the last (its decoder weight is the token table, counted with the embeddings).
    def embedding_params(self) -> int:
        return (self.vocab_size + self.seq_len + self.type_vocab_size) * self.hidden + 2 * self.hidden

    def layer_params(self) -> int:
        h, i = self.hidden, self.intermediate
        return 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h

    def head_params(self) -> int:
        h = self.hidden
        return (h * h + h) + 2 * h + self.vocab_size

    def param_count(self) -> int:
        return self.embedding_params() + self.layers * self.layer_params() + self.head_params()

    def linears(self) -> list[Linear]:
        """An encoder layer's linear layers in forward order (Megatron's split, torch_3d's plan)."""
        h, i = self.hidden, self.intermediate
        return [Linear("query", h, h, "column"), Linear("key", h, h, "column"), Linear("value", h, h, "column"),
                Linear("output", h, h, "row"), Linear("ffn_in", h, i, "column"), Linear("ffn_out", i, h, "row")]

    def head_gemms(self, samples: int) -> list[Gemm]:
        """The MLM head's dense and vocabulary projection, at the `max_predictions` gathered positions only."""
        rows = samples * self.max_predictions
        return [Gemm("head_dense", rows, self.hidden, self.hidden), Gemm("head_vocab", rows, self.vocab_size,
                                                                          self.hidden)]

    def gemms(self, samples: int) -> list[Gemm]:
        return self.layers * linear_gemms(self.linears(), samples * self.seq_len) + self.head_gemms(samples)

    def attention_flops(self, samples: int) -> float:
        return self.layers * attention_flops(samples * self.seq_len, self.seq_len, self.hidden)

    def stored_activation_bytes(self, rows: int, tp: int = 1, sequence_parallel: bool = False,
                                value_bytes: int = 4) -> float:
        """One encoder layer's values kept for its backward per token (Korthikanti et al. 2022, section 4, counted
        for this model, fused attention storing no s x s scores): the input, the two norms' inputs and the FFN
        input replicated (4h); Q, K, V, the context and both FFN intermediates split over tp ((4h + 2i) / tp).
        torch_3d runs no sequence parallelism: refused."""
        if sequence_parallel:
            raise ValueError("the BERT MLM runs no sequence parallelism")
        h, i = self.hidden, self.intermediate
        return value_bytes * rows * (4 * h + (4 * h + 2 * i) / tp)

    def layer_forward_macs(self) -> int:
        """Per sequence, one encoder layer: Q, K, V, O, the two attention products, the FFN."""
        gemms = sum(g.flops for g in linear_gemms(self.linears(), self.seq_len))
        return int(gemms + attention_flops(self.seq_len, self.seq_len, self.hidden)) // 2

    def head_forward_macs(self) -> int:
        """Per sequence: the head's dense and the vocabulary projection."""
        return int(sum(g.flops for g in self.head_gemms(1))) // 2

    def forward_macs(self) -> int:
        """Per sequence. The vocabulary projection runs only at the `max_predictions` gathered positions."""
        return int(forward_flops(self)) // 2


BERT_SIZES = {
    "tiny": BertSpec("tiny", layers=2, hidden=128, heads=2, intermediate=512),
    "mini": BertSpec("mini", layers=4, hidden=256, heads=4, intermediate=1024),
    "small": BertSpec("small", layers=4, hidden=512, heads=8, intermediate=2048),
    "base": BertSpec("base", layers=12, hidden=768, heads=12, intermediate=3072),
}

CNN = CnnSpec()

# ----------------------------------------------------------------------------- decoder LM
# The `lm` workload trains a Llama-style decoder on WikiText-2 (next-token loss); each size is a model file in
# bench.predict's format (common/predict/models/<file>.toml, read by common.predict.decoder), so the backends
# that train it and the predictor read one description.
LM_SIZES = {"tiny": "llama-tiny", "mini": "llama-mini", "base": "llama-base"}
SIZES = {"cnn": ("default",), "mlm": tuple(BERT_SIZES), "lm": tuple(LM_SIZES)}


def model_spec(workload: str, size: str = "tiny"):
    """The model of `workload` at `size` (the CNN has one): a CnnSpec, BertSpec or DecoderSpec."""
    if workload == "cnn":
        return CNN
    if workload == "lm":
        return _lm_spec(size)
    return BERT_SIZES[size]


@functools.cache
def _lm_spec(size: str):
    from common.predict.decoder import load  # noqa: PLC0415  (decoder.py imports this module's Gemm, Linear)
    return load(LM_SIZES[size])


def training_flops_per_sample(spec: Model) -> int:
    """Forward + backward = 3x the forward FLOPs (the usual analytical rule; no recomputation counted), of any
    model (forward_flops)."""
    return 3 * int(forward_flops(spec))


# ----------------------------------------------------------------------------- training


@dataclass(frozen=True)
class OptimSpec:
    """AdamW with linear warm-up then polynomial decay to `end_lr_ratio` x peak."""
    lr: float
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    warmup_fraction: float = 0.05
    decay_power: float = 1.0
    end_lr_ratio: float = 0.0


@dataclass(frozen=True)
class WorkloadDefaults:
    per_device_batch: int
    optim: OptimSpec
    eval_split: str
    metric: str
    default_steps: int = 50      # a throughput run when neither --steps nor --epochs is given
    default_warmup_steps: int = 5
    higher_is_better: bool = True
    # Samples per evaluation batch (common.loop): the decoder LM's logits cover every position of its 33,282-word
    # vocabulary (16 sequences: 272 MB of float32 logits), where the MLM's cover its few masked ones.
    eval_batch: int = 256


DEFAULTS = {
    "cnn": WorkloadDefaults(per_device_batch=64, optim=OptimSpec(lr=1e-3), eval_split="test",
                            metric="accuracy"),
    "mlm": WorkloadDefaults(per_device_batch=32, optim=OptimSpec(lr=1e-3, warmup_fraction=0.06),
                            eval_split="valid", metric="masked_accuracy"),
    # Perplexity: lower is better (early stopping reads `higher_is_better`).
    "lm": WorkloadDefaults(per_device_batch=16, optim=OptimSpec(lr=1e-3, warmup_fraction=0.06),
                           eval_split="valid", metric="perplexity", higher_is_better=False,
                           eval_batch=16),
}


def learning_rate(step: int, total_steps: int, optim: OptimSpec) -> float:
    """The learning rate used for optimizer step `step` (0-based) of `total_steps`."""
    warmup = max(1, round(optim.warmup_fraction * total_steps))
    if step < warmup:
        return optim.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    end = optim.lr * optim.end_lr_ratio
    return end + (optim.lr - end) * (1.0 - progress) ** optim.decay_power


__all__ = [
    "BERT_SIZES", "CNN", "DEFAULT_WORKLOADS", "DEFAULTS", "LM_SIZES", "SIZES", "TOKEN_WORKLOADS", "WORKLOADS",
    "BertSpec", "CnnSpec", "OptimSpec", "learning_rate", "model_spec", "training_flops_per_sample",
]
