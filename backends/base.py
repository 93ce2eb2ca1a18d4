"""What the harness asks of a backend. A backend holds only what is specific to its framework
and strategy; data, the loop, timing and records come from common/."""
from __future__ import annotations

from pathlib import Path

from common.config import RunConfig
from common.devices import DevicePlan
from common.errors import Unsupported


class Backend:
    name: str
    framework: str      # the distribution name, for versions
    strategy: str

    def framework_version(self) -> str:
        raise NotImplementedError

    def strategy_name(self, cfg: RunConfig) -> str:
        """The strategy this run uses; a backend with several modes names the chosen one."""
        return self.strategy

    def mode_name(self, cfg: RunConfig) -> str:
        """The strategy without the layout (common.config_key): what tells this run's configuration apart from
        another of the same backend, layout and devices. The strategy itself unless it names the layout."""
        return self.strategy_name(cfg)

    def plan_devices(self, count: int, kind: str, threads_per_device: int) -> DevicePlan:
        """Which devices `count` means here (kind: auto|cpu|cuda); raises Unsupported if none fit."""
        raise NotImplementedError

    def spans_hosts(self, cfg: RunConfig) -> bool:
        """Whether this run's strategy can take part in a run of several hosts (--nnodes > 1)."""
        return False

    def check(self, cfg: RunConfig, plan: DevicePlan) -> None:
        """Raise Unsupported for a valid request this machine or strategy cannot run."""

    def run(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        """Train and return common.loop's outcome; raise common.launch.RunFailed when it fails."""
        raise NotImplementedError

    def run_bare(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        """Train with the framework's own minimal idiom instead of common.loop (backends/<name>/bare.py) and
        return common.calibration.bare_result; for bench.calibrate."""
        raise Unsupported(f"{self.name} has no bare loop to calibrate against")

    def notes(self, cfg: RunConfig, plan: DevicePlan) -> list[str]:
        """Differences from the spec that cannot be removed, for the record."""
        return []

    def measured_notes(self, record: dict) -> list[str]:
        """Notes that only the run's own measurements can write (e.g. where its step time went)."""
        return []
