"""Memory per rank, one module for every workload: the executed workloads' as torch_3d counts its shards, the
decoders' an estimate for "fits or not". docs/prediction.md ("Memory per rank") and docs/prediction-at-scale.md."""
from __future__ import annotations

import functools
import math

from common.initial_weights import Tensor
from common.initial_weights import layout as tensor_layout
from common.layout import Layout
from common.predict.decoder import DecoderSpec
from common.predict.work import stage_layer_counts
from common.sections import StateBytes
from common.spec import BertSpec, CnnSpec

FLOAT = 4          # bytes of a float32
# AdamW's counters beside its moments: torch.optim.AdamW keeps `step` as a float32 scalar tensor per
# parameter tensor; a Keras optimizer one int64 `iterations` variable, replicated on every device.
STEP_COUNTERS = {"torch": ("per tensor", 4), "keras": ("per device", 8)}
HALF = 2           # activations under autocast (--precision amp/fp16) are bf16/fp16 (an assumption: norms
                   # and the loss stay float32)
ADAM_MOMENTS = 2   # exp_avg, exp_avg_sq
# What an eager float32 loss holds per logit at once: the bf16 logits, their float32 copy and its gradient.
EAGER_LOGIT_BYTES = float(HALF + 2 * FLOAT)
# The canonical weights (common.initial_weights) Megatron's tensor parallelism splits by output and input: the BERT
# encoder's and the decoder LM's; and those --vocab-split splits by vocabulary row.
COLWISE = ("attention.query", "attention.key", "attention.value", "ffn.in",
           "attention.wq", "attention.wk", "attention.wv", "ffn.w1", "ffn.w3")
ROWWISE = ("attention.output", "ffn.out", "attention.wo", "ffn.w2")
VOCAB_ROWS = ("embeddings.token", "head.bias", "head.output.weight")


def value_bytes(precision: str | None) -> int:
    """Bytes per activation value under a run's --precision."""
    return HALF if precision in ("amp", "fp16") else FLOAT


def _layer_of(name: str) -> int | None:
    return int(name.split(".")[1]) if name.startswith("layers.") else None


@functools.lru_cache(maxsize=16)
def _trainable(spec: BertSpec | CnnSpec) -> tuple[Tensor, ...]:
    """The model's trainable tensors, built once per model (a plan predicts thousands of layouts of one model)."""
    return tuple(t for t in tensor_layout(spec) if t.trainable)


@functools.lru_cache(maxsize=1024)  # every rank of a stage asks: 64 ranks, thousands of layouts in a plan
def stage_tensors(spec: BertSpec | CnnSpec, layout: Layout, stage: int) -> tuple[Tensor, ...]:
    """The trainable tensors one pipeline stage holds, whole."""
    tensors = _trainable(spec)
    if isinstance(spec, CnnSpec) or layout.pp == 1:
        return tensors
    counts = stage_layer_counts(layout, spec.layers)
    first_layer = sum(counts[:stage])
    mine = range(first_layer, first_layer + counts[stage])
    first, last = stage == 0, stage == layout.pp - 1

    def held(name: str) -> bool:
        if (layer := _layer_of(name)) is not None:
            return layer in mine
        if name.startswith("embeddings."):   # the last stage's copy of the MLM's tied token table
            return first or (last and name == "embeddings.token" and isinstance(spec, BertSpec))
        return last
    return tuple(t for t in tensors if held(t.name))


def tp_shape(t: Tensor, layout: Layout) -> tuple[int, ...]:
    """The shape of a tensor's tensor-parallel shard."""
    tp, shape = layout.tp, list(t.shape)
    if tp == 1:
        return tuple(shape)
    module = t.name.rsplit(".", 1)[0].split(".", 2)[-1] if t.name.startswith("layers.") else ""
    if module in COLWISE:
        shape[0] //= tp
    elif module in ROWWISE and t.name.endswith(".weight"):
        shape[1] //= tp
    elif layout.vocab_split and t.name in VOCAB_ROWS:
        shape[0] //= tp
    return tuple(shape)


def fsdp_numel(shape: tuple[int, ...], dp: int, index: int) -> int:
    """Elements of the `index`-th of torch.chunk(tensor, dp, dim=0)'s pieces (empty when chunk ran out)."""
    rest = math.prod(shape[1:])
    rows = math.ceil(shape[0] / dp)
    return max(0, min(rows, shape[0] - index * rows)) * rest


def framework_of(backend: str) -> str:
    """Whose optimizer a backend steps with (STEP_COUNTERS' key)."""
    return "keras" if backend.startswith(("keras", "tf_")) else "torch"


