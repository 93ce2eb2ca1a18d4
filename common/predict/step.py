"""One training step of a layout, predicted: time (compute, exposed communication, bubble, optimizer) and
memory per rank.

The collectives a layout issues, per step (checked against torch_3d's counted comm_per_step in
tests/test_predict.py):
  - data (no FSDP): one all-reduce of the rank's gradients over the data ranks (torch_3d: one flat buffer after the
    backward; torch_ddp: 25 MiB buckets during it). Ring cost 2(n-1)/n x gradient bytes.
  - FSDP/ZeRO-3 over dp: each layer unit all-gathered before its forward and again before its backward, the
    root unit once, and every unit's gradients reduce-scattered once: (n-1)/n x (2 x layers + root) bytes
    gathered + (n-1)/n x all bytes scattered, 1.5x data parallel's 2(n-1)/n when the root is small.
  - tp (Megatron): per micro-batch and layer, 2 all-reduces of b x s x h forward (attention output, FFN out)
    and TP_BACKWARD_ALL_REDUCES backward (DTensor reduces the input gradient of each column-parallel module:
    Q, K, V and FFN-in separately); with a split vocabulary also the embedding's partial sums.
  - pp: per micro-batch and stage boundary b x s x h sent forward and its gradient backward (each rank sends
    one and receives the other per boundary: 2 transfers per micro-batch and boundary); the tied token
    embedding's gradient all-reduced between the first and last stage once per step.
keras_jax's collectives are XLA's (GSPMD places, fuses and combines them): they come as compiled, from a run's
comm_per_step, costed over all its devices and exposed (an assumption).
Overlap, per backend and layout (the rest is on the critical path):
  - torch_3d: everything exposed, except FSDP's gathers and scatters on hardware whose collectives run beside
    compute (a GPU's own stream; FSDP2 prefetches the next unit): there only what exceeds the compute, or at
    least one unit's gather and scatter, is exposed. Its dp all-reduce runs after the backward by design.
  - torch_ddp: bucketed all-reduces overlap the backward (2/3 of forward+backward) where collectives run beside
    compute; at least the last bucket is exposed. On a CPU gloo's ring runs on the cores that compute:
    exposed (an assumption the validation checks).
Pipeline: with per-micro-batch stage times e_s (compute, its tensor-parallel all-reduces, its sends), GPipe
and 1F1B both take sum_s e_s + (m - 1) max_s e_s (the bubble (p-1)/(m+p-1) of the step when stages are equal);
a stage idles that time less m e_s. A stage's fixed cost per micro-batch (basis.s_per_micro_batch: launches,
per-tensor work) is its share of the model's multiply-adds of that cost (an assumption: it goes with the layers).
Synchronisation on a CPU host: every rank loses the share of its step the 1-device run lost to interruptions
(other threads, the kernel: in its median already); ranks that synchronise also wait for each other's,
sync_factor(layout) - 1 more (tensor parallel and FSDP every layer: the group size; a data-parallel all-reduce
once a step: the longest of dp, H_dp). Checked at 2 and 4 ranks on one host; on a GPU the queue of launched
kernels runs on through its host thread's interruptions, and the term is left out.
CPU contention: a thread gets cores / max(cores, runnable threads) of a core, runnable threads being the ranks'
(ranks x threads per device) plus, with `background`, other programs' (common.predict.basis.background_load);
compute stretches by the 1-device run's share over this run's, and where ranks run side by side by the co-run
probe's slowdown (basis.co_run: the 1-device command run as that many processes at once, bench.co_run).
"""
from __future__ import annotations

from common.layout import Layout
from common.predict.basis import Basis
from common.predict.collectives import Collective, cost_s, crosses_nodes, group_stride
from common.predict.hardware import Hardware, Link
from common.predict.memory import (
    FLOAT,
    activation_bytes,
    evaluation_bytes,
    layer_elements,
    stage_params,
    state_bytes,
    transient_bytes,
    value_bytes,
)
from common.predict.prediction import Prediction
from common.predict.work import parts, rank_macs, recomputed_macs, stage_layer_counts, stage_macs
from common.sections import StateBytes
from common.spec import BertSpec, CnnSpec

TP_FORWARD_ALL_REDUCES = 2
TP_BACKWARD_ALL_REDUCES = 4
DDP_BUCKET_BYTES = 25 * 2**20
BACKWARD_SHARE = 2 / 3   # backward = 2x forward in multiply-adds


