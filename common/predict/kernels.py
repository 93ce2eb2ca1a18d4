"""A decoder's pipeline stages timed kernel by kernel on a GPU (common.predict.step puts them together); every
formula, per layout option, is docs/prediction-at-scale.md's ("The layouts", "Compute from first principles")."""
from __future__ import annotations

from common.errors import BadInput
from common.layout import Layout
from common.predict.basis import Basis, from_mfu
from common.predict.collectives import Collective, cost_s, crosses_nodes
from common.predict.decoder import DecoderSpec
from common.predict.gpu_compute import DeviceCompute, compute_for
from common.predict.hardware import Hardware
from common.predict.memory import decoder_rank_bytes
from common.predict.prediction import Stages
from common.predict.stacks import Stack
from common.spec import Gemm, attention_flops

BF16, FP32 = 2, 4
FLASH_BACKWARD = 2.5            # flash attention's backward FLOPs over its forward's (Dao 2023)
MEGATRON_BUCKET_PARAMS = 40e6   # megatron/core/distributed: bucket_size = max(40M, 1M x dp) parameters


class Timer:
    """Kernel times of one rank: a device's measured rates (DeviceCompute) or an assumed MFU (basis.from_mfu)."""

    def __init__(self, compute: DeviceCompute | Basis, precision: str = "bf16"):
        self.precision = precision
        self.compute = compute if isinstance(compute, DeviceCompute) else None
        self.assumed = None if self.compute else compute

    def gemm(self, g: Gemm) -> float:
        return g.flops / self.assumed.flops_per_s if self.assumed else self.compute.gemm_s(g, self.precision)

    def attention(self, kernel: str, flops: float, seq: float, backward: bool) -> float:
        return flops / self.assumed.flops_per_s if self.assumed else \
            self.compute.attention_s(kernel, flops, seq, backward)

    def memory(self, nbytes: float, kernels: int = 1) -> float:
        return 0.0 if self.assumed else self.compute.memory_s(nbytes, kernels)

    def optimizer(self, elements: float, stack: Stack) -> float:
        """The optimizer's step (clipping included) over `elements` parameters a rank updates: memory-bound."""
        return elements * self.assumed.s_per_param if self.assumed else self.memory(elements * stack.optimizer_bytes, 8)


def device_compute(hardware: Hardware, mfu: float | None = None) -> DeviceCompute | Basis:
    """What a decoder's kernels are timed by on `hardware`: its compute table, or with `mfu` basis.from_mfu's rule."""
    return from_mfu(mfu, hardware, "bf16") if mfu is not None else compute_for(hardware)


def compute_label(compute: DeviceCompute | Basis) -> str:
    """What a decoder's prediction rests on, for every table and document."""
    if isinstance(compute, Basis):
        return compute.label
    return f"compute from first principles: {compute.path} (measured and published kernel rates, each with its source)"


def _cost(hardware: Hardware, layout: Layout, dim: str, ranks: int, kind: str, nbytes: float) -> float:
    """One collective over `ranks` along `dim` (common.layout's rank order), on the link its group crosses."""
    if ranks < 2:
        return 0.0      # a group of one rank sends nothing, over no link
    return cost_s(kind, nbytes, ranks, hardware.link(crosses_nodes(layout, dim, hardware.devices_per_node, ranks)))


def _layer(spec: DecoderSpec, layout: Layout, stack: Stack, timer: Timer, hardware: Hardware,
           tokens: int) -> dict[str, float]:
    """One layer, one micro-batch, one rank: its forward and backward times and their parts."""
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
    # Causal, shared over tp (heads) and cp (a rank's tokens: load-balanced chunks).
    attn_flops = attention_flops(tokens, spec.seq_len, spec.q_width / tp, causal=True)
    attn_fwd = timer.attention(stack.attention_kernel, attn_flops, seq, False)
    attn_bwd = timer.attention(stack.attention_kernel, FLASH_BACKWARD * attn_flops, seq, True)
    wide, narrow = stack.elementwise(spec)
    ew_bytes = tokens * (wide / (tp if sp else 1) + narrow / tp)
    ew_fwd = timer.memory(ew_bytes, stack.elementwise_kernels)
    ew_bwd = timer.memory(stack.backward_factor * ew_bytes, stack.elementwise_kernels)
    fwd = sum(gemm_fwd) + attn_fwd + ew_fwd
    selective = attn_fwd if stack.selective == "attention" else sum(gemm_fwd[1::2]) + ew_fwd
    recompute = {"full": fwd, "selective": selective}.get(layout.recompute, 0.0)
    bwd = gemm_bwd + attn_bwd + ew_bwd + recompute
    # Tensor parallel: 2 all-reduces a direction, or with sp 2 all-gathers + 2 reduce-scatters (the same bytes).
    act = BF16 * tokens * spec.hidden
    kinds = ("all_gather", "reduce_scatter") if sp else ("all_reduce",)
    tp_fwd = 2 * sum(_cost(hardware, layout, "tp", tp, kind, act) for kind in kinds)
    tp_bwd = tp_fwd + (tp_fwd if layout.recompute == "full" else 0.0)
    overlapped = max(0.0, tp_fwd - sum(gemm_fwd)) + max(0.0, tp_bwd - gemm_bwd)
    tp_exposed = overlapped if layout.tp_overlap else tp_fwd + tp_bwd
    cp_exposed = 0.0
    if layout.cp > 1:
        kv = BF16 * tokens * 2 * spec.kv_width / min(tp, spec.kv_heads)
        ring = (layout.cp - 1) * _cost(hardware, layout, "cp", 2, "send_recv", kv)
        cp_exposed = max(0.0, ring - attn_fwd) + max(0.0, 2 * ring - attn_bwd)
    return {"fwd": fwd, "bwd": bwd, "tp_exposed": tp_exposed, "cp_exposed": cp_exposed,
            "tp_comm": tp_fwd + tp_bwd, "gemm": sum(gemm_fwd) + gemm_bwd, "attention": attn_fwd + attn_bwd,
            "elementwise": ew_fwd + ew_bwd, "recompute": recompute}


