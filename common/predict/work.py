"""What each rank computes under a layout: the model's matmul work split by part, then shared out.

Forward multiply-adds per sample follow common.spec (BertSpec.forward_macs): per encoder layer
4sh^2 (Q, K, V, output) + 2s^2h (scores and context) + 2shi (FFN); the MLM head at the gathered positions,
p(h^2 + hV); the embeddings' look-ups no multiply-adds. Forward + backward is 3x the forward, so shares of
the forward are shares of the step's compute. Under a layout (Megatron's tensor parallel plan, torch_3d's):
  - tp divides every encoder layer's matmuls (heads and FFN columns split), the head's dense transform is
    replicated, the decoder h x V is replicated unless the vocabulary is split (--no-vocab-emb-dp);
  - pp gives a stage its layers (common.layout's contiguous split, or a recorded `stage_split`), the MLM head
    to the last stage;
  - dp and FSDP divide the samples.
The assumption this rests on: a rank's compute time is proportional to its matmul work. Norms, GELU and
softmax (a few percent of the FLOPs) are taken to scale the same way; the CNN is modelled as one stage.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.layout import Layout
from common.spec import BertSpec, CnnSpec


@dataclass(frozen=True)
class Parts:
    """Forward multiply-adds per sample of each part of the model, whole (no layout)."""
    layer: float          # one encoder layer (the CNN: its whole body)
    layers: int
    head_dense: float     # replicated under tp
    head_vocab: float     # the decoder, split only with the vocabulary

    @property
    def total(self) -> float:
        return self.layers * self.layer + self.head_dense + self.head_vocab


def parts(spec: BertSpec | CnnSpec) -> Parts:
    if isinstance(spec, CnnSpec):
        return Parts(layer=float(spec.forward_macs()), layers=1, head_dense=0.0, head_vocab=0.0)
    h, i, s, p = spec.hidden, spec.intermediate, spec.seq_len, spec.max_predictions
    layer = 4 * s * h * h + 2 * s * s * h + 2 * s * h * i
    return Parts(layer=float(layer), layers=spec.layers, head_dense=float(p * h * h),
                 head_vocab=float(p * h * spec.vocab_size))


def stage_layer_counts(layout: Layout, layers: int, stage_split: list[int] | None = None) -> list[int]:
    """Encoder layers per pipeline stage: a recorded split (a record's layout.layers_per_stage), else
    common.layout's even one (Layout.stage_of_layer)."""
    chosen = getattr(layout, "stage_split", "even")  # a layout option of its own (--stage-split), once merged
    if not stage_split and chosen not in (None, "even"):
        if not str(chosen).replace(",", "").isdigit():
            raise ValueError(f"--stage-split {chosen}: the model places even splits and explicit counts (e.g. 3,1)")
        stage_split = [int(n) for n in str(chosen).split(",")]
    if stage_split:
        if len(stage_split) != layout.pp or sum(stage_split) != layers:
            raise ValueError(f"stage_split {stage_split} does not cut {layers} layers into {layout.pp} stages")
        return list(stage_split)
    stages = [layout.stage_of_layer(i, layers) for i in range(layers)]
    return [stages.count(s) for s in range(layout.pp)]


def stage_macs(spec: BertSpec | CnnSpec, layout: Layout, stage_split: list[int] | None = None) -> list[float]:
    """Forward multiply-adds per sample on one rank of each pipeline stage (its tensor-parallel share)."""
    whole = parts(spec)
    if isinstance(spec, CnnSpec):
        if layout.pp > 1 or layout.tp > 1:
            raise ValueError("the model predicts the CNN data parallel only (dp, fsdp)")
        return [whole.total]
    counts = stage_layer_counts(layout, whole.layers, stage_split)
    vocab = whole.head_vocab / (layout.tp if not layout.vocab_emb_dp else 1)
    out = [n * whole.layer / layout.tp for n in counts]
    out[-1] += whole.head_dense + vocab
    return out


def recomputed_macs(spec: BertSpec | CnnSpec, layout: Layout, stage_split: list[int] | None = None) -> list[float]:
    """Forward multiply-adds per sample that --recompute runs a second time in the backward on one rank of each
    stage: its encoder layers' (torch_3d and keras_jax checkpoint each encoder layer; the head is kept). Zero
    without --recompute, and for the CNN (no backend recomputes it)."""
    if not layout.recompute or isinstance(spec, CnnSpec):
        return [0.0] * layout.pp
    whole = parts(spec)
    return [n * whole.layer / layout.tp for n in stage_layer_counts(layout, whole.layers, stage_split)]
