"""The typed sections of a record's `backend_metrics`: what each holds, how it is written and read back.

Trainers write these, the report, parity, calibrate and the record's own fields read them; each section
is declared once here, with its key in `backend_metrics`, so that a writer and a reader cannot drift
apart, and common.results.validate_record checks every section a record carries. The JSON is the plain
dataclass (units in the field names); a record written before a field existed reads it as None.
Strategy-specific diagnostics (tf_mode, phase_s_per_step, ...) stay plain keys.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import ClassVar

COMM_KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "send_recv")
STATE_PARTS = ("params", "grads", "optimizer")
FP32_MATH = ("fp32", "tf32")


class Section:
    """One section: `key` in backend_metrics; to_metrics() writes it, from_metrics() reads it (None if absent)."""
    key: ClassVar[str]

    def to_metrics(self) -> dict:
        return {self.key: self._value()}

    def _value(self):
        return asdict(self)

    @classmethod
    def from_metrics(cls, metrics: dict | None):
        """The section in a record's backend_metrics; None when it is absent."""
        raw = (metrics or {}).get(cls.key)
        return None if raw is None else cls.from_value(raw)

    @classmethod
    def from_value(cls, raw):
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    @classmethod
    def problems(cls, raw) -> list[str]:
        """What is wrong with the section's JSON; empty when it reads."""
        try:
            cls.from_value(raw)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            return [f"backend_metrics.{cls.key}: {exc}"]
        return []


@dataclass(frozen=True)
class TrainableParams(Section):
    """The trainable parameters the framework's model holds, counted by the framework (held against the spec)."""
    key: ClassVar[str] = "trainable_params"
    count: int

    def _value(self):
        return int(self.count)

    @classmethod
    def from_value(cls, raw):
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise TypeError(f"expected an integer, got {raw!r}")
        return cls(raw)


@dataclass(frozen=True)
class Fp32Math(Section):
    """What float32 matmuls run as: plain float32, or TF32 on tensor cores (the MFU's peak follows it)."""
    key: ClassVar[str] = "fp32_math"
    mode: str = "fp32"

    def _value(self):
        return self.mode

    @classmethod
    def from_value(cls, raw):
        if raw not in FP32_MATH:
            raise ValueError(f"expected one of {FP32_MATH}, got {raw!r}")
        return cls(raw)


@dataclass(frozen=True)
class StateBytes:
    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


@dataclass(frozen=True)
class StateBytesPerRank(Section):
    """Parameters, gradients and optimizer state each rank holds, counted from its shards (bytes)."""
    key: ClassVar[str] = "state_bytes_per_rank"
    ranks: list[StateBytes]

    def _value(self):
        return [asdict(r) for r in self.ranks]

    @classmethod
    def from_value(cls, raw):
        return cls([StateBytes(**{p: int(r.get(p) or 0) for p in STATE_PARTS}) for r in raw])


@dataclass(frozen=True)
class Collective:
    bytes: int
    calls: int
    time_s: float | None  # None: counted, not timed (point-to-point)


@dataclass(frozen=True)
class CommPerStep(Section):
    """Per rank, per kind of collective (COMM_KINDS), what one step issues: bytes, calls and time."""
    key: ClassVar[str] = "comm_per_step"
    ranks: list[dict[str, Collective] | None]

    def _value(self):
        return [None if r is None else {k: asdict(c) for k, c in r.items()} for r in self.ranks]

    @classmethod
    def from_value(cls, raw):
        return cls([None if r is None else {k: Collective(**c) for k, c in r.items()} for r in raw])

    def bytes_of(self, rank: int, kind: str) -> int:
        step = self.ranks[rank] or {}
        return step[kind].bytes if kind in step else 0


@dataclass(frozen=True)
class Bubble(Section):
    """A pipeline's idle share of a step: analytic (pp-1)/(mb+pp-1), and each stage's measured share (None:
    not measured)."""
    key: ClassVar[str] = "bubble"
    analytic: float
    measured_per_stage: list[float] | None = None


@dataclass(frozen=True)
class Breakdown(Section):
    """Where a step's time goes (common.breakdown): the median of each phase over the probe steps (s)."""
    key: ClassVar[str] = "breakdown"
    forward_backward_s: float
    grad_comm_s: float
    optimizer_s: float
    data_s: float
    other_s: float
    probe_step_s: float
    step_s: float | None
    source: str
    probe_steps: int

    @property
    def total_s(self) -> float:
        """The phases of one step added up: what step_s should come to."""
        return self.forward_backward_s + self.grad_comm_s + self.optimizer_s + self.data_s + self.other_s


