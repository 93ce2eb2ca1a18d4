"""Memory per rank of a decoder under a layout (common.layout): training state by how the layout shards it,
activations by Korthikanti et al.'s accounting (DecoderSpec.stored_activation_bytes) times the micro-batches a
pipeline stage holds, and the loss's logits. An estimate for "fits or not": the published points say memory only for
torchtitan, and the model is not checked against it.

State bytes per parameter element of the rank's tensor-parallel share (mixed precision, AdamW):
  - Megatron (plain data parallel or distributed optimizer): bf16 weights 2, float32 gradient buffer 4, float32
    master weights and two moments 12, the last divided over dp under zero1 (Megatron's distributed optimizer).
  - FSDP / HSDP (torchtitan's FSDP2): float32 sharded weights 4, gradients 4 and moments 8, all over the shard
    group; the two layers' bf16 weights gathered at a time (the one computing and the one prefetched).
In flight (micro-batches whose activations a stage holds): 1 without a pipeline, GPipe all m, 1F1B p - stage,
interleaved 1F1B on stage 0 p x (1 + (p - 1) / (p v)) (Narayanan et al. 2021, section 2.2.2).
"""
from __future__ import annotations

from common.layout import Layout
from common.predict.decoder import DecoderSpec

BF16, FP32 = 2, 4


def in_flight(layout: Layout, micro_batches: int, stage: int = 0) -> float:
    p = layout.pp
    if p == 1:
        return 1.0
    if layout.schedule == "gpipe":
        return float(micro_batches)
    if layout.schedule == "interleaved":
        return min(float(micro_batches), p * (1 + (p - 1) / (p * layout.virtual_stages)))
    return float(min(micro_batches, p - stage))


def state_bytes(params: float, layout: Layout) -> float:
    """Training state of a rank holding `params` elements (its tensor-parallel share of its stage)."""
    if layout.sharded:
        return params * (FP32 + FP32 + 2 * FP32) / layout.fsdp
    optimizer = 3 * FP32 * params / (layout.dp if layout.zero1 else 1)
    return params * (BF16 + FP32) + optimizer


def activation_bytes(spec: DecoderSpec, layout: Layout, tokens: int, layers: int, micro_batches: int,
                     selective: str = "attention", stage: int = 0) -> float:
    """What the busiest stage keeps for its backward: its layers' activations per micro-batch in flight.
    Selective recomputation as Megatron does it (the attention core) keeps what flash attention keeps anyway;
    torchtitan's op policy ("odd-mm") keeps the block's input, the 1st, 3rd, ... matmuls' outputs and the
    attention's output and log-sum-exp, and recomputes the rest."""
    per_layer = spec.stored_activation_bytes(tokens, layout.tp, layout.sp, flash=True)
    if layout.recompute == "selective" and selective == "odd-mm":
        saved = [g.n for g in spec.layer_gemms(tokens, layout.tp)][0::2]
        per_layer = tokens * (BF16 * (sum(saved) + spec.q_width / layout.tp
                                      + spec.hidden / (layout.tp if layout.sp else 1)) + FP32 * spec.heads / layout.tp)
    if layout.recompute == "full":
        kept = tokens * spec.hidden * BF16 / (layout.tp if layout.sp else 1)
        per_stage = layers * kept + per_layer          # the inputs, and the one layer being recomputed
    else:
        per_stage = layers * per_layer
    return per_stage * in_flight(layout, micro_batches, stage)


def logits_bytes(spec: DecoderSpec, layout: Layout, tokens: int) -> float:
    """The last stage's logits: bf16 out of the output layer, their float32 copy and its gradient (a split
    vocabulary's share)."""
    return tokens * spec.vocab / (layout.tp if layout.vocab_split else 1) * (BF16 + 2 * FP32)


def per_rank(spec: DecoderSpec, layout: Layout, tokens: int, stage_params: float, layer_params: float,
             layers: int, micro_batches: int, last_stage: bool, selective: str = "attention", stage: int = 0
             ) -> float:
    """A rank of `stage`: state + activations (+ FSDP's gathered layers, + the logits on the last stage)."""
    total = state_bytes(stage_params, layout) + activation_bytes(spec, layout, tokens, layers, micro_batches,
                                                                 selective, stage)
    if layout.sharded:
        total += 2 * layer_params * BF16
    if last_stage:
        total += logits_bytes(spec, layout, tokens)
    return total
