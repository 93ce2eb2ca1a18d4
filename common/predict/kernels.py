"""A decoder's pipeline stages timed kernel by kernel on a GPU (common.predict.step puts them together); every
formula, per layout option, is docs/prediction-at-scale.md's ("The layouts", "Compute from first principles")."""
from __future__ import annotations

from dataclasses import replace

from common.errors import BadInput
from common.layout import Layout
from common.predict.basis import Basis, from_mfu
from common.predict.collectives import Collective, cost_s, crosses_nodes
from common.predict.decoder import DecoderSpec
from common.predict.gpu_compute import DeviceCompute, compute_for
from common.predict.hardware import Hardware
from common.predict.memory import decoder_rank_bytes
from common.predict.prediction import Stages
from common.predict.stacks import Float8, Stack
from common.spec import Gemm, attention_flops

FP8, BF16, FP32 = 1, 2, 4
FLASH_BACKWARD = 2.5            # flash attention's backward FLOPs over its forward's (Dao 2023)
MEGATRON_BUCKET_PARAMS = 40e6   # megatron/core/distributed: bucket_size = max(40M, 1M x dp) parameters


class Timer:
    """Kernel times of one rank: a device's measured rates (DeviceCompute) or an assumed MFU (basis.from_mfu)."""

    def __init__(self, compute: DeviceCompute | Basis, precision: str = "bf16"):
        self.precision = precision
        self.compute = compute if isinstance(compute, DeviceCompute) else None
        self.assumed = None if self.compute else compute

    def at(self, precision: str) -> Timer:
        """The same device's kernels with its GEMMs at `precision` (a Float8 stack's Linears: fp8)."""
        return Timer(self.compute or self.assumed, precision)

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


def _float8_casts(spec: DecoderSpec, layout: Layout, f8: Float8, tokens: int) -> tuple[float, float, int]:
    """(forward bytes, backward bytes, backward kernels) of one layer's casts to fp8 on one rank, one micro-batch
    (common.predict.stacks.Float8; docs/prediction-at-scale.md, "Float8")."""
    tp = layout.tp
    shard = tp if layout.sp else 1
    h, q, kv = spec.hidden, spec.q_width, spec.kv_width
    up = spec.ffn * (2 if spec.ffn_kind == "swiglu" else 1)
    # Inputs, each cast once however many Linears read it: the attention's and the FFN's (h, cast before tensor
    # parallelism gathers them), the output projection's (q) and w2's (f); kept in fp8 and copied column-major,
    # gathered, for the weight gradients.
    inputs_cast, inputs_kept = 2 * h / shard + (q + spec.ffn) / tp, 2 * h + (q + spec.ffn) / tp
    # Output gradients, one a Linear: the column-parallel ones' (q + 2kv + up) and the row-parallel ones' (h
    # each, cast before tensor parallelism gathers them); each copied column-major for its weight gradient.
    grads_cast, grads_kept = (q + 2 * kv + up) / tp + 2 * h / shard, (q + 2 * kv + up) / tp + 2 * h
    weights = spec.linear_weights() / tp
    linears = len(spec.linears())
    if f8.transpose_in_cast:
        # The casts write the column-major copies (1 B); the h-wide tensors sequence parallelism gathers after
        # their cast (two inputs, two output gradients) are copied after the gather.
        gathered = 4 * h if layout.sp and tp > 1 else 0.0
        copies = FP8 * (inputs_cast + grads_cast - gathered / shard) + f8.transpose_bytes * gathered
        copy_kernels = 4 if gathered else 0
    else:
        copies, copy_kernels = f8.transpose_bytes * (inputs_kept + grads_kept), 3 * linears
    # An amax of its own: the attention output's (forward) and each output gradient's (backward), one kernel each.
    amax_fwd, amax_bwd = (f8.amax_bytes * q / tp, f8.amax_bytes * grads_cast) if f8.amax_unfused else (0.0, 0.0)
    # A weight FSDP (or, kept in fp8, the distributed optimizer) gathers in fp8 arrives cast; one held whole in
    # bf16 is cast on the rank (its amax, then the cast); weights kept in fp8 are copied column-major once a step
    # (decoder_stages), the others each micro-batch.
    weight_cast = 0.0 if layout.sharded or f8.weights_in_fp8 else (f8.amax_bytes + f8.cast_bytes) * weights
    weight_copy = 0.0 if f8.weights_in_fp8 else f8.transpose_bytes * weights
    forward = tokens * (f8.cast_bytes * inputs_cast + amax_fwd) + weight_cast
    backward = tokens * (f8.cast_bytes * grads_cast + amax_bwd + copies) + weight_copy
    # Backward kernels: the column-major copies made apart (with torchao each input's, each output gradient's
    # and each weight's, with each output gradient's cast: 3 a Linear), each output gradient's cast and amax.
    kernels = copy_kernels + (linears if f8.transpose_in_cast else 0) + (linears if f8.amax_unfused else 0)
    return forward, backward, f8.kernels_forward + kernels


