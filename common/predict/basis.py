"""What a prediction's compute rests on: measured 1-device records, or an MFU the user states (from_mfu: the one
assumed-MFU rule). docs/prediction.md, "Compute"."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from common.config_key import record_layout
from common.peak_flops import PRECISION_MATH, peak_flops
from common.predict.hardware import GB, Hardware
from common.predict.memory import counted_per_rank
from common.predict.work import ComputeShares, parts
from common.sections import Breakdown, CoRun, StateBytesPerRank
from common.spec import DEFAULTS, BertSpec, CnnSpec

ADAMW_BYTES_PER_ELEMENT = 28
TRAINING_FLOPS_PER_MAC = 6


@dataclass(frozen=True)
class Basis:
    s_per_mac_sample: float        # forward+backward seconds per forward multiply-add of one sample
    s_per_micro_batch: float       # fixed forward+backward cost per micro-batch
    s_per_param: float             # optimizer seconds per parameter element a rank updates
    s_per_step: float              # data, Python and the rest, per step
    memory_overhead: float | None  # process peak beyond state + activations (bytes)
    training_overhead: float | None  # the training's own memory beyond state + activations (bytes)
    threads_per_device: int | None
    cores: int | None
    label: str                     # what the compute rests on, for every table and figure
    background: float = 0.0        # runnable threads of other programs while the 1-device run ran (CPU)
    precision: str = "fp32"        # --precision: activations take 2 bytes a value under amp/fp16
    record_ids: tuple[str, ...] = ()
    interruption_share: float = 0.0  # share of a 1-device step lost to interruptions (interruption_share())
    guesses: tuple[str, ...] = ()  # what the model needed and the records lacked, taken as a guess instead
    recompute: bool = False        # measured with --recompute: its time per multiply-add holds the recomputation
    co_run: float = 1.0            # compute of ranks side by side on a CPU host over one alone (co_run_slowdown())
    compute_shares: ComputeShares | None = None  # how tensor parallelism divides its compute (--profile)
    flops_per_s: float | None = None  # an assumed MFU's rate: every FLOP at mfu x a peak (from_mfu)

    @property
    def assumed(self) -> bool:
        return not self.record_ids


# What a basis without a --breakdown-steps probe guesses, and how to measure it instead.
UNPROBED = ("{run_id} has no --breakdown-steps probe: its whole step is taken as forward+backward (no optimizer, "
            "data or rest share)")
MEASURE_THE_SPLIT = ("for the measured split, run the 1-device references with --breakdown-steps 2 (bench.run or "
                     "bench.compare, as docs/prediction.md's validation recipe does)")


def background_load(record: dict) -> float:
    """Other programs' demand (busy cores) during a CPU run: load.other_busy_cores (common.hostinfo.load_over),
    else, in older records, the 1-minute load average after it less the run's own threads (docs/prediction.md,
    "Contention on a CPU host")."""
    load = record.get("load") or {}
    if record.get("device_kind") != "cpu":
        return 0.0
    if load.get("other_busy_cores") is not None:
        return float(load["other_busy_cores"])
    own = (record.get("devices") or 1) * (record.get("threads_per_device") or 1)
    return max(0.0, float(load.get("loadavg_1m_after") or 0.0) - own)  # none measured: none counted


def interruption_share(record: dict) -> float:
    """The share of a step that a 1-device run lost to interruptions (0 with fewer than 5 steps): docs/prediction.md,
    "Synchronisation on a CPU host"."""
    times = [t for t in record.get("step_times_s") or [] if t]
    if len(times) < 5:
        return 0.0
    mean = sum(times) / len(times)
    return (mean - min(times)) / mean


def co_run_slowdown(references: list[dict], repeats: list[dict] = ()) -> tuple[float, str | None]:
    """How much ranks side by side on a CPU host slow each other's compute, from the co-run probes the records
    carry (bench.co_run), and the probes' run ids; (1.0, None) where none carries one. `repeats`: the main
    reference's repeats in its sweep (itself among them). How probes pool: docs/prediction.md, "Contention on a
    CPU host"."""
    own = {r["run_id"]: probe for r in repeats if (probe := CoRun.from_record(r)) is not None}
    if own and len(repeats) > 1:
        copies = [s for probe in own.values() for s in probe.step_s_p50]
        alone = statistics.median(r["step_time_s"]["p50"] for r in repeats)
        return statistics.median(copies) / alone, ", ".join(own)
    probes = {r["run_id"]: probe for r in [*references, *repeats] if (probe := CoRun.from_record(r)) is not None}
    if not probes:
        return 1.0, None
    return statistics.median(probe.slowdown for probe in probes.values()), ", ".join(probes)


