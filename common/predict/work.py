"""What each rank computes under a layout: the model's forward multiply-adds by part, shared out by tp, pp and the
data ranks (under tp as Megatron's plan divides a profiled run's compute). docs/prediction.md, "Compute"."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from common.layout import Layout
from common.sections import COMM_KINDS, Attribution
from common.spec import BertSpec, CnnSpec
from common.stage_split import EVEN, even_split

# The profiler's categories (common.attribution) under Megatron's tensor parallelism, besides the matmuls: the
# attention core and the FFN's activation run on a rank's own heads and columns; the loss's softmax runs over the
# whole vocabulary unless the vocabulary is split; norms, residual adds, dropouts, the embeddings' gathers and the
# host's gaps between operations are every rank's in full.
TP_SPLIT = ("attention", "activation")
TP_VOCAB = ("softmax",)
NOT_COMPUTE = ("optimizer", *COMM_KINDS)


@dataclass(frozen=True)
class Parts:
    """Forward multiply-adds per sample of each part of the model, whole (no layout)."""
    layer: float          # one encoder layer (the CNN: its whole body)
    layers: int
    head_dense: float     # replicated under tp
    head_vocab: float     # the decoder, split only with the vocabulary
    # What --recompute runs of a layer again (None: all of it): the pre-norm decoder's last GEMM (w2) feeds only
    # the residual add, which its backward does not need, so non-reentrant checkpointing stops before it.
    layer_recomputed: float | None = None

    @property
    def total(self) -> float:
        return self.layers * self.layer + self.head_dense + self.head_vocab


def parts(spec) -> Parts:
    """Of the CNN, the BERT MLM or the executed decoder LM (a DecoderSpec: its output layer at every position is
    its head, split only with the vocabulary)."""
    if isinstance(spec, CnnSpec):
        return Parts(layer=float(spec.forward_macs()), layers=1, head_dense=0.0, head_vocab=0.0)
    if not isinstance(spec, BertSpec):
        w2 = spec.seq_len * spec.ffn * spec.hidden
        return Parts(layer=float(spec.layer_forward_macs()), layers=spec.layers, head_dense=0.0,
                     head_vocab=float(spec.head_forward_macs()), layer_recomputed=float(spec.layer_forward_macs() - w2))
    # common.spec's counts, the head's split by what tensor parallelism does with each of its two matmuls
    dense = spec.max_predictions * spec.hidden * spec.hidden
    return Parts(layer=float(spec.layer_forward_macs()), layers=spec.layers, head_dense=float(dense),
                 head_vocab=float(spec.head_forward_macs() - dense))


def stage_layer_counts(layout: Layout, layers: int) -> list[int]:
    """Encoder layers per pipeline stage: the layout's counts, or its even split (auto: Layout.placed first)."""
    if layout.stage_split == EVEN:
        return even_split(layers, layout.pp)
    if not layout.stage_split.replace(",", "").isdigit():
        raise ValueError(f"--stage-split {layout.stage_split}: placed by Layout.placed before it is predicted")
    counts = [int(n) for n in layout.stage_split.split(",")]
    if len(counts) != layout.pp or sum(counts) != layers:
        raise ValueError(f"stage_split {counts} does not cut {layers} layers into {layout.pp} stages")
    return counts


def stage_macs(spec: BertSpec | CnnSpec, layout: Layout, recomputed: bool = False) -> list[float]:
    """Forward multiply-adds per sample on one rank of each pipeline stage (its tensor-parallel share). `recomputed`:
    those --recompute runs a second time in the backward, its encoder layers' (torch_3d and keras_jax checkpoint
    each encoder layer; the head is kept): none without --recompute, nor for the CNN (no backend recomputes it)."""
    whole = parts(spec)
    if isinstance(spec, CnnSpec):
        if layout.pp > 1 or layout.tp > 1:
            raise ValueError("the model predicts the CNN data parallel only (dp, fsdp)")
        return [0.0 if recomputed else whole.total]
    if recomputed and not layout.recomputes:
        return [0.0] * layout.pp
    layer = whole.layer_recomputed if recomputed and whole.layer_recomputed is not None else whole.layer
    out = [n * layer / layout.tp for n in stage_layer_counts(layout, whole.layers)]
    if not recomputed:
        out[-1] += whole.head_dense + whole.head_vocab / (layout.tp if layout.vocab_split else 1)
    return out


@dataclass(frozen=True)
class ComputeShares:
    """Shares of a 1-device run's forward+backward time by what tensor parallelism does with them, from its
    profile (record backend_metrics.attribution, --profile)."""
    matmul: float
    split: float   # TP_SPLIT: divided by tp
    vocab: float   # TP_VOCAB: divided by tp only with the vocabulary
    whole: float   # the rest: every rank's in full
    run_id: str

    @classmethod
    def from_record(cls, record: dict) -> ComputeShares | None:
        profile = Attribution.from_metrics(record.get("backend_metrics"))
        if profile is None:
            return None
        total = profile.seconds(*(c for c in profile.categories if c not in NOT_COMPUTE))
        if total <= 0:
            return None
        matmul, split, vocab = (profile.seconds(*cats) / total for cats in (("matmul",), TP_SPLIT, TP_VOCAB))
        return cls(matmul, split, vocab, 1.0 - matmul - split - vocab, record["run_id"])


def rank_macs(spec: BertSpec | CnnSpec, layout: Layout, shares: ComputeShares | None,
              recomputed: bool = False) -> list[float]:
    """What one rank of each stage computes, in multiply-adds per sample its time goes with: its matmuls', and the
    rest of its stage's 1-device time divided as `shares` say (without them: as the matmuls divide)."""
    mine = stage_macs(spec, layout, recomputed)
    if shares is None or layout.tp == 1:
        return mine
    whole = stage_macs(spec, dataclasses.replace(layout, tp=1), recomputed)
    rest = shares.split / layout.tp + shares.vocab / (layout.tp if layout.vocab_split else 1) + shares.whole
    return [shares.matmul * m + rest * w for m, w in zip(mine, whole)]