@dataclass(frozen=True)
class GradComm(Section):
    """The gradient communication of a step against the link: bytes, time, bus bandwidth, the ring's bound."""
    key: ClassVar[str] = "grad_comm"
    bytes_per_step: int
    time_s: float
    busbw_GBps: float | None
    link_GBps: float | None
    ring_bound_s: float | None
    ranks: int
    source: str = ""
    link_GBps_by_kind: dict[str, float] | None = None  # other kinds probed alike: bus bandwidth of the fastest


# Where a profiled step goes (common.attribution): the same categories for every framework; the kinds of
# collective are categories of their own, grouped as "communication" by the report.
ATTRIBUTION_CATEGORIES = ("matmul", "attention", "normalization", "activation", "softmax", "dropout_rng",
                          "elementwise", "optimizer", *COMM_KINDS, "data_movement", "host_idle", "other")


@dataclass(frozen=True)
class CategoryTime:
    seconds: float                     # per step
    share: float                       # of the profiled step
    flops_per_s: float | None = None   # where the profiler counts the category's FLOPs
    bytes_per_s: float | None = None   # where the bytes it moves are counted


@dataclass(frozen=True)
class Attribution(Section):
    """Where a step's time goes, from the framework's own profiler over `steps` steps after the measured window
    (--profile; common.attribution): per category (ATTRIBUTION_CATEGORIES, every one present) its seconds per
    step and share of the profiled step. step_s: the profiled steps' mean by the profiler's clock; wall_step_s:
    the same steps by the loop's; measured_step_s: the timed window's median (profiler off). unclassified: the
    largest names in "other" [name, seconds per step], for the framework's pattern table."""
    key: ClassVar[str] = "attribution"
    step_s: float
    wall_step_s: float
    measured_step_s: float | None
    steps: int
    categories: dict[str, CategoryTime]
    profiler: str
    trace_dir: str
    model_flops_per_s_in_matmul: float | None = None
    unclassified: list[list] | None = None
    op_concurrency: float | None = None  # threads running an op at once, on average while any does

    def _value(self):
        return {**asdict(self), "categories": {k: asdict(c) for k, c in self.categories.items()}}

    @classmethod
    def from_value(cls, raw):
        known = super().from_value(raw)
        categories = {k: CategoryTime(**c) for k, c in known.categories.items()}
        missing = [c for c in ATTRIBUTION_CATEGORIES if c not in categories]
        if missing:
            raise ValueError(f"categories: {', '.join(missing)} missing")
        return cls(**{**asdict(known), "categories": categories})

    def seconds(self, *categories: str) -> float:
        return sum(self.categories[c].seconds for c in categories)


@dataclass(frozen=True)
class FastPath(Section):
    """The options of the framework's own fast path the run took (name -> what it was: a bool, a kernel's or a
    mode's name), and why each is on or off in `why` (name -> words)."""
    key: ClassVar[str] = "fast_path"
    options: dict[str, object]
    why: dict[str, str]


SECTIONS: tuple[type[Section], ...] = (TrainableParams, Fp32Math, StateBytesPerRank, CommPerStep, Bubble,
                                       Breakdown, GradComm, Attribution, FastPath)


class RecordSection(Section):
    """A section at the record's top level (`key` in the record itself, not in backend_metrics)."""

    def to_record(self) -> dict:
        return self.to_metrics()

    @classmethod
    def from_record(cls, record: dict | None):
        raw = (record or {}).get(cls.key)
        return None if raw is None else cls.from_value(raw)

    @classmethod
    def problems(cls, raw) -> list[str]:
        return [p.removeprefix("backend_metrics.") for p in super().problems(raw)]


def _numbers(raw, what: str, kind: type | tuple[type, ...] = int, nullable: bool = True) -> list:
    """A list of numbers of `kind` (None allowed where nullable), or TypeError naming `what`."""
    if not isinstance(raw, list):
        raise TypeError(f"{what}: expected a list, got {raw!r}")
    for v in raw:
        if not ((v is None and nullable) or (isinstance(v, kind) and not isinstance(v, bool))):
            raise TypeError(f"{what}: expected numbers{' or null' if nullable else ''}, got {v!r}")
    return raw


@dataclass(frozen=True)
class Memory(RecordSection):
    """Per rank (process): the process's peak (the record's peak_memory_per_rank) and the training's own
    memory, the growth from just before the first step to the peak of the training steps (common.memory;
    None: not measured), with `method` saying how it was measured. processes_share: one process drives
    several devices (MirroredStrategy, DataParallel), so a device's share is its process's figure divided
    by the process's devices. at_start_per_rank: what the same counter read when the window opened."""
    key: ClassVar[str] = "memory"
    process_peak_per_rank: list[int]
    training_per_rank: list[int | None]
    method: str | None
    processes_share: bool
    at_start_per_rank: list[int | None] | None = None

    @classmethod
    def from_value(cls, raw):
        known = super().from_value(raw)
        _numbers(known.process_peak_per_rank, "process_peak_per_rank", nullable=False)
        _numbers(known.training_per_rank, "training_per_rank")
        if known.at_start_per_rank is not None:
            _numbers(known.at_start_per_rank, "at_start_per_rank")
        if not isinstance(known.processes_share, bool):
            raise TypeError(f"processes_share: expected true or false, got {known.processes_share!r}")
        return known