def _context_parallel(spec: DecoderSpec, layout: Layout, stack: Stack, hardware: Hardware, tokens: int,
                      attn_fwd: float, attn_bwd: float) -> tuple[float, float, float, tuple[int, int]]:
    """(exposed seconds, forward bytes, backward bytes, (forward, backward) kernels) of one layer's attention over
    the context-parallel ranks, one micro-batch (docs/prediction-at-scale.md, "Context parallelism")."""
    c, cpd = layout.cp, stack.context_parallel
    if c == 1:
        return 0.0, 0.0, 0.0, (0, 0)
    if cpd is None:
        # A ring: K and V (their heads split over tp) passed on cp - 1 times forward, and backward with their
        # gradients, each behind a step of the attention. Every pass waits for the ring's slowest hop: the
        # network where the ring spans nodes.
        kv = BF16 * tokens * 2 * spec.kv_width / min(layout.tp, spec.kv_heads)
        ring = (c - 1) * _cost(hardware, layout, "cp", c, "send_recv", kv)
        return max(0.0, ring - attn_fwd) + max(0.0, 2 * ring - attn_bwd), 0.0, 0.0, (0, 0)
    out = tokens * spec.q_width / layout.tp
    kv = tokens * 2 * (spec.q_width if cpd.kv_repeated else spec.kv_width) / layout.tp
    # K and V gathered whole once a direction, waited for after the first step's attention (1/cp of it);
    # backward, the K and V gradients passed on after each step, waited for after the next and, the last, after
    # the loop.
    gather = _cost(hardware, layout, "cp", c, "all_gather", BF16 * kv * c)
    grad = _cost(hardware, layout, "cp", c, "send_recv", cpd.grad_bytes * kv)
    exposed = max(0.0, gather - attn_fwd / c) + max(0.0, gather - attn_bwd / c) \
        + (c - 1) * max(0.0, grad - attn_bwd / c) + grad
    sends = (c - 1) * kv * cpd.send_copy
    forward = out * (cpd.merge_once + (c - 1) * cpd.merge_step) + sends
    backward = (out + kv) * cpd.grad_once + c * out * cpd.grad_q_step \
        + kv * (cpd.grad_kv_first + (c - 1) * cpd.grad_kv_step) + sends
    return exposed, forward, backward, ((c - 1) * cpd.kernels_forward, c * cpd.kernels_backward)


