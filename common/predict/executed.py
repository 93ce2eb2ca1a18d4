"""The executed workloads (the BERT MLM, the CNN) in stages as parbench's backends run them, timed from a basis
(basis.py): torch_3d's collectives, or keras_jax's as XLA compiled them. docs/prediction.md, "The model"."""
from __future__ import annotations

from common.layout import Layout
from common.predict.basis import Basis
from common.predict.collectives import Collective, cost_s, crosses_nodes, group_stride
from common.predict.hardware import Hardware
from common.predict.memory import FLOAT, counted_per_rank, layer_elements, stage_params, state_bytes, value_bytes
from common.predict.prediction import Stages
from common.predict.work import parts, rank_macs, stage_layer_counts, stage_macs
from common.sections import StateBytes
from common.spec import BertSpec, CnnSpec

# Per layer and micro-batch, Megatron's count: forward the attention output's and ffn_out's (row-split) outputs,
# backward the attention's and the FFN's input gradients, once each (torch_3d prepares the attention's input
# once for query, key and value, so their three partial gradients are summed before the one all-reduce).
# --recompute runs each layer's forward again in the backward, its forward all-reduces with it.
TP_FORWARD_ALL_REDUCES = 2
TP_BACKWARD_ALL_REDUCES = 2
# --vocab-split's loss (backends/torch_3d/vocab.py, split_loss_and_correct), per micro-batch: forward the logits'
# maximum, the sum of exponentials and the target's logit (float32, one per masked position), and the index of
# the maximum (int64, for the correct count); backward the head's output gradient (one per position and hidden).
VOCAB_LOSS_FLOAT_ALL_REDUCES = 3
INDEX = 8  # bytes of an int64
DDP_BUCKET_BYTES = 25 * 2**20
BACKWARD_SHARE = 2 / 3   # backward = 2x forward in multiply-adds


# The workloads this model describes as parbench's backends run them (the decoder LM as torch_3d runs it; a cluster's
# decoder is the decoders' model's, bench.predict --model).
WORKLOADS = ("cnn", "mlm", "lm")
# What this model of the executed workloads models: what torch_3d executes, whose collectives it counts.
MODELLED = frozenset({"tp", "pp", "fsdp", "zero2", "micro_batches", "1f1b", "recompute", "vocab_split",
                      "stage_split"})


def check_modelled(layout: Layout) -> None:
    """ValueError in one line for a layout option this model cannot cost (its collectives are torch_3d's)."""
    for feature, flag in layout.features():
        if feature not in MODELLED:
            raise ValueError(f"{layout.name}: {flag} is not modelled for the executed workloads (their step model "
                             "counts what torch_3d executes); the decoders' model does (bench.predict --model)")