# What this model of the executed workloads models: what torch_3d executes, whose collectives it counts.
MODELLED = frozenset({"tp", "pp", "fsdp", "micro_batches", "1f1b", "recompute", "vocab_split", "stage_split"})


def check_modelled(layout: Layout) -> None:
    """ValueError in one line for a layout option this model cannot cost (its collectives are torch_3d's)."""
    for feature, flag in layout.features():
        if feature not in MODELLED:
            raise ValueError(f"{layout.name}: {flag} is not modelled for the executed workloads (their step model "
                             "counts what torch_3d executes); the decoders' model does (bench.predict --model)")


def sync_factor(layout: Layout) -> float:
    """How many ranks' interruptions a rank of the layout waits for, in units of its own. Ranks that synchronise
    many times a step (tensor parallel's all-reduces and FSDP's gathers, every layer) wait for each of their
    group's interruptions in turn: the group size. Ranks that meet once a step (a data-parallel all-reduce)
    wait for the longest of theirs: for exponentially distributed interruptions E[max of n] / E[one] = H_n, the
    n-th harmonic number. Pipeline stages wait for each other through point-to-point sends with the bubble's
    slack: not counted."""
    harmonic = sum(1 / k for k in range(1, layout.data + 1))
    return layout.tp * (layout.data if layout.sharded else harmonic)


def pipeline_s(per_micro_batch: list[float], micro_batches: int) -> float:
    """Forward+backward of m micro-batches through stages taking e_s each (GPipe and 1F1B alike):
    sum_s e_s + (m - 1) max_s e_s; with p equal stages (m + p - 1) e, whose idle share is (p-1)/(m+p-1)."""
    return sum(per_micro_batch) + (micro_batches - 1) * max(per_micro_batch)


def _link(hardware: Hardware, layout: Layout, dim: str) -> Link:
    return hardware.link(crosses_nodes(layout, dim, hardware.devices_per_node))