def _layer(spec: DecoderSpec, layout: Layout, stack: Stack, timer: Timer, hardware: Hardware,
           tokens: int) -> dict[str, float]:
    """One layer, one micro-batch, one rank: its forward and backward times and their parts."""
    tp, sp, f8 = layout.tp, layout.sp, stack.float8
    gemms = spec.layer_gemms(tokens, tp, stack.fused_projections)
    split = dict(stack.tp_overlap_split) if layout.tp_overlap and tp > 1 else {}
    linear = timer.at("fp8") if f8 else timer

    def timed(g: Gemm) -> float:
        # Overlapped tensor-parallel communication runs the GEMM in chunks of the tokens (its stack's split).
        chunks = split.get(g.name)
        if not chunks:
            return linear.gemm(g)
        k = tp if chunks == "tp" else int(chunks)
        return k * linear.gemm(Gemm(g.name, -(-g.m // k), g.n, g.k))

    gemm_fwd = [timed(g) for g in gemms]
    gemm_bwd = sum(timed(b) for g in gemms for b in spec.backward_gemms(g))
    seq = spec.seq_len / layout.cp
    # Causal, shared over tp (heads) and cp (a rank's tokens: load-balanced chunks).
    attn_flops = attention_flops(tokens, spec.seq_len, spec.q_width / tp, causal=True)
    attn_fwd = timer.attention(stack.attention_kernel, attn_flops, seq, False)
    attn_bwd = timer.attention(stack.attention_kernel, FLASH_BACKWARD * attn_flops, seq, True)
    wide, narrow = stack.elementwise(spec)
    ew_bytes = tokens * (wide / (tp if sp else 1) + narrow / tp)
    # (the weights as FSDP holds them: gathered in fp8 where the cp ranks shard them too)
    cast_fwd, cast_bwd, cast_kernels = _float8_casts(spec, _parameter_holders(layout, stack), f8, tokens) if f8 \
        else (0.0, 0.0, 0)
    cp_exposed, merge_fwd, merge_bwd, merge_kernels = _context_parallel(spec, layout, stack, hardware, tokens,
                                                                        attn_fwd, attn_bwd)
    ew_fwd = timer.memory(ew_bytes + cast_fwd + merge_fwd, stack.elementwise_kernels
                          + (f8.kernels_forward if f8 else 0) + merge_kernels[0])
    ew_bwd = timer.memory(stack.backward_factor * ew_bytes + cast_bwd + merge_bwd,
                          stack.elementwise_kernels + cast_kernels + merge_kernels[1])
    fwd = sum(gemm_fwd) + attn_fwd + ew_fwd
    selective = attn_fwd if stack.selective == "attention" else sum(gemm_fwd[1::2]) + ew_fwd
    recompute = {"full": fwd, "selective": selective}.get(layout.recompute, 0.0)
    bwd = gemm_bwd + attn_bwd + ew_bwd + recompute
    # Tensor parallel: 2 all-reduces a direction, or with sp 2 all-gathers + 2 reduce-scatters (the same bytes;
    # a Float8 stack gathers the inputs forward and the output gradients backward in fp8).
    act = BF16 * tokens * spec.hidden
    gathered = (f8.gather_bytes if f8 else BF16) * tokens * spec.hidden
    kinds = (("all_gather", gathered), ("reduce_scatter", act)) if sp else (("all_reduce", act),)
    tp_fwd = 2 * sum(_cost(hardware, layout, "tp", tp, kind, nbytes) for kind, nbytes in kinds)
    tp_bwd = tp_fwd + (tp_fwd if layout.recompute == "full" else 0.0)
    overlapped = max(0.0, tp_fwd - sum(gemm_fwd)) + max(0.0, tp_bwd - gemm_bwd)
    tp_exposed = overlapped if layout.tp_overlap else tp_fwd + tp_bwd
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
    stack.check_model(spec)
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
    if isinstance(compute, Basis) and stack.float8:
        raise ValueError(f"{stack.name}: an assumed MFU is a fraction of one peak, and Float8 runs its GEMMs at two "
                         "(fp8 and bf16): predict it from a compute table")
    stack.check_model(spec)
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
    held = _parameter_holders(layout, stack)
    layer_params = spec.layer_params() / layout.tp
    # FSDP gathers a Float8 stack's Linear weights in fp8, and so does the distributed optimizer where they are
    # kept in fp8; the other parameters in bf16.
    f8 = stack.float8
    gathered_f8 = f8 if f8 and (held.sharded or (held.zero1 and f8.weights_in_fp8)) else None
    linear_weights = spec.linear_weights() / layout.tp
    fp8_saved = (BF16 - gathered_f8.gather_bytes) * linear_weights if gathered_f8 else 0.0   # a layer's, gathered
    layer_gather = BF16 * layer_params - fp8_saved
    weight_shards = held.fsdp if held.sharded else held.dp if held.zero1 else 1
    # Whose fp8 weights get their scales once a step: those FSDP gathers in fp8, and any kept in fp8.
    scaled = gathered_f8 or (f8 if f8 and f8.weights_in_fp8 else None)
    last = layout.pp - 1
    out = Stages(micro_batches=m, seq_len=spec.seq_len)
    data_parallel: dict[tuple[int, bool, bool], tuple] = {}   # the middle stages of a long pipeline are alike
    for s, n in enumerate(_stage_layers(spec, layout)):
        # Parameters a rank of the stage holds: its layers' tensor-parallel share, the embedding or output layer's.
        params = n * layer_params + (spec.embedding_params() / vocab_tp if s == 0 else 0.0) \
            + (spec.head_params() / vocab_tp if s == last else 0.0)
        kind = (n, s == 0, s == last)
        if kind not in data_parallel:
            exposed, data_comm, copies, colls = _data_parallel(spec, held, hardware, timer, stack, params,
                                                               layer_params, layer_gather, n, m, n * layer["fwd"],
                                                               n * layer["bwd"], BF16 * params - n * fp8_saved)
            if scaled:
                # After the optimizer, every fp8 weight's amax from its shard (one kernel; the weights kept in fp8
                # cast there too), the amaxes all-reduced over the shards (nothing to reduce where a rank holds all).
                copies += timer.memory(n * linear_weights / weight_shards * scaled.scale_bytes, 1)
                exposed += _cost(hardware, held, "fsdp" if held.sharded else "data", weight_shards, "all_reduce",
                                 FP32 * n * len(spec.linears()))
            if f8 and f8.weights_in_fp8:   # the fp8 weights' column-major copies, once a step
                copies += timer.memory(n * linear_weights * f8.transpose_bytes, len(spec.linears()))
            data_parallel[kind] = exposed, data_comm, copies, colls
        exposed, data_comm, copies, colls = data_parallel[kind]
        updated = params / (held.fsdp if held.sharded else held.dp if held.zero1 else 1)
        out.add(compute=n * (layer["fwd"] + layer["bwd"]) + (embed if s == 0 else 0.0) + (head_s if s == last else 0.0),
                inside=n * (layer["tp_exposed"] + layer["cp_exposed"]) + exposed_send,
                recompute=n * layer["recompute"], after_comm=exposed, after_other=copies,
                optimizer=timer.optimizer(updated, stack), collectives=sends + colls,
                parts={"fsdp_copies": copies, "data_parallel_comm": data_comm, "gemm": m * n * layer["gemm"],
                       "attention": m * n * layer["attention"], "elementwise": m * n * layer["elementwise"]},
                model_bytes=decoder_rank_bytes(spec, held, tokens, params, layer_params, n, m, s == last,
                                               stack.selective, s, 2 if _regathered(layout, stack) else max(2, n),
                                               n if _held_through_step(layout, stack) else 0,
                                               stack.grad_reduce_bytes, stack.logit_live_bytes))
    return out


def _parameter_holders(layout: Layout, stack: Stack) -> Layout:
    """The layout as its parameters are held: a context-parallel rank holds what its cp peers hold and sums its
    gradients with theirs, so the cp ranks join FSDP's shards (torchtitan's dp_shard_cp; cp alone too where the
    stack shards over it) or else the data-parallel replicas (Megatron's data-parallel group with context
    parallelism). The groups stay contiguous in common.layout's rank order (cp just outside tp)."""
    if layout.cp == 1:
        return layout
    if layout.sharded or stack.fsdp_over_cp:
        return replace(layout, fsdp=layout.fsdp * layout.cp, cp=1)
    return replace(layout, dp=layout.dp * layout.cp, cp=1)


def _regathered(layout: Layout, stack: Stack) -> bool:
    """Whether FSDP gathers a layer again for its backward: resharded after its forward, unless ZeRO-2 keeps it
    gathered or the stack does under a pipeline (torchtitan: the stage's layers held, _held_through_step)."""
    return not layout.zero2 and not _held_through_step(layout, stack)


def _held_through_step(layout: Layout, stack: Stack) -> bool:
    """Whether FSDP keeps a pipeline stage's layers gathered through every micro-batch and reduces their gradients
    once a step, after the last micro-batch's backward: torch's pipelining under a stack that does not reshard
    (PipelineStage.backward_maybe_with_nosync: reshard_after_backward and gradient sync off until the last
    backward, the gradients accumulated unsharded in float32 until then)."""
    return layout.pp > 1 and not stack.fsdp_reshard_under_pp


def _data_parallel(spec: DecoderSpec, layout: Layout, hardware: Hardware, timer: Timer, stack: Stack,
                   params: float, layer_params: float, layer_gather: float, layers: int, m: int, window_fwd: float,
                   window_bwd: float, params_gather: float) -> tuple[float, float, float, list[Collective]]:
    """(exposed seconds, total communication seconds, FSDP copy seconds, collectives) of the data dimension;
    `layer_gather`: the bytes FSDP gathers of a layer, `params_gather` the distributed optimizer of the stage (2 a
    parameter, 1 a Float8 stack's Linear weight gathered in fp8); gradients reduced at the stack's bytes."""
    grad = stack.grad_reduce_bytes
    if layout.data == 1:
        return 0.0, 0.0, 0.0, []
    if layout.sharded:
        s = layout.fsdp
        gather = _cost(hardware, layout, "fsdp", s, "all_gather", layer_gather)
        scatter = _cost(hardware, layout, "fsdp", s, "reduce_scatter", grad * layer_params)
        root = params - layers * layer_params
        root_comm = _cost(hardware, layout, "fsdp", s, "all_gather", BF16 * root) \
            + _cost(hardware, layout, "fsdp", s, "reduce_scatter", grad * root) \
            + _cost(hardware, layout, "dp", layout.dp, "all_reduce", grad * root / s)
        replicas = _cost(hardware, layout, "dp", layout.dp, "all_reduce", grad * layer_params / s)
        again = 1 if _regathered(layout, stack) else 0   # a layer gathered again for its backward
        fwd_comm, bwd_comm = layers * gather, layers * (again * gather + scatter + replicas)
        if _held_through_step(layout, stack):
            # Gathered in the first micro-batch's forward, reduced after the last one's backward: nothing left to
            # hide the reduce-scatters behind.
            rounds = 1
            exposed = gather + max(0.0, fwd_comm - window_fwd) + bwd_comm + root_comm
        else:
            rounds = m
            exposed = m * (gather + max(0.0, fwd_comm - window_fwd) + max(0.0, bwd_comm - window_bwd)) + root_comm
        # The root's parameters (embedding, final norm, output layer) are an FSDP unit too: gathered and scattered
        # once a step (root_comm) through the same copies as a layer's (torch 2.6 _fsdp_collectives.py), 2 kernels.
        # The copy-out reads and writes what was gathered: fsdp_gather_copy_bytes per bf16 element.
        copies = timer.memory(rounds * layers * ((1 + again) * layer_gather / BF16 * stack.fsdp_gather_copy_bytes
                                                 + layer_params * stack.fsdp_scatter_copy_bytes)
                              + root * (stack.fsdp_gather_copy_bytes + stack.fsdp_scatter_copy_bytes),
                              (2 + again) * layers + (2 if root else 0))
        colls = [Collective("all_gather", "fsdp", layer_gather, (1 + again) * rounds * layers, s, True,
                            "FSDP gathers"),
                 Collective("reduce_scatter", "fsdp", grad * layer_params, rounds * layers, s, True,
                            "FSDP scatters")]
        return exposed, rounds * (fwd_comm + bwd_comm) + root_comm, copies, colls
    ranks = layout.dp
    bucket = min(1.0, max(MEGATRON_BUCKET_PARAMS, 1e6 * ranks) / params)
    if layout.zero1:
        scatter = _cost(hardware, layout, "data", ranks, "reduce_scatter", grad * params)
        gather = _cost(hardware, layout, "data", ranks, "all_gather", params_gather)
        exposed = max(scatter - window_bwd, bucket * scatter) + max(gather - window_fwd, bucket * gather)
        colls = [Collective("reduce_scatter", "data", grad * params, 1, ranks, True, "gradient reduce-scatter"),
                 Collective("all_gather", "data", params_gather, 1, ranks, True, "weight all-gather")]
        return exposed, scatter + gather, 0.0, colls
    reduce = _cost(hardware, layout, "data", ranks, "all_reduce", grad * params)
    return max(reduce - window_bwd, bucket * reduce), reduce, 0.0, [
        Collective("all_reduce", "data", grad * params, 1, ranks, True, "gradient all-reduce")]
