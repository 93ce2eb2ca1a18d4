"""One training step of a decoder under a layout (common.layout) on a GPU cluster, from first principles:
bench.predict's step (compute + exposed communication + bubble + optimizer), its collectives' alpha-beta costs
(collectives.py), its hardware descriptions and its pipeline formula (step.pipeline_s), with the compute of each
kernel timed by the device's measured rates (gpu_compute.py) instead of a 1-device run.

Per micro-batch of b sequences, T = b s / cp tokens on a rank, one layer:
  - GEMMs: DecoderSpec.layer_gemms (Megatron's column/row split over tp; fused QKV and FC1 where the stack fuses
    them), each with its two backward GEMMs, each timed at its shape;
  - flash attention: causal forward 2 b s^2 (nd) / (tp cp) FLOPs, backward 2.5 x, at the stack's kernel's rate;
  - memory-bound work: the stack's bytes per token (h-wide bytes shared out by sequence parallelism, the rest by
    tp), the backward backward_factor x, at the device's bandwidth;
  - recompute: full repeats the layer's forward (and its tensor-parallel collectives) in the backward; selective
    repeats the attention forward (Megatron) or every second matmul and all elementwise work (torchtitan's op
    policy: the 2nd, 4th, ... mm of each block are recomputed);
  - tensor parallel: 2 all-reduces of T h bf16 values forward and 2 backward, or with sp 2 all-gathers + 2
    reduce-scatters each way; exposed, or with tpo (Megatron's --tp-comm-overlap, AsyncTP) only what exceeds the
    layer's GEMMs in that direction, those GEMMs then run in chunks of the tokens as the stack's overlap cuts
    them (Stack.tp_overlap_split: Transformer Engine's ring exchange in tp chunks, its pipeline in 4);
  - context parallel: a ring passes each rank's K and V chunk cp - 1 times forward (K, V and their gradients
    backward), hidden behind the attention it feeds, the rest exposed.
A stage runs its layers (the first also the embedding, the last the final norm, output layer and loss); 1F1B
and GPipe sends of T h / (tp if sp) bf16 per micro-batch and boundary are exposed, interleaved 1F1B's are
overlapped (Megatron's overlap_p2p_comm). Pipeline: step.pipeline_s for GPipe and 1F1B; interleaved with v
chunks sum_s e_s / v + (m - 1/v) max_s e_s, (m + (p-1)/v) e for equal stages (Narayanan et al. 2021).
Once a step: plain data parallel all-reduces the float32 gradients, zero1 reduce-scatters them and all-gathers
bf16 weights (Megatron's distributed optimizer), both overlapped with the last micro-batch's backward
(and the gather with the first forward), at least the last bucket exposed; FSDP gathers each layer's bf16
weights forward and backward and reduce-scatters float32 gradients every micro-batch, prefetched behind compute,
the root (embeddings, output) and the first layer's gather exposed; HSDP adds the replicas' all-reduce of the
shards. The optimizer and FSDP's copies run at the device's bandwidth.
"""
from __future__ import annotations

from common.errors import BadInput
from common.layout import Layout
from common.peak_flops import peak_flops
from common.predict.collectives import Collective, cost_s, crosses_nodes
from common.predict.decoder import DecoderSpec, Gemm
from common.predict.gpu_compute import DeviceCompute
from common.predict.hardware import Hardware
from common.predict.llm_memory import per_rank
from common.predict.prediction import Prediction
from common.predict.stacks import Stack
from common.predict.step import pipeline_s

BF16, FP32 = 2, 4
FLASH_BACKWARD = 2.5            # flash attention's backward FLOPs over its forward's (Dao 2023)
MEGATRON_BUCKET_PARAMS = 40e6   # megatron/core/distributed: bucket_size = max(40M, 1M x dp) parameters


def interleaved_pipeline_s(per_micro_batch: list[float], micro_batches: int, virtual: int) -> float:
    """Interleaved 1F1B: each stage's work is v chunks, the warm-up and cool-down a chunk each per stage."""
    return sum(per_micro_batch) / virtual + (micro_batches - 1 / virtual) * max(per_micro_batch)