def accumulation(record: dict) -> int:
    return record_layout(record).accumulation((record.get("config") or {}).get("grad_accum") or 1)


def stage_split(record: dict) -> list[int] | None:
    """Encoder layers per pipeline stage as a run placed them: layout.layers_per_stage where torch_3d records
    it, else a layout.stage_split of counts ("3,1" or [3, 1]); None: the even split."""
    layout = record.get("layout") or {}
    split = layout.get("layers_per_stage") or layout.get("stage_split")
    if isinstance(split, str) and split.replace(",", "").isdigit():
        split = split.split(",")
    return [int(n) for n in split] if isinstance(split, list) else None


def _probe(record: dict) -> Breakdown | None:
    """A 1-device run's measured split of its step (--breakdown-steps), if it has one."""
    b = Breakdown.from_metrics(record.get("backend_metrics"))
    return b if b is not None and b.total_s else None


def _shares(record: dict) -> tuple[float, float, float]:
    """(forward+backward, optimizer, rest) shares of a 1-device step from its breakdown probe; without one, the
    whole step as forward+backward (a guess: from_records names it in the basis)."""
    b = _probe(record)
    if b is None:
        return 1.0, 0.0, 0.0
    return b.forward_backward_s / b.total_s, b.optimizer_s / b.total_s, \
        (b.data_s + b.other_s + b.grad_comm_s) / b.total_s