def state_bytes(spec: BertSpec | CnnSpec, layout: Layout, rank: int,
                backend: str = "torch_3d") -> StateBytes:
    """Parameters, gradients and AdamW state one rank holds, in bytes."""
    c = layout.coordinates(rank)
    elements, tensors = 0, 0
    for t in stage_tensors(spec, layout, c["pp"]):
        shape = tp_shape(t, layout)
        elements += fsdp_numel(shape, layout.fsdp, c["fsdp"]) if layout.sharded else math.prod(shape)
        tensors += 1
    scope, size = STEP_COUNTERS[framework_of(backend)]
    counters = size * (tensors if scope == "per tensor" else 1)
    return StateBytes(params=FLOAT * elements, grads=FLOAT * elements,
                      optimizer=ADAM_MOMENTS * FLOAT * elements + counters)


def stage_params(spec: BertSpec | CnnSpec, layout: Layout, stage: int) -> int:
    """Elements of a stage's tensor-parallel shard before FSDP (what its all-gathers and all-reduces move)."""
    return sum(math.prod(tp_shape(t, layout)) for t in stage_tensors(spec, layout, stage))


def in_flight(layout: Layout, stage: int, micro_batches: int | None = None) -> float:
    """Micro-batches whose activations a stage holds at its peak (of `micro_batches`, else the layout's count;
    interleaved 1F1B's on stage 0: Narayanan et al. 2021, section 2.2.2)."""
    p, m = layout.pp, micro_batches or layout.micro_batches
    if p == 1:
        return 1
    if layout.schedule == "gpipe":
        return m
    if layout.schedule == "interleaved":
        return min(m, p * (1 + (p - 1) / (p * layout.virtual_stages)))
    return min(m, p - stage)


def activation_bytes(spec: BertSpec | CnnSpec, layout: Layout, stage: int, micro_batch: int,
                     value_bytes: int = FLOAT) -> float:
    """Activations a rank of `stage` keeps at its peak, for micro-batches of `micro_batch` samples."""
    if isinstance(spec, CnnSpec):
        return spec.stored_activation_bytes(micro_batch, value_bytes=value_bytes)
    if isinstance(spec, DecoderSpec):
        return _decoder_activation_bytes(spec, layout, stage, micro_batch, value_bytes)
    s, h, p, v, tp = spec.seq_len, spec.hidden, spec.max_predictions, spec.vocab_size, layout.tp
    counts = stage_layer_counts(layout, spec.layers)
    stored = spec.stored_activation_bytes(s, tp, value_bytes=1)   # values per sample
    per_sample = counts[stage] * (s * h if layout.recomputes else stored)
    if layout.recomputes and counts[stage]:
        per_sample += stored  # the one layer being recomputed
    if stage == 0:
        per_sample += 2 * s * h
    if stage == layout.pp - 1:
        per_sample += 4 * p * h + 2 * p * v / (tp if layout.vocab_split else 1)
    return value_bytes * per_sample * micro_batch * in_flight(layout, stage)


def _decoder_activation_bytes(spec: DecoderSpec, layout: Layout, stage: int, micro_batch: int,
                              value_bytes: int) -> float:
    """The executed decoder LM (lm): each layer's stored values (DecoderSpec, flash attention: torch's CPU and CUDA
    SDPA keep the log-sum-exp, not the scores), or under --recompute its input and one layer's; on the last stage
    per micro-batch in flight the final norm's input and output and log-softmax's float32 output, which its
    backward keeps, and once, for the micro-batch whose loss runs backward, two more float32 vocabulary-wide
    tensors (the dense gradient nll_loss hands log-softmax, the logits' gradient)."""
    s, h, tp = spec.seq_len, spec.hidden, layout.tp
    counts = stage_layer_counts(layout, spec.layers)
    stored = spec.stored_activation_bytes(s, tp, value_bytes=value_bytes)   # bytes per sequence
    per_sample = counts[stage] * (value_bytes * s * h if layout.recomputes else stored)
    if layout.recomputes and counts[stage]:
        per_sample += stored  # the one layer being recomputed
    vocab = FLOAT * s * spec.vocab / (tp if layout.vocab_split else 1)   # one float32 logits-sized tensor
    if stage == layout.pp - 1:
        per_sample += value_bytes * 2 * s * h + vocab
    return (per_sample * in_flight(layout, stage) + (2 * vocab if stage == layout.pp - 1 else 0)) * micro_batch


def evaluation_bytes(spec: BertSpec | CnnSpec, layout: Layout, stage: int, eval_batch: int) -> float:
    """The live values of an evaluation forward on one rank of `stage` (common.loop's batches of eval_batch)."""
    if isinstance(spec, CnnSpec):
        return activation_bytes(spec, layout, stage, eval_batch) / 3
    if isinstance(spec, DecoderSpec):   # the last stage's logits and log-softmax dominate a layer's live values
        s, tp = spec.seq_len, layout.tp
        per_sample = s * (4 * spec.hidden + (spec.q_width + 2 * spec.kv_width + 3 * spec.ffn) / tp)
        if stage == layout.pp - 1:
            per_sample = max(per_sample, 2 * s * spec.vocab / (tp if layout.vocab_split else 1))
        return FLOAT * per_sample * eval_batch
    s, h, i, p, v, tp = spec.seq_len, spec.hidden, spec.intermediate, spec.max_predictions, spec.vocab_size, layout.tp
    per_sample = s * (4 * h + (2 * h + 2 * i) / tp)
    if stage == layout.pp - 1:
        per_sample = max(per_sample, 2 * p * v / (tp if layout.vocab_split else 1))
    return FLOAT * per_sample * eval_batch