def collectives(spec: BertSpec | CnnSpec, layout: Layout, global_batch: int, stage: int, backend: str,
                stage_split: list[int] | None = None, activation_value_bytes: int = FLOAT) -> list[Collective]:
    """What one rank of `stage` issues per step. Activations travel at the run's precision
    (`activation_value_bytes`: bf16 under autocast), gradients and parameters as float32 (torch's amp keeps
    both in float32)."""
    micro = global_batch // (layout.data * layout.micro_batches)
    out: list[Collective] = []
    params = stage_params(spec, layout, stage, stage_split)
    if isinstance(spec, BertSpec):
        layers = stage_layer_counts(layout, spec.layers, stage_split)[stage]
        activation = activation_value_bytes * micro * spec.seq_len * spec.hidden
        m = layout.micro_batches
        if layout.tp > 1:
            calls = m * layers * (TP_FORWARD_ALL_REDUCES + TP_BACKWARD_ALL_REDUCES)
            if layout.vocab_split and stage == 0:
                calls += m
            out.append(Collective("all_reduce", "tp", activation, calls, layout.tp, True,
                                  "tensor-parallel activations"))
        if layout.pp > 1:
            # Per micro-batch and boundary the activation crosses forward and its gradient backward: a rank
            # sends one and receives the other (CommCounter counts both).
            boundaries = (stage > 0) + (stage < layout.pp - 1)
            out.append(Collective("send_recv", "pp", activation, 2 * m * boundaries, 2, True,
                                  "pipeline activations and their gradients"))
            if stage in (0, layout.pp - 1):
                rows = spec.vocab_size // (layout.tp if layout.vocab_split else 1)
                out.append(Collective("all_reduce", "tie", FLOAT * rows * spec.hidden, 1, 2, True,
                                      "tied embedding gradient"))
    if layout.sharded:
        # FSDP units: each encoder layer, and the root (the rest of the stage); every micro-batch gathers each
        # layer twice (forward, backward) and the root, which stays gathered, once; gradients scatter once.
        units = stage_layer_counts(layout, spec.layers, stage_split)[stage] if isinstance(spec, BertSpec) else 0
        per_layer = layer_elements(spec, layout) if units else 0
        root = params - units * per_layer
        m = layout.micro_batches
        gathers = m * (2 * units + 1)
        out.append(Collective("all_gather", "data", FLOAT * m * (2 * units * per_layer + root) / gathers, gathers,
                              layout.data, True, "FSDP parameter all-gathers"))
        out.append(Collective("reduce_scatter", "data", FLOAT * params / (units + 1), units + 1, layout.data, True,
                              "FSDP gradient reduce-scatters"))
    elif layout.data > 1:
        nbytes = FLOAT * params
        calls = max(1, -(-int(nbytes) // DDP_BUCKET_BYTES)) if backend == "torch_ddp" else 1
        out.append(Collective("all_reduce", "data", nbytes / calls, calls, layout.data, True, "gradient all-reduce"))
    return out


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
        return c.calls * cost_s(c.kind, c.nbytes, c.ranks, hardware.link(layout.devices > hardware.devices_per_node))
    if c.dim == "tie":
        stride = group_stride(layout, "pp") * (layout.pp - 1)
        link = hardware.link(stride >= hardware.devices_per_node)
    else:
        link = _link(hardware, layout, c.dim)
    return c.calls * cost_s(c.kind, c.nbytes, c.ranks, link)


def _memory(spec: BertSpec | CnnSpec, layout: Layout, micro: float, precision: str, stage_split: list[int] | None,
            eval_batch: int | None, backend: str) -> tuple[list[StateBytes], list[float], list[float]]:
    """Per rank: its state, what the model counts of its process peak (state + the larger of training's and
    evaluation's live values) and of its training's growth over the start (gradients, optimizer state and
    training's live values: the weights were there before); the framework's overhead comes on top."""
    states, model, growth = [], [], []
    for rank in range(layout.devices):
        stage = layout.coordinates(rank)["pp"]
        state = state_bytes(spec, layout, rank, stage_split, backend)
        training_live = activation_bytes(spec, layout, stage, int(micro), stage_split,
                                         value_bytes(precision)) + \
            transient_bytes(spec, layout, stage, stage_split)
        evaluation = evaluation_bytes(spec, layout, stage, eval_batch) if eval_batch else 0.0
        states.append(state)
        model.append(state.total + max(training_live, evaluation))
        growth.append(state.grads + state.optimizer + training_live)
    return states, model, growth


def predict(spec: BertSpec | CnnSpec, layout: Layout, global_batch: int, basis: Basis, hardware: Hardware,
            backend: str = "torch_3d", stage_split: list[int] | None = None, background: float | None = None,
            eval_batch: int | None = None, counted: list[Collective] | None = None) -> Prediction:
    """`background`: other programs' runnable threads on a CPU host during the run (None: none, and the
    1-device run's background is not accounted either). `eval_batch`: the run also evaluates in batches of
    this many (its peak memory may be there); None: training only. `counted`: the collectives a compiler placed
    (keras_jax's GSPMD: a record's comm_per_step, as compiled), instead of the formulas; one stage only."""
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
    per_mac = basis.s_per_mac_sample * plain_share(spec, basis)

    def stage_s(launched: float, computed: float) -> float:
        """launched: the multiply-adds the fixed cost goes with; computed: those the time per sample goes with."""
        return contention * (basis.s_per_micro_batch * launched / whole + per_mac * computed * micro)
    # --recompute runs each encoder layer's forward again in the backward: its forward share of forward+backward
    # (1 - BACKWARD_SHARE) more, costed as that many more multiply-adds (and their launches).
    launched = stage_macs(spec, layout, stage_split)
    launched_again = [(1 - BACKWARD_SHARE) * r for r in recomputed_macs(spec, layout, stage_split)]
    macs = rank_macs(spec, layout, basis.compute_shares, stage_split)
    again = [(1 - BACKWARD_SHARE) * r for r in rank_macs(spec, layout, basis.compute_shares, stage_split, True)]
    per_micro = [stage_s(k + ka, w + r) for k, ka, w, r in zip(launched, launched_again, macs, again)]
    recompute = [stage_s(k + ka, w + r) - stage_s(k, w) for k, ka, w, r in zip(launched, launched_again, macs, again)]
    stage_comm = [counted] if counted is not None and layout.pp == 1 else \
        [collectives(spec, layout, global_batch, s, backend, stage_split, value_bytes(basis.precision))
         for s in range(layout.pp)]
    # Communication inside the micro-batch loop (tp all-reduces, pipeline sends) sits in the stage's time;
    # what runs once per step (dp, FSDP, the tie) after it.
    inside = [sum(_comm_s(c, hardware, layout) for c in comms if c.dim in ("tp", "pp")) / m for comms in stage_comm]
    e = [p + c for p, c in zip(per_micro, inside)]
    pipe = pipeline_s(e, m)
    busiest = max(range(layout.pp), key=lambda s: e[s])
    after, optimizer, all_comms = [], [], []
    for s, comms in enumerate(stage_comm):
        fb_s = m * per_micro[s]
        after.append(sum(_exposed(c, _comm_s(c, hardware, layout), fb_s, backend, hardware)
                         for c in comms if c.dim not in ("tp", "pp")))
        optimizer.append(contention * basis.s_per_param * state_bytes(spec, layout, s * layout.data * layout.tp,
                                                                       stage_split).params / FLOAT)
        all_comms += comms
    tail = max(a + o for a, o in zip(after, optimizer))
    overhead = contention * basis.s_per_step
    alone = overhead + pipe + tail
    # Interruptions: the 1-device median holds a rank's own; synchronised ranks also wait for the others'. On a
    # CPU host only: a GPU's queue of launched kernels runs on while its host thread is interrupted.
    interrupted = basis.interruption_share if hardware.device_kind == "cpu" else 0.0
    sync_wait = interrupted * alone * (sync_factor(layout) - 1)
    step = alone + sync_wait
    compute = m * per_micro[busiest]
    comm_inside = m * inside[busiest]
    bubble = pipe - m * e[busiest] if layout.pp > 1 else 0.0
    idle = [(pipe - m * e[s]) / (pipe + max(after)) for s in range(layout.pp)] if layout.pp > 1 else None
    states, model, growth = _memory(spec, layout, micro, basis.precision, stage_split, eval_batch, backend)
    memory = [m + basis.memory_overhead for m in model] if basis.memory_overhead is not None else []
    training = [g + basis.training_overhead for g in growth] if basis.training_overhead is not None else []
    notes = [f"contention: {layout.devices} ranks x {basis.threads_per_device} threads"
             + (f" + {background:.1f} other runnable" if background else "")
             + f" on {basis.cores} cores" + (f", side by side x{basis.co_run:.3f}" if basis.co_run != 1 else "")
             + f": compute x{contention:.2f}"] if contention != 1 else []
    if layout.tp > 1 and basis.compute_shares is None and not basis.assumed:
        notes.append(TP_UNPROFILED)
    return Prediction(layout=layout, devices=layout.devices, global_batch=global_batch, step_s=step,
                      compute_s=compute, comm_exposed_s=comm_inside + max(after), bubble_s=bubble,
                      optimizer_s=max(optimizer), overhead_s=overhead, sync_wait_s=sync_wait, idle_per_stage=idle,
                      state_per_rank=states,
                      memory_per_rank=memory or None, training_per_rank=training or None, model_per_rank=model,
                      collectives=all_comms, collectives_of_rank0=stage_comm[0], training_model_per_rank=growth,
                      memory_overhead=basis.memory_overhead, training_overhead=basis.training_overhead,
                      contention=contention, notes=notes, recompute_s=m * recompute[busiest])


TP_UNPROFILED = ("tensor parallel: the 1-device run has no --profile, so its norms, dropouts and loss are taken to "
                 "divide as its matmuls do (they do not: predicted too fast)")


def plain_share(spec: BertSpec | CnnSpec, basis: Basis) -> float:
    """The share of a basis's time per multiply-add that is the plain forward+backward: all of it, except for a
    basis measured with --recompute, whose 1-device run also recomputed its encoder layers' forward."""
    if not basis.recompute or isinstance(spec, CnnSpec):
        return 1.0
    whole = parts(spec)
    return whole.total / (whole.total + (1 - BACKWARD_SHARE) * whole.layers * whole.layer)


def memory_per_rank(spec: BertSpec | CnnSpec, layout: Layout, global_batch: int, precision: str | None,
                    backend: str = "torch_3d", stage_split: list[int] | None = None, eval_batch: int | None = None
                    ) -> tuple[list[StateBytes], list[float], list[float]]:
    """Per rank, before any run: its state, what the model counts of its process peak (no framework overhead)
    and of its training's growth; predict()'s memory without a time basis (a fit check before launch)."""
    check_modelled(layout)
    micro = global_batch / (layout.data * layout.micro_batches)
    return _memory(spec, layout, micro, precision or "fp32", stage_split, eval_batch, backend)