def eval_batch(record: dict) -> int | None:
    """The largest evaluation batch a rank of the run took (common.loop's batches of its workload's eval_batch over
    its data rank's shard of --eval-samples' samples), where its peak may be; None: it did not evaluate
    (--skip-eval)."""
    if (record.get("config") or {}).get("skip_eval"):
        return None
    samples = (record.get("eval") or {}).get("samples_evaluated")
    data = record_layout(record).data if record.get("layout") else 1
    batch = DEFAULTS[record["workload"]].eval_batch
    return min(batch, -(-samples // data)) if samples else batch


def measured_memory(record: dict, which: str) -> list[float | None]:
    """Per process, a record's memory figure: `process_peak_per_rank` (record["memory"], else the older
    peak_memory_per_rank) or `training_per_rank` (record["memory"] only). A process that drives several
    devices (tf_mirrored, keras_jax in one process) has one figure for all of them."""
    values = (record.get("memory") or {}).get(which)
    if values is None and which == "process_peak_per_rank":
        values = record.get("peak_memory_per_rank") or [record.get("peak_memory_bytes")]
    return list(values or [None])


def per_process(per_device: list[float], processes: int, overhead: float) -> list[float]:
    """Per-device predictions gathered into `processes` processes of consecutive ranks, each with the
    framework's overhead once."""
    k = max(1, len(per_device) // max(processes, 1))
    return [overhead + sum(per_device[i:i + k]) for i in range(0, len(per_device), k)]


def _counted_memory(spec, record: dict) -> tuple[float, float]:
    """What the model counts of a 1-device run's memory: its process peak and its training's growth."""
    _, model, growth = counted_per_rank(spec, record_layout(record), record["global_batch"] // accumulation(record),
                                        (record.get("config") or {}).get("precision"),
                                        eval_batch(record), record["backend"])
    return model[0], growth[0]


def from_records(spec: BertSpec | CnnSpec, records: list[dict], co_run_from: list[dict] = ()) -> Basis:
    """The basis of one or more ok 1-device records of one backend, workload and size (several: different
    micro-batch counts of one global batch, for the per-micro-batch cost). The first is the main one.
    `co_run_from`: the main one's repeats, whichever of them carries the sweep's co-run probe."""
    main = records[0]
    macs = parts(spec).total
    points = []
    for r in records:
        fb, _, _ = _shares(r)
        points.append((accumulation(r), r["global_batch"], fb * r["step_time_s"]["p50"]))
    per_micro = 0.0
    two = [(k, fb) for k, b, fb in points if b == main["global_batch"]]
    if len({k for k, _ in two}) >= 2:
        (k1, f1), (k2, f2) = min(two), max(two)
        per_micro = max(0.0, (f2 - f1) / (k2 - k1))
    k, batch, fb = points[0]
    per_mac = max(fb - k * per_micro, 0.0) / (batch * macs)
    _, opt, rest = _shares(main)
    step = main["step_time_s"]["p50"]
    state = StateBytesPerRank.from_metrics(main.get("backend_metrics"))
    elements = (state.ranks[0].params // 4) if state else spec.param_count()
    peak = measured_memory(main, "process_peak_per_rank")[0]
    training = measured_memory(main, "training_per_rank")[0]
    counted, counted_training = _counted_memory(spec, main)
    ids = tuple(r["run_id"] for r in records)
    label = (f"compute measured: {main['backend']} 1-device run {main['run_id']} "
             f"({main.get('devices_description') or main.get('device_kind')})")
    if per_micro:
        label += f", per-micro-batch cost from {', '.join(ids[1:])}"
    co_run, co_run_id = co_run_slowdown(records, co_run_from)
    if co_run_id:
        label += f", side by side x{co_run:.3f} (co-run probe{'s' if ', ' in co_run_id else ''} of {co_run_id})"
    shares = ComputeShares.from_record(main)
    if shares:
        label += f", matmuls {shares.matmul:.0%} of its compute (profile)"
    guesses = tuple(UNPROBED.format(run_id=r["run_id"]) for r in records if _probe(r) is None)
    if guesses:
        label += "; GUESSED: no --breakdown-steps probe, the whole step taken as forward+backward"
    return Basis(s_per_mac_sample=per_mac, s_per_micro_batch=per_micro, s_per_param=opt * step / elements,
                 s_per_step=rest * step, memory_overhead=peak - counted if peak else None,
                 training_overhead=training - counted_training if training else None,
                 threads_per_device=main.get("threads_per_device"), cores=(main.get("host") or {}).get("cores"),
                 label=label, record_ids=ids, background=background_load(main),
                 interruption_share=interruption_share(main), recompute=record_layout(main).recomputes,
                 precision=(main.get("config") or {}).get("precision") or "fp32", guesses=guesses, co_run=co_run,
                 compute_shares=shares)


def from_mfu(mfu: float, hardware: Hardware, precision: str = "fp32", achievable: float | None = None) -> Basis:
    """Compute at `mfu` of a peak: `achievable` (FLOP/s a run's achievable_peak measured on this hardware), else
    the hardware file's achievable_TFLOPS, else the datasheet's (common.peak_flops)."""
    math = PRECISION_MATH.get(precision, precision)
    if achievable:
        peak, what = achievable, "measured achievable peak"
    elif math in hardware.achievable_tflops:
        peak, what = hardware.achievable_tflops[math] * 1e12, "achievable peak (hardware file)"
    else:
        peak, what = peak_flops(hardware.device_name, math), "datasheet peak"
    if peak is None:
        raise ValueError(f"--assume-mfu: no {math} peak is known for {hardware.device_name or hardware.name!r} "
                         "(common.peak_flops, or achievable_TFLOPS in the hardware file)")
    opt = ADAMW_BYTES_PER_ELEMENT / (hardware.memory_GBps * GB) if hardware.memory_GBps else 0.0
    return Basis(s_per_mac_sample=TRAINING_FLOPS_PER_MAC / (mfu * peak), s_per_micro_batch=0.0, s_per_param=opt,
                 flops_per_s=mfu * peak,
                 s_per_step=0.0, memory_overhead=0.0, training_overhead=None, threads_per_device=None, cores=None,
                 label=f"compute ASSUMED: MFU {mfu:g} of {hardware.name}'s {math} {what} "
                       f"{peak / 1e12:g} TFLOP/s (no measured record)", precision=precision)
