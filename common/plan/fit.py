"""Will a run fit its devices? Its memory per device predicted before anything starts (common.predict.memory) held
against the device's limit, allowing for the model's measured memory error (docs/plan.md, "The fit check")."""
from __future__ import annotations

from common.errors import BadInput
from common.layout import Layout
from common.predict.basis import from_records, record_layout
from common.predict.executed import memory_per_rank
from common.sections import FitCheck
from common.spec import BertSpec, CnnSpec, model_spec
from common.stage_split import layers_per_stage

GIB = 2**30
# The backends whose memory the model describes (bench.predict --validate holds it against their records).
MODELLED_BACKENDS = ("torch_3d", "torch_ddp", "keras_jax")


class DoesNotFit(BadInput):
    """A run predicted not to fit its devices: bad input (exit 2, one line) for bench.run, an `invalid` record
    carrying `check` for bench.compare."""

    def __init__(self, message: str, check: FitCheck):
        super().__init__(message)
        self.check = check


def error_allowed(error: float | None) -> float:
    """The memory error e a verdict allows for: |error|, kept below 1 (P / (1 - e) must stay a bound)."""
    return min(abs(error or 0.0), 0.99)


def verdict(predicted: float, available: float | None, error: float | None) -> str:
    if available is None:
        return "not checked"
    e = error_allowed(error)
    if predicted / (1 + e) > available:
        return "does not fit"
    return "fits" if predicted / (1 - e) <= available else "may not fit"


def memory_limit(hardware, memory_gib: float | None) -> tuple[float, str]:
    """(bytes a plan's device may hold, what says so): --memory-per-device where given, else the hardware's."""
    if memory_gib:
        return memory_gib * GIB, f"--memory-per-device {memory_gib:g} GiB"
    return hardware.memory_bytes, f"{hardware.name}'s memory"


def stage_split_of(spec: BertSpec | CnnSpec, layout: Layout, global_batch: int) -> list[int] | None:
    """Layers per stage as torch_3d places them (--stage-split even, auto or counts); None: no pipeline."""
    if layout.pp == 1 or isinstance(spec, CnnSpec):
        return None
    return layers_per_stage(layout.stage_split, spec, layout.pp, global_batch // layout.data)


def measured_overhead(spec: BertSpec | CnnSpec, records: list[dict], backend: str, workload: str,
                      precision: str, device_kind: str, host: str | None) -> tuple[float, str] | None:
    """The framework's memory overhead (the process peak beyond what the model counts) and the run id of the latest
    matching ok 1-device run among `records`; None when there is none."""
    found = [r for r in records if r.get("status") == "ok" and r.get("devices") == 1 and r.get("backend") == backend
             and r.get("workload") == workload and r.get("device_kind") == device_kind
             and (r.get("host") or {}).get("name") == host and (r.get("step_time_s") or {}).get("p50")
             and ((r.get("config") or {}).get("precision") or "fp32") == precision
             and (workload == "cnn" or _size_name(r) == spec.name)
             and not record_layout(r).recomputes]
    for record in reversed(sorted(found, key=lambda r: r.get("started_at") or "")):
        overhead = from_records(spec, [record]).memory_overhead
        if overhead is not None:
            return overhead, record["run_id"]
    return None


def _size_name(record: dict) -> str:
    """The model name of a record's size (the MLM's "tiny", the decoder LM's "llama-tiny")."""
    return model_spec(record["workload"], (record.get("config") or {}).get("model_size") or "tiny").name


def predicted_check(spec: BertSpec | CnnSpec, layout: Layout, global_batch: int, backend: str, precision: str,
                    eval_batch: int | None, available: float | None, limit: str,
                    overhead: tuple[float, str] | None = None, error: float | None = None) -> FitCheck:
    """The fit check of one planned run: per rank the predicted peak (the model's count, plus the measured
    overhead where known), against `available` bytes per device (None: no limit known)."""
    available_bytes = None if available is None else int(available)
    if backend not in MODELLED_BACKENDS:
        return FitCheck(None, available_bytes, limit, "not checked",
                        f"not predicted: the memory model describes {', '.join(MODELLED_BACKENDS)}, not {backend}")
    try:
        _, model, _ = memory_per_rank(spec, layout, global_batch, precision, backend, eval_batch)
    except ValueError as exc:
        return FitCheck(None, available_bytes, limit, "not checked", f"not predicted: {exc}")
    counts = "state + activations + buffers" + (" + the evaluation's live values" if eval_batch else "")
    counts += (f" + the framework's overhead {overhead[0] / 2**20:,.0f} MiB measured by 1-device run {overhead[1]}"
               if overhead is not None else " (no framework overhead: no 1-device run measured it; a lower bound)")
    per_rank = [int(m + (overhead[0] if overhead else 0.0)) for m in model]
    return FitCheck(per_rank, available_bytes, limit, verdict(max(per_rank), available, error), counts, error)


def refusal(check: FitCheck, layout: Layout) -> str:
    """The one line a refused run gets: predicted against available, and how to run it anyway."""
    worst = max(check.predicted_per_rank or [0])
    rank = (check.predicted_per_rank or [0]).index(worst)
    allowance = f" (beyond the model's measured memory error {check.error:.0%})" if check.error else ""
    return (f"{layout.name} is predicted not to fit: rank {rank} needs {worst / GIB:.3f} GiB, {check.limit} allows "
            f"{check.available_bytes / GIB:.3f} GiB per device{allowance}; counted: {check.counts}; "
            "--no-fit-check runs it anyway")