@dataclass(frozen=True)
class AchievablePeak(RecordSection):
    """The highest matmul FLOP/s one device reached in a short probe after the measured window
    (common.achievable): the mean over ranks of each rank's device, at the run's precision, the m x n x k
    product that reached it, and each rank's figure (None: that rank measured nothing)."""
    key: ClassVar[str] = "achievable_peak"
    flops_per_s: float
    precision: str
    method: str
    shape: list[int]
    per_rank: list[float | None]

    @classmethod
    def from_value(cls, raw):
        known = super().from_value(raw)
        _numbers([known.flops_per_s], "flops_per_s", (int, float), nullable=False)
        _numbers(known.per_rank, "per_rank", (int, float))
        if len(_numbers(known.shape, "shape", nullable=False)) != 3:
            raise ValueError(f"shape: expected [m, n, k], got {known.shape!r}")
        return known


FIT_VERDICTS = ("fits", "may not fit", "does not fit", "not checked")


@dataclass(frozen=True)
class FitCheck(RecordSection):
    """Memory per device predicted before the run started (common.plan.fit), held against the device's limit:
    per rank (process) the bytes predicted, which bear on the measured peak beside them (peak_memory_per_rank);
    `available_bytes` and where that limit came from (None: none known, nothing checked); `error`: the model's
    measured memory error the verdict allows for; `counts`: what the prediction holds."""
    key: ClassVar[str] = "fit_check"
    predicted_per_rank: list[int] | None
    available_bytes: int | None
    limit: str
    verdict: str
    counts: str
    error: float | None = None

    @classmethod
    def from_value(cls, raw):
        known = super().from_value(raw)
        if known.predicted_per_rank is not None:
            _numbers(known.predicted_per_rank, "predicted_per_rank", nullable=False)
        if known.available_bytes is not None:
            _numbers([known.available_bytes], "available_bytes", nullable=False)
        if known.verdict not in FIT_VERDICTS:
            raise ValueError(f"verdict: expected one of {FIT_VERDICTS}, got {known.verdict!r}")
        return known


@dataclass(frozen=True)
class CoRun(RecordSection):
    """A CPU 1-device run's command run again as `processes` processes side by side on its host, after it
    (bench.co_run): each one's median step (`step_s_p50`, their records' `run_ids`) and `slowdown`, the median
    of those over this run's own median step. Ranks that share a host's cache, memory bandwidth (and on a VM,
    maybe its cores' hyperthreads) slow each other; bench.predict applies it to the compute of a layout whose
    ranks run side by side on a CPU host."""
    key: ClassVar[str] = "co_run"
    processes: int
    step_s_p50: list[float]
    slowdown: float
    run_ids: list[str]

    @classmethod
    def from_value(cls, raw):
        known = super().from_value(raw)
        _numbers([known.processes], "processes", nullable=False)
        _numbers(known.step_s_p50, "step_s_p50", (int, float), nullable=False)
        _numbers([known.slowdown], "slowdown", (int, float), nullable=False)
        if known.processes < 2 or len(known.step_s_p50) != known.processes or known.slowdown <= 0:
            raise ValueError(f"expected {known.processes} >= 2 medians and a positive slowdown, got "
                             f"{known.step_s_p50!r} and {known.slowdown!r}")
        return known


RECORD_SECTIONS: tuple[type[RecordSection], ...] = (Memory, AchievablePeak, FitCheck, CoRun)


def record_section_problems(record: dict) -> list[str]:
    """validate_record's check of every typed top-level section a record carries."""
    return [p for s in RECORD_SECTIONS if record.get(s.key) is not None for p in s.problems(record[s.key])]


def section_problems(metrics: dict | None) -> list[str]:
    """validate_record's check of every typed section a record's backend_metrics carries."""
    return [p for s in SECTIONS if (metrics or {}).get(s.key) is not None for p in s.problems(metrics[s.key])]


def merged(*sections: Section | None, **plain) -> dict:
    """backend_metrics from typed sections (None ones left out) and plain keys."""
    out = dict(plain)
    for s in sections:
        if s is not None:
            out.update(s.to_metrics())
    return out