def head(spec: DecoderSpec, tp: int, stack: Stack, timer: Timer, tokens: int) -> dict[str, float]:
    """The last stage's own work, forward and backward: the final norm, the output layer's GEMMs (`tp`: the ranks
    its vocabulary is split over, 1 where it is replicated) and the loss over the logits."""
    head = spec.head_gemm(tokens, tp)
    return {"gemm": timer.gemm(head) + sum(timer.gemm(b) for b in spec.backward_gemms(head)),
            "loss": timer.memory(tokens * spec.vocab / tp * stack.logit_bytes, 4),
            "norm": timer.memory(tokens * spec.hidden * 4 * (1 + stack.backward_factor), 2)}


def one_layer(spec: DecoderSpec, stack: Stack, compute: DeviceCompute, hardware: Hardware, micro_batch: int,
              precision: str = "bf16", recompute: str = "none") -> dict[str, float]:
    """One layer's forward and backward on one device (no parallelism): what bench.layer_check measures beside it."""
    return _layer(spec, Layout(recompute=recompute), stack, Timer(compute, precision), hardware,
                  micro_batch * spec.seq_len)


def _stage_layers(spec: DecoderSpec, layout: Layout) -> list[int]:
    """Layers per pipeline stage (all its chunks): an even split, the first stages taking any remainder."""
    chunks = layout.pp * layout.virtual_stages
    base, extra = divmod(spec.layers, chunks)
    per_chunk = [base + (1 if c < extra else 0) for c in range(chunks)]
    return [sum(per_chunk[s::layout.pp]) for s in range(layout.pp)]


def decoder_stages(spec: DecoderSpec, layout: Layout, global_batch: int, hardware: Hardware, stack: Stack | None,
                   compute: DeviceCompute | Basis) -> Stages:
    """One rank of each stage of `layout` at `global_batch` sequences, timed by `compute` (device_compute)."""
    try:
        layout.validate(spec, global_batch)
    except BadInput as exc:
        raise ValueError(str(exc)) from None
    if stack is None:
        raise ValueError(f"{spec.name}: a decoder's step needs the software stack that runs it (--stack)")
    if isinstance(compute, Basis) and not compute.flops_per_s:
        raise ValueError(f"{spec.name}: a decoder is timed from a device's compute table or an assumed MFU; no "
                         "decoder is executed here, so no measured 1-device run times one")
    stack.check(layout)
    timer = Timer(compute)
    m = layout.micro_batches_at(global_batch)
    tokens = global_batch // (layout.data * m) * spec.seq_len // layout.cp
    vocab_tp = layout.tp if layout.vocab_split else 1
    layer = _layer(spec, layout, stack, timer, hardware, tokens)
    # First stage: the embedding's look-up and its gradient (memory-bound); last: final norm, output layer, loss.
    embed = timer.memory(tokens * spec.hidden * BF16 * 4 / (layout.tp if layout.sp else 1), 2)
    head_s = sum(head(spec, vocab_tp, stack, timer, tokens).values())
    exposed_send, sends = 0.0, []
    if layout.pp > 1:
        act = BF16 * tokens * spec.hidden / (layout.tp if layout.sp else 1)
        if layout.schedule != "interleaved":
            exposed_send = 2 * _cost(hardware, layout, "pp", 2, "send_recv", act)
        sends.append(Collective("send_recv", "pp", act, 2 * m * layout.virtual_stages, 2,
                                layout.schedule != "interleaved", "pipeline activations and gradients"))
    layer_params = spec.layer_params() / layout.tp
    last = layout.pp - 1
    out = Stages(micro_batches=m, seq_len=spec.seq_len)
    for s, n in enumerate(_stage_layers(spec, layout)):
        # Parameters a rank of the stage holds: its layers' tensor-parallel share, the embedding or output layer's.
        params = n * layer_params + (spec.embedding_params() / vocab_tp if s == 0 else 0.0) \
            + (spec.head_params() / vocab_tp if s == last else 0.0)
        exposed, data_comm, copies, colls = _data_parallel(spec, layout, hardware, timer, stack, params,
                                                           layer_params, n, m, n * layer["fwd"], n * layer["bwd"])
        updated = params / (layout.fsdp if layout.sharded else layout.dp if layout.zero1 else 1)
        out.add(compute=n * (layer["fwd"] + layer["bwd"]) + (embed if s == 0 else 0.0) + (head_s if s == last else 0.0),
                inside=n * (layer["tp_exposed"] + layer["cp_exposed"]) + exposed_send,
                recompute=n * layer["recompute"], after_comm=exposed, after_other=copies,
                optimizer=timer.optimizer(updated, stack), collectives=sends + colls,
                parts={"fsdp_copies": copies, "data_parallel_comm": data_comm, "gemm": m * n * layer["gemm"],
                       "attention": m * n * layer["attention"], "elementwise": m * n * layer["elementwise"]},
                model_bytes=decoder_rank_bytes(spec, layout, tokens, params, layer_params, n, m, s == last,
                                               stack.selective, s, 2 if _regathered(layout, stack) else max(2, n)))
    return out