def transient_bytes(spec: BertSpec | CnnSpec, layout: Layout, stage: int) -> float:
    """Buffers a step allocates beside state and activations: torch_3d's flat gradient copy for its dp
    all-reduce; FSDP's whole parameters of the layer being computed and of the one prefetched (under ZeRO-2, of
    every layer of the stage by the end of its forward)."""
    if layout.dp > 1 and not layout.sharded:
        return FLOAT * stage_params(spec, layout, stage)
    if layout.sharded and not isinstance(spec, CnnSpec):
        held = max(2, stage_layer_counts(layout, spec.layers)[stage]) if layout.zero2 else 2
        return FLOAT * held * layer_elements(spec, layout)
    return 0.0


def layer_elements(spec, layout: Layout) -> int:
    return sum(math.prod(tp_shape(t, layout)) for t in tensor_layout(spec) if _layer_of(t.name) == 0)


def counted_per_rank(spec: BertSpec | CnnSpec, layout: Layout, micro: float, precision: str,
                     eval_batch: int | None, backend: str) -> tuple[list[StateBytes], list[float], list[float]]:
    """Per rank, for micro-batches of `micro` samples: its state, what the model counts of its process peak and of
    its training's growth over the start (the weights were there before); the framework's overhead comes on top."""
    states, model, growth = [], [], []
    for rank in range(layout.devices):
        stage = layout.coordinates(rank)["pp"]
        state = state_bytes(spec, layout, rank, backend)
        training_live = activation_bytes(spec, layout, stage, int(micro), value_bytes(precision)) + \
            transient_bytes(spec, layout, stage)
        evaluation = evaluation_bytes(spec, layout, stage, eval_batch) if eval_batch else 0.0
        states.append(state)
        model.append(state.total + max(training_live, evaluation))
        growth.append(state.grads + state.optimizer + training_live)
    return states, model, growth


# -- decoders (bf16 mixed precision on GPUs, Megatron's and torchtitan's state) -------------------------------


def decoder_rank_bytes(spec: DecoderSpec, layout: Layout, tokens: int, stage_params: float, layer_params: float,
                       layers: int, micro_batches: int, last_stage: bool, selective: str, stage: int,
                       gathered_layers: int, accumulating_layers: int = 0, grad_bytes: float = FLOAT,
                       logit_bytes: float = EAGER_LOGIT_BYTES) -> float:
    """A rank of `stage`: docs/prediction-at-scale.md's memory per rank (`gathered_layers`: FSDP's held at a time;
    `accumulating_layers`: those whose gradients FSDP accumulates unsharded in float32 between micro-batches;
    `grad_bytes`: an element of the gradient buffer of a stack that shards no parameters, float32 or bf16;
    `logit_bytes`: what the loss holds per logit at once).
    Its layers' activations per micro-batch in flight: selective recomputation as Megatron does it (the attention
    core) keeps what flash attention keeps anyway; torchtitan's op policy ("odd-mm") keeps the block's input, the
    1st, 3rd, ... matmuls' outputs and the attention's output and log-sum-exp, and recomputes the rest."""
    if layout.sharded:  # float32 parameters, gradients and AdamW's moments, sharded
        state = stage_params * (FLOAT + FLOAT + 2 * FLOAT) / layout.fsdp
    else:  # bf16 parameters (or fp8 and their fp8 transposes), the gradient buffer; float32 master weights and
        # moments (ZeRO-1: sharded over dp)
        state = stage_params * (HALF + grad_bytes) + 3 * FLOAT * stage_params / (layout.dp if layout.zero1 else 1)
    per_layer = spec.stored_activation_bytes(tokens, layout.tp, layout.sp, flash=True)
    if layout.recompute == "selective" and selective == "odd-mm":
        saved = [g.n for g in spec.layer_gemms(tokens, layout.tp)][0::2]
        per_layer = tokens * (HALF * (sum(saved) + spec.q_width / layout.tp
                                      + spec.hidden / (layout.tp if layout.sp else 1))
                              + FLOAT * spec.heads / layout.tp)
    if layout.recompute == "full":
        kept = tokens * spec.hidden * HALF / (layout.tp if layout.sp else 1)
        per_stage = layers * kept + per_layer          # the inputs, and the one layer being recomputed
    else:
        per_stage = layers * per_layer
    total = state + per_stage * in_flight(layout, stage, micro_batches)
    if layout.sharded:
        total += gathered_layers * layer_params * HALF + accumulating_layers * layer_params * FLOAT
    if last_stage:
        total += tokens * spec.vocab / (layout.tp if layout.vocab_split else 1) * logit_bytes
    return total
