"""--profile STEPS: the framework's own profiler over a few training steps after everything measured (and the
breakdown probes), its trace written where a person opens it (TensorBoard's profile plugin or Perfetto), and the
record's `backend_metrics.attribution` read back from it (common.attribution).

A trainer offers `profiler(directory) -> StepProfiler`; the framework's side lives in its own package
(torch_common.profile, tf_mirrored.profile, keras_jax.profile, mindspore_auto.profile). The steps are the
trainer's ordinary train_step, as measured, each wrapped in the framework's step annotation.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from common.attribution import Classifier, OpEvent, Rules, attribution
from common.config import RunConfig
from common.sections import COMM_KINDS, CommPerStep
from common.spec import learning_rate, training_flops_per_sample

DEFAULT_STEPS = 3  # --profile without a number
PROFILES = "profiles"  # the default folder under --out


@dataclass
class Trace:
    """What a profiler gives back once stopped: its op events and the steps' windows, in one clock (s)."""
    events: list[OpEvent]
    windows: list[tuple[float, float]]
    files: list[Path] = field(default_factory=list)  # the trace files written


class StepProfiler(Protocol):
    name: str     # the profiler and how its events were read, in words (the section's `profiler`)
    rules: Rules  # the framework's pattern table (common.attribution)

    def start(self) -> None: ...

    def step(self, index: int) -> AbstractContextManager:
        """One profiled step, annotated as a step in the trace (its window comes back in Trace.windows)."""

    def stop(self) -> Trace:
        """Stop, write the trace under the directory given, read it back."""


def trace_dir(cfg: RunConfig, rank: int) -> Path:
    """Where one rank's trace goes: PROFILE_DIR/<run id>/rank<R>/ (TensorBoard shows each rank as a run)."""
    return Path(cfg.profile_dir) / cfg.run_id / f"rank{rank}"


def _comm_bytes(metrics: dict | None, rank: int) -> dict[str, float]:
    """Bytes per step of each collective kind this rank issues, where the trainer counted them (comm_per_step)."""
    comm = CommPerStep.from_metrics(metrics)
    if comm is None or rank >= len(comm.ranks):
        return {}
    return {kind: float(comm.bytes_of(rank, kind)) for kind in COMM_KINDS if comm.bytes_of(rank, kind)}


def profile_steps(trainer, cfg: RunConfig, train, first: int, clock: Callable[[], float],
                  measured_step_s: float | None, metrics: dict | None) -> dict:
    """cfg.profile_steps steps from step `first` under trainer.profiler; backend_metrics' attribution."""
    directory = trace_dir(cfg, trainer.rank)
    directory.mkdir(parents=True, exist_ok=True)
    started = clock()
    profiler: StepProfiler = trainer.profiler(directory)
    walls = []
    profiler.start()
    for i in range(cfg.profile_steps):
        step = first + i
        began = clock()
        with profiler.step(i):
            batch = train.get(step)
            trainer.train_step(batch, learning_rate(min(step, cfg.total_steps - 1), cfg.total_steps, cfg.optim))
            trainer.sync()
        walls.append(clock() - began)
    trace = profiler.stop()
    if len(trace.windows) != cfg.profile_steps:
        raise RuntimeError(f"--profile: the trace holds {len(trace.windows)} step windows, not the "
                           f"{cfg.profile_steps} steps profiled ({profiler.name})")
    # This rank's share of the model's FLOPs per step: the work splits evenly over the processes.
    flops = training_flops_per_sample(cfg.spec) * cfg.global_batch / trainer.world
    section = attribution(trace.events, trace.windows, Classifier(profiler.rules),
                          wall_step_s=statistics.mean(walls), measured_step_s=measured_step_s,
                          profiler=profiler.name, trace_dir=str(directory.parent), model_flops_per_step=flops,
                          bytes_per_step=_comm_bytes(metrics, trainer.rank))
    if trainer.rank == 0:
        print(f"--profile: {cfg.profile_steps} steps profiled by {profiler.name.split(' ')[0]}, trace written and "
              f"read back in {clock() - started:.1f} s: {directory}", flush=True)
    return section.to_metrics()