def _regathered(layout: Layout, stack: Stack) -> bool:
    """Whether FSDP gathers a layer again for its backward: resharded after its forward, unless ZeRO-2 keeps it
    gathered or the stack does under a pipeline (torchtitan: one gather per micro-batch instead of two, the
    stage's layers held)."""
    return not layout.zero2 and (layout.pp == 1 or stack.fsdp_reshard_under_pp)


def _data_parallel(spec: DecoderSpec, layout: Layout, hardware: Hardware, timer: Timer, stack: Stack,
                   params: float, layer_params: float, layers: int, m: int, window_fwd: float,
                   window_bwd: float) -> tuple[float, float, float, list[Collective]]:
    """(exposed seconds, total communication seconds, FSDP copy seconds, collectives) of the data dimension."""
    if layout.data == 1:
        return 0.0, 0.0, 0.0, []
    if layout.sharded:
        s = layout.fsdp
        gather = _cost(hardware, layout, "fsdp", s, "all_gather", BF16 * layer_params)
        scatter = _cost(hardware, layout, "fsdp", s, "reduce_scatter", FP32 * layer_params)
        root = params - layers * layer_params
        root_comm = _cost(hardware, layout, "fsdp", s, "all_gather", BF16 * root) \
            + _cost(hardware, layout, "fsdp", s, "reduce_scatter", FP32 * root) \
            + _cost(hardware, layout, "dp", layout.dp, "all_reduce", FP32 * root / s)
        replicas = _cost(hardware, layout, "dp", layout.dp, "all_reduce", FP32 * layer_params / s)
        again = 1 if _regathered(layout, stack) else 0   # a layer gathered again for its backward
        fwd_comm, bwd_comm = layers * gather, layers * (again * gather + scatter + replicas)
        exposed = m * (gather + max(0.0, fwd_comm - window_fwd) + max(0.0, bwd_comm - window_bwd)) + root_comm
        # The root's parameters (embedding, final norm, output layer) are an FSDP unit too: gathered and scattered
        # once a step (root_comm) through the same copies as a layer's (torch 2.6 _fsdp_collectives.py), 2 kernels.
        copies = timer.memory(m * layers * layer_params * ((1 + again) * stack.fsdp_gather_copy_bytes
                                                           + stack.fsdp_scatter_copy_bytes)
                              + root * (stack.fsdp_gather_copy_bytes + stack.fsdp_scatter_copy_bytes),
                              (2 + again) * layers + (2 if root else 0))
        colls = [Collective("all_gather", "fsdp", BF16 * layer_params, (1 + again) * m * layers, s, True,
                            "FSDP gathers"),
                 Collective("reduce_scatter", "fsdp", FP32 * layer_params, m * layers, s, True, "FSDP scatters")]
        return exposed, m * (fwd_comm + bwd_comm) + root_comm, copies, colls
    ranks = layout.dp
    bucket = min(1.0, max(MEGATRON_BUCKET_PARAMS, 1e6 * ranks) / params)
    if layout.zero1:
        scatter = _cost(hardware, layout, "data", ranks, "reduce_scatter", FP32 * params)
        gather = _cost(hardware, layout, "data", ranks, "all_gather", BF16 * params)
        exposed = max(scatter - window_bwd, bucket * scatter) + max(gather - window_fwd, bucket * gather)
        colls = [Collective("reduce_scatter", "data", FP32 * params, 1, ranks, True, "gradient reduce-scatter"),
                 Collective("all_gather", "data", BF16 * params, 1, ranks, True, "weight all-gather")]
        return exposed, scatter + gather, 0.0, colls
    reduce = _cost(hardware, layout, "data", ranks, "all_reduce", FP32 * params)
    return max(reduce - window_bwd, bucket * reduce), reduce, 0.0, [
        Collective("all_reduce", "data", FP32 * params, 1, ranks, True, "gradient all-reduce")]