class _Timer:
    """Kernel times of one rank: measured rates (DeviceCompute) or, under --assume-mfu, FLOPs at mfu x peak."""

    def __init__(self, compute: DeviceCompute | None, mfu_flops: float | None, precision: str = "bf16"):
        self.compute, self.mfu_flops, self.precision = compute, mfu_flops, precision

    def gemm(self, g: Gemm) -> float:
        return g.flops / self.mfu_flops if self.mfu_flops else self.compute.gemm_s(g, self.precision)

    def attention(self, kernel: str, flops: float, seq: float, backward: bool) -> float:
        return flops / self.mfu_flops if self.mfu_flops else self.compute.attention_s(kernel, flops, seq, backward)

    def memory(self, nbytes: float, kernels: int = 1) -> float:
        return 0.0 if self.mfu_flops else self.compute.memory_s(nbytes, kernels)


def _cost(hardware: Hardware, layout: Layout, dim: str, ranks: int, kind: str, nbytes: float) -> float:
    """One collective over `ranks` along `dim` (common.layout's rank order), on the link its group crosses."""
    return cost_s(kind, nbytes, ranks, hardware.link(crosses_nodes(layout, dim, hardware.devices_per_node, ranks)))


def _layer(spec: DecoderSpec, layout: Layout, stack: Stack, timer: _Timer, hardware: Hardware,
           tokens: int) -> dict[str, float]:
    """One layer, one micro-batch, one rank: forward and backward times, exposed communication, and the GEMM time
    tensor-parallel overlap can hide behind."""
    tp, sp = layout.tp, layout.sp
    gemms = spec.layer_gemms(tokens, tp, stack.fused_projections)
    split = dict(stack.tp_overlap_split) if layout.tp_overlap and tp > 1 else {}

    def timed(g: Gemm) -> float:
        # Overlapped tensor-parallel communication runs the GEMM in chunks of the tokens (its stack's split).
        chunks = split.get(g.name)
        if not chunks:
            return timer.gemm(g)
        k = tp if chunks == "tp" else int(chunks)
        return k * timer.gemm(Gemm(g.name, -(-g.m // k), g.n, g.k))

    gemm_fwd = [timed(g) for g in gemms]
    gemm_bwd = sum(timed(b) for g in gemms for b in spec.backward_gemms(g))
    seq = spec.seq_len / layout.cp
    # Causal: b sequences' 4 s^2 nd / 2 FLOPs, shared over tp (heads) and cp (load-balanced chunks).
    attn_flops = 2.0 * tokens * spec.seq_len * spec.q_width / tp
    attn_fwd = timer.attention(stack.attention_kernel, attn_flops, seq, False)
    attn_bwd = timer.attention(stack.attention_kernel, FLASH_BACKWARD * attn_flops, seq, True)
    wide, narrow = stack.elementwise(spec)
    ew_bytes = tokens * (wide / (tp if sp else 1) + narrow / tp)
    ew_fwd = timer.memory(ew_bytes, stack.elementwise_kernels)
    ew_bwd = timer.memory(stack.backward_factor * ew_bytes, stack.elementwise_kernels)
    fwd = sum(gemm_fwd) + attn_fwd + ew_fwd
    recompute = 0.0
    if layout.recompute == "full":
        recompute = fwd
    elif layout.recompute == "selective":
        recompute = attn_fwd if stack.selective == "attention" else sum(gemm_fwd[1::2]) + ew_fwd
    bwd = gemm_bwd + attn_bwd + ew_bwd + recompute
    # Tensor parallel: 2 all-reduces a direction, or with sp 2 all-gathers + 2 reduce-scatters (the same bytes).
    act = BF16 * tokens * spec.hidden
    if tp > 1:
        one = (_cost(hardware, layout, "tp", tp, "all_gather", act) + _cost(hardware, layout, "tp", tp,
               "reduce_scatter", act)) if sp else _cost(hardware, layout, "tp", tp, "all_reduce", act)
        tp_fwd = 2 * one
        tp_bwd = 2 * one + (tp_fwd if layout.recompute == "full" else 0.0)
    else:
        tp_fwd = tp_bwd = 0.0
    if layout.tp_overlap:
        tp_exposed = max(0.0, tp_fwd - sum(gemm_fwd)) + max(0.0, tp_bwd - gemm_bwd)
    else:
        tp_exposed = tp_fwd + tp_bwd
    cp_exposed = 0.0
    if layout.cp > 1:
        kv = BF16 * tokens * 2 * spec.kv_width / min(tp, spec.kv_heads)
        ring = (layout.cp - 1) * _cost(hardware, layout, "cp", 2, "send_recv", kv)
        cp_exposed = max(0.0, ring - attn_fwd) + max(0.0, 2 * ring - attn_bwd)
    return {"fwd": fwd, "bwd": bwd, "tp_exposed": tp_exposed, "cp_exposed": cp_exposed,
            "tp_comm": tp_fwd + tp_bwd, "gemm": sum(gemm_fwd) + gemm_bwd, "attention": attn_fwd + attn_bwd,
            "elementwise": ew_fwd + ew_bwd, "recompute": recompute}


def _head(spec: DecoderSpec, tp: int, stack: Stack, timer: _Timer, tokens: int) -> dict[str, float]:
    """The last stage's own work, forward and backward: the final norm, the output layer's GEMMs (`tp`: the ranks
    its vocabulary is split over, 1 where it is replicated) and the loss over the logits."""
    head = spec.head_gemm(tokens, tp)
    return {"gemm": timer.gemm(head) + sum(timer.gemm(b) for b in spec.backward_gemms(head)),
            "loss": timer.memory(tokens * spec.vocab / tp * stack.logit_bytes, 4),
            "norm": timer.memory(tokens * spec.hidden * 4 * (1 + stack.backward_factor), 2)}


def one_head(spec: DecoderSpec, stack: Stack, compute: DeviceCompute, micro_batch: int,
             precision: str = "bf16") -> dict[str, float]:
    """The model's final norm, output layer and loss on one device, forward and backward, by part."""
    return _head(spec, 1, stack, _Timer(compute, None, precision), micro_batch * spec.seq_len)


def optimizer_s(elements: float, stack: Stack, compute: DeviceCompute) -> float:
    """The optimizer's step (clipping included) over `elements` parameters a rank updates: memory-bound."""
    return _Timer(compute, None).memory(elements * stack.optimizer_bytes, 8)


def one_layer(spec: DecoderSpec, stack: Stack, compute: DeviceCompute, hardware: Hardware, micro_batch: int,
              precision: str = "bf16", recompute: str = "none") -> dict[str, float]:
    """The model's forward and backward of one layer on one device (no parallelism), its GEMMs at `precision`'s
    rates, with the parts it adds up: what bench.layer_check holds against a measured layer."""
    return _layer(spec, Layout(recompute=recompute), stack, _Timer(compute, None, precision), hardware,
                  micro_batch * spec.seq_len)


def _stage_layers(spec: DecoderSpec, layout: Layout) -> list[int]:
    """Layers per pipeline stage (all its chunks): an even split, the first stages taking any remainder."""
    chunks = layout.pp * layout.virtual_stages
    base, extra = divmod(spec.layers, chunks)
    per_chunk = [base + (1 if c < extra else 0) for c in range(chunks)]
    return [sum(per_chunk[s::layout.pp]) for s in range(layout.pp)]


def predict_llm(spec: DecoderSpec, layout: Layout, global_batch: int, hardware: Hardware, stack: Stack,
                compute: DeviceCompute | None = None, mfu: float | None = None) -> Prediction:
    """The step of `layout` at `global_batch` sequences. `compute`: the device's measured rates; `mfu`: instead,
    every FLOP at mfu x the datasheet bf16 peak (labelled ASSUMED by the callers), memory-bound work absorbed."""
    try:
        layout.validate(spec, global_batch)
    except BadInput as exc:
        raise ValueError(str(exc)) from None
    if layout.tp_overlap and layout.tp > 1 and not stack.tp_overlap_split:
        raise ValueError(f"{layout.name}: {stack.name} cannot overlap tensor-parallel communication (tpo): "
                         "torch's async TP needs torch.compile (--stack torch-compile)")
    mfu_flops = None
    if mfu is not None:
        peak = peak_flops(hardware.device_name, "bf16")
        if not peak:
            raise ValueError(f"--assume-mfu: no bf16 datasheet peak for {hardware.device_name or hardware.name!r}")
        mfu_flops = mfu * peak
    elif compute is None:
        raise ValueError("predict_llm needs the device's compute table or an assumed MFU")
    timer = _Timer(compute, mfu_flops)
    m = layout.micro_batches_at(global_batch)
    tokens = global_batch // (layout.data * m) * spec.seq_len // layout.cp
    vocab_tp = layout.tp if layout.vocab_split else 1
    layer = _layer(spec, layout, stack, timer, hardware, tokens)
    per_layer = layer["fwd"] + layer["bwd"] + layer["tp_exposed"] + layer["cp_exposed"]
    counts = _stage_layers(spec, layout)
    # First stage: the embedding's look-up and its gradient (memory-bound); last: final norm, output layer, loss.
    embed = timer.memory(tokens * spec.hidden * BF16 * 4 / (layout.tp if layout.sp else 1), 2)
    head_s = sum(_head(spec, vocab_tp, stack, timer, tokens).values())
    send = 0.0
    collectives = []
    if layout.pp > 1:
        act = BF16 * tokens * spec.hidden / (layout.tp if layout.sp else 1)
        send = 2 * _cost(hardware, layout, "pp", 2, "send_recv", act)
        collectives.append(Collective("send_recv", "pp", act, 2 * m * layout.virtual_stages, 2,
                                      layout.schedule != "interleaved", "pipeline activations and gradients"))
    exposed_send = 0.0 if layout.schedule == "interleaved" else send
    stages = []
    for s, n in enumerate(counts):
        e = n * per_layer + (embed if s == 0 else 0.0) + (head_s if s == layout.pp - 1 else 0.0)
        stages.append(e + (exposed_send if layout.pp > 1 else 0.0))
    if layout.pp == 1:
        pipe = m * stages[0]
    elif layout.schedule == "interleaved":
        pipe = interleaved_pipeline_s(stages, m, layout.virtual_stages)
    else:
        pipe = pipeline_s(stages, m)
    busiest = max(range(layout.pp), key=lambda s: stages[s])
    n = counts[busiest]
    compute_s = m * (n * (layer["fwd"] + layer["bwd"]) + (embed if busiest == 0 else 0.0)
                     + (head_s if busiest == layout.pp - 1 else 0.0))
    inside = m * (n * (layer["tp_exposed"] + layer["cp_exposed"]) + exposed_send)
    bubble = pipe - m * stages[busiest] if layout.pp > 1 else 0.0
    # Parameters the busiest rank holds: its layers' tensor-parallel share, the embedding or output layer's.
    layer_params = spec.layer_params() / layout.tp
    stage_params = n * layer_params + (spec.embedding_params() / vocab_tp if busiest == 0 else 0.0) \
        + (spec.head_params() / vocab_tp if busiest == layout.pp - 1 else 0.0)
    window_bwd = n * layer["bwd"]
    window_fwd = n * layer["fwd"]
    dp_exposed, data_comm, copies, dp_colls = _data_parallel(spec, layout, hardware, timer, stack, stage_params,
                                                             layer_params, n, m, window_fwd, window_bwd)
    collectives += dp_colls
    updated = stage_params / (layout.fsdp if layout.sharded else layout.dp if layout.zero1 else 1)
    optimizer = 0.0 if mfu_flops else optimizer_s(updated, stack, compute)
    step = pipe + dp_exposed + optimizer + copies
    last = layout.pp - 1
    memory = [per_rank(spec, layout, tokens, k * layer_params + (spec.embedding_params() / vocab_tp if s == 0 else 0.0)
                       + (spec.head_params() / vocab_tp if s == last else 0.0), layer_params, k, m, s == last,
                       stack.selective, stage=s) for s, k in enumerate(counts)]
    return Prediction(layout=layout, devices=layout.devices, global_batch=global_batch, step_s=step,
                      compute_s=compute_s, comm_exposed_s=inside + dp_exposed, bubble_s=bubble, optimizer_s=optimizer,
                      memory_per_rank=memory, collectives=collectives, recompute_s=m * n * layer["recompute"],
                      parts={"fsdp_copies": copies, "data_parallel_comm": data_comm, "gemm": m * n * layer["gemm"],
                             "attention": m * n * layer["attention"], "elementwise": m * n * layer["elementwise"]},
                      seq_len=spec.seq_len)


def _data_parallel(spec: DecoderSpec, layout: Layout, hardware: Hardware, timer: _Timer, stack: Stack,
                   params: float, layer_params: float, layers: int, m: int, window_fwd: float,
                   window_bwd: float) -> tuple[float, float, float, list[Collective]]:
    """(exposed seconds, total communication seconds, FSDP copy seconds, collectives) of the data dimension."""
    colls: list[Collective] = []
    if layout.data == 1:
        return 0.0, 0.0, 0.0, colls
    if layout.sharded:
        s = layout.fsdp
        gather = _cost(hardware, layout, "fsdp", s, "all_gather", BF16 * layer_params)
        scatter = _cost(hardware, layout, "fsdp", s, "reduce_scatter", FP32 * layer_params)
        root = params - layers * layer_params
        root_comm = _cost(hardware, layout, "fsdp", s, "all_gather", BF16 * root) \
            + _cost(hardware, layout, "fsdp", s, "reduce_scatter", FP32 * root)
        replicas = _cost(hardware, layout, "dp", layout.dp, "all_reduce", FP32 * layer_params / s) \
            if layout.dp > 1 else 0.0
        root_comm += _cost(hardware, layout, "dp", layout.dp, "all_reduce", FP32 * root / s) if layout.dp > 1 else 0
        fwd_comm, bwd_comm = layers * gather, layers * (gather + scatter + replicas)
        exposed = m * (gather + max(0.0, fwd_comm - window_fwd) + max(0.0, bwd_comm - window_bwd)) + root_comm
        copies = timer.memory(m * layers * layer_params * (2 * stack.fsdp_gather_copy_bytes
                                                           + stack.fsdp_scatter_copy_bytes), 3 * layers)
        colls += [Collective("all_gather", "fsdp", BF16 * layer_params, 2 * m * layers, s, True, "FSDP gathers"),
                  Collective("reduce_scatter", "fsdp", FP32 * layer_params, m * layers, s, True, "FSDP scatters")]
        return exposed, m * (fwd_comm + bwd_comm) + root_comm, copies, colls
    ranks = layout.dp
    bucket = min(1.0, max(MEGATRON_BUCKET_PARAMS, 1e6 * ranks) / params)
    if layout.zero1:
        scatter = _cost(hardware, layout, "data", ranks, "reduce_scatter", FP32 * params)
        gather = _cost(hardware, layout, "data", ranks, "all_gather", BF16 * params)
        exposed = max(scatter - window_bwd, bucket * scatter) + max(gather - window_fwd, bucket * gather)
        colls += [Collective("reduce_scatter", "data", FP32 * params, 1, ranks, True, "gradient reduce-scatter"),
                  Collective("all_gather", "data", BF16 * params, 1, ranks, True, "weight all-gather")]
        return exposed, scatter + gather, 0.0, colls
    reduce = _cost(hardware, layout, "data", ranks, "all_reduce", FP32 * params)
    colls.append(Collective("all_reduce", "data", FP32 * params, 1, ranks, True, "gradient all-reduce"))
    return max(reduce - window_bwd, bucket * reduce), reduce, 0.0, colls