def collectives(spec: BertSpec | CnnSpec, layout: Layout, global_batch: int, stage: int, backend: str,
                activation_value_bytes: int = FLOAT, device_kind: str = "cpu") -> list[Collective]:
    """What one rank of `stage` issues per step. A matmul's output travels at the run's precision
    (`activation_value_bytes`: bf16 under autocast), parameters and their gradients as float32 (torch's amp keeps
    both in float32), and so do the encoder's input gradients (a layer's input is a LayerNorm's output on the
    float32 residual stream) and the embedding's output (autocast leaves a lookup alone). The MLM head's output
    is a LayerNorm's of a bf16 GELU: CPU autocast keeps that type, CUDA's runs layer_norm in float32
    (`device_kind`)."""
    m = layout.micro_batches
    micro = global_batch // (layout.data * m)
    out: list[Collective] = []
    params = stage_params(spec, layout, stage)
    layers = stage_layer_counts(layout, spec.layers)[stage] if not isinstance(spec, CnnSpec) else 0
    if not isinstance(spec, CnnSpec):
        activation = activation_value_bytes * micro * spec.seq_len * spec.hidden
        if layout.tp > 1:
            out += _tensor_parallel(spec, layout, micro, layers, stage, activation_value_bytes, device_kind)
        if layout.pp > 1:
            # Per micro-batch and boundary the activation crosses forward and its gradient backward: a rank
            # sends one and receives the other (CommCounter counts both).
            boundaries = (stage > 0) + (stage < layout.pp - 1)
            out.append(Collective("send_recv", "pp", activation, 2 * m * boundaries, 2, True,
                                  "pipeline activations and their gradients"))
            if stage in (0, layout.pp - 1) and isinstance(spec, BertSpec):   # the decoder LM's output is untied
                rows = spec.vocab_size // (layout.tp if layout.vocab_split else 1)
                out.append(Collective("all_reduce", "tie", FLOAT * rows * spec.hidden, 1, 2, True,
                                      "tied embedding gradient"))
    if layout.sharded:
        # FSDP units: each encoder layer, and the root (the rest of the stage); every micro-batch gathers each
        # layer twice (forward, backward; once under ZeRO-2, which keeps it) and the root, which stays gathered,
        # once; gradients scatter once.
        per_layer = layer_elements(spec, layout) if layers else 0
        root = params - layers * per_layer
        each = 1 if layout.zero2 else 2
        gathers = m * (each * layers + 1)
        out.append(Collective("all_gather", "data", FLOAT * m * (each * layers * per_layer + root) / gathers, gathers,
                              layout.data, True, "FSDP parameter all-gathers"))
        out.append(Collective("reduce_scatter", "data", FLOAT * params / (layers + 1), layers + 1, layout.data,
                              True, "FSDP gradient reduce-scatters"))
    elif layout.data > 1:
        nbytes = FLOAT * params
        calls = max(1, -(-int(nbytes) // DDP_BUCKET_BYTES)) if backend == "torch_ddp" else 1
        out.append(Collective("all_reduce", "data", nbytes / calls, calls, layout.data, True, "gradient all-reduce"))
    return out


def _tensor_parallel(spec, layout: Layout, micro: int, layers: int, stage: int,
                     activation_value_bytes: int, device_kind: str) -> list[Collective]:
    """torch_3d's all-reduces over tp on one rank of `stage` (the BERT MLM's or the decoder LM's), one Collective
    per thing sent (all on the critical path); none of zero calls."""
    m, tp = layout.micro_batches, layout.tp
    hidden_states = micro * spec.seq_len * spec.hidden
    bert = isinstance(spec, BertSpec)
    # the positions the loss covers: the MLM head's gathered masked ones (padded), the decoder LM's every one
    positions = micro * (spec.max_predictions if bert else spec.seq_len)
    # The checkpointed layers' forward runs again in the backward, as far as the backward needs (non-reentrant
    # checkpoint stops there): the post-LN encoder's last all-reduce feeds its final norm, whose backward needs it;
    # the pre-norm decoder's block ends in a residual add that needs nothing, so its FFN's all-reduce is not redone.
    again = (TP_FORWARD_ALL_REDUCES if bert else TP_FORWARD_ALL_REDUCES - 1) if layout.recomputes else 0
    found = [
        Collective("all_reduce", "tp", activation_value_bytes * hidden_states,
                   m * layers * (TP_FORWARD_ALL_REDUCES + again), tp, True,
                   "tensor-parallel activations" + (" (the recomputed forward's too)" if layout.recomputes else "")),
        Collective("all_reduce", "tp", FLOAT * hidden_states, m * layers * TP_BACKWARD_ALL_REDUCES, tp, True,
                   "tensor-parallel input gradients")]
    if layout.vocab_split and stage == 0:    # DTensor's row-wise embedding: the partial look-ups summed
        found.append(Collective("all_reduce", "tp", FLOAT * hidden_states, m, tp, True,
                                "split embedding's partial sums"))
    if layout.vocab_split and stage == layout.pp - 1:
        head = activation_value_bytes if device_kind == "cpu" else FLOAT
        found += [Collective("all_reduce", "tp", FLOAT * positions, m * VOCAB_LOSS_FLOAT_ALL_REDUCES, tp, True,
                             "split loss's maximum, sum of exponentials and target logit"),
                  Collective("all_reduce", "tp", INDEX * positions, m, tp, True,
                             "split loss's index of the maximum (the correct count)"),
                  Collective("all_reduce", "tp", head * positions * spec.hidden, m, tp, True,
                             "split loss's gradient of the head's output")]
    return [c for c in found if c.calls]


def _exposed(c: Collective, seconds: float, fb_s: float, backend: str, hardware: Hardware) -> float:
    if not hardware.comm_overlaps_compute:
        return seconds
    if c.kind in ("all_gather", "reduce_scatter"):     # FSDP2 prefetch
        return max(seconds / c.calls, seconds - fb_s)
    if c.dim == "data" and backend == "torch_ddp":       # DDP buckets during the backward
        return max(seconds / c.calls, seconds - BACKWARD_SHARE * fb_s)
    return seconds


def _comm_s(c: Collective, hardware: Hardware, layout: Layout) -> float:
    if c.dim == "all":
        crosses = layout.devices > hardware.devices_per_node
    elif c.dim == "tie":  # between the first stage's rank and the last's
        crosses = group_stride(layout, "pp") * (layout.pp - 1) >= hardware.devices_per_node
    else:
        crosses = crosses_nodes(layout, c.dim, hardware.devices_per_node)
    return c.calls * cost_s(c.kind, c.nbytes, c.ranks, hardware.link(crosses))


def executed_stages(spec: BertSpec | CnnSpec, layout: Layout, global_batch: int, hardware: Hardware, basis: Basis,
                    backend: str = "torch_3d", background: float | None = None,
                    eval_batch: int | None = None, counted: list[Collective] | None = None) -> Stages:
    """`background`: other programs' runnable threads on a CPU host during the run (None: none, and the
    1-device run's background is not accounted either). `eval_batch`: the run also evaluates in batches of
    this many (its peak memory may be there); None: training only. `counted`: the collectives a compiler placed
    (keras_jax's GSPMD: a record's comm_per_step, as compiled), instead of the formulas; one stage only."""
    if not isinstance(basis, Basis):
        raise ValueError(f"{type(spec).__name__}: a compute table times a decoder's kernels; the executed workloads "
                         "are timed from a measured 1-device run or an assumed MFU (--from, --assume-mfu)")
    check_modelled(layout)
    m = layout.micro_batches
    micro = global_batch / (layout.data * m)
    contention = 1.0
    if hardware.device_kind == "cpu" and basis.cores and basis.threads_per_device:
        cores, threads = basis.cores, basis.threads_per_device
        ours, theirs = (0.0, 0.0) if background is None else (background, basis.background)
        contention = max(1.0, (layout.devices * threads + ours) / cores) / max(1.0, (threads + theirs) / cores)
        if layout.devices > 1:  # ranks side by side share the host's cache and memory bandwidth
            contention *= basis.co_run
    # The fixed cost per micro-batch (kernel launches, per-tensor work) goes with the layers: a stage pays its
    # share of the whole model's forward multiply-adds (tensor parallel launches every kernel still: no split).
    whole = sum(stage_macs(spec, Layout(tp=layout.tp, vocab_split=layout.vocab_split)))
    per_mac = basis.s_per_mac_sample
    if basis.recompute and not isinstance(spec, CnnSpec):  # its 1-device run recomputed its encoder layers' forward:
        one = parts(spec)                                   # of its time per multiply-add, the plain share
        again = one.layer if one.layer_recomputed is None else one.layer_recomputed
        per_mac *= one.total / (one.total + (1 - BACKWARD_SHARE) * one.layers * again)

    def stage_s(launched: float, computed: float) -> float:
        """launched: the multiply-adds the fixed cost goes with; computed: those the time per sample goes with."""
        return contention * (basis.s_per_micro_batch * launched / whole + per_mac * computed * micro)
    # --recompute runs each encoder layer's forward again in the backward: its forward share of forward+backward
    # (1 - BACKWARD_SHARE) more, costed as that many more multiply-adds (and their launches).
    launched = stage_macs(spec, layout)
    launched_again = [(1 - BACKWARD_SHARE) * r for r in stage_macs(spec, layout, True)]
    macs = rank_macs(spec, layout, basis.compute_shares)
    again = [(1 - BACKWARD_SHARE) * r for r in rank_macs(spec, layout, basis.compute_shares, True)]
    stage_comm = [counted] if counted is not None and layout.pp == 1 else \
        [collectives(spec, layout, global_batch, s, backend, value_bytes(basis.precision), hardware.device_kind)
         for s in range(layout.pp)]
    out = Stages(micro_batches=m, overhead=contention * basis.s_per_step, contention=contention,
                 # Interruptions (step.sync_factor): on a CPU host only, a GPU's queue of launched kernels runs on
                 # while its host thread is interrupted.
                 interruption_share=basis.interruption_share if hardware.device_kind == "cpu" else 0.0)
    for s, comms in enumerate(stage_comm):
        plain = stage_s(launched[s], macs[s])
        computed = stage_s(launched[s] + launched_again[s], macs[s] + again[s])
        # Communication inside the micro-batch loop (tp all-reduces, pipeline sends) sits in the stage's time;
        # what runs once per step (dp, FSDP, the tie) after it.
        inside = sum(_comm_s(c, hardware, layout) for c in comms if c.dim in ("tp", "pp")) / m
        after = sum(_exposed(c, _comm_s(c, hardware, layout), m * computed, backend, hardware)
                    for c in comms if c.dim not in ("tp", "pp"))
        updated = state_bytes(spec, layout, s * layout.data * layout.tp).params / FLOAT
        out.add(compute=computed, inside=inside, recompute=computed - plain, after_comm=after,
                optimizer=contention * basis.s_per_param * updated, collectives=comms)
    states, model, growth = counted_per_rank(spec, layout, micro, basis.precision, eval_batch, backend)
    overhead, training = basis.memory_overhead, basis.training_overhead  # the framework's, measured
    out.memory = {"state_per_rank": states, "model_per_rank": model, "training_model_per_rank": growth,
                  "memory_per_rank": [m + overhead for m in model] if overhead is not None else None,
                  "training_per_rank": [g + training for g in growth] if training is not None else None,
                  "memory_overhead": overhead, "training_overhead": training}
    if contention != 1:
        out.notes.append(f"contention: {layout.devices} ranks x {basis.threads_per_device} threads"
                         + (f" + {background:.1f} other runnable" if background else "")
                         + f" on {basis.cores} cores" + (f", side by side x{basis.co_run:.3f}" if basis.co_run != 1
                                                         else "") + f": compute x{contention:.2f}")
    if layout.tp > 1 and basis.compute_shares is None and not basis.assumed:
        out.notes.append(TP_UNPROFILED)
    return out


TP_UNPROFILED = ("tensor parallel: the 1-device run has no --profile, so its norms, dropouts and loss are taken to "
                 "divide as its matmuls do (they do not: predicted too fast)")


def memory_per_rank(spec: BertSpec | CnnSpec, layout: Layout, global_batch: int, precision: str | None,
                    backend: str = "torch_3d", eval_batch: int | None = None
                    ) -> tuple[list[StateBytes], list[float], list[float]]:
    """Per rank, before any run: its state, what the model counts of its process peak (no framework overhead)
    and of its training's growth; predict()'s memory without a time basis (a fit check before launch)."""
    check_modelled(layout)
    layout = layout.placed(spec, global_batch)
    micro = global_batch / (layout.data * layout.micro_batches)
    return counted_per_rank(spec, layout, micro, precision or "fp32", eval_batch, backend)
