"""What the torch backends say about themselves, and how the one-process-per-device ones start."""
from __future__ import annotations

from importlib import metadata
from pathlib import Path

from backends.base import Backend
from backends.torch_common.launch import Torchrun, torch_device_plan
from common.config import RunConfig
from common.devices import DevicePlan
from common.launch import launch


class TorchBackend(Backend):
    framework = "torch"

    def framework_version(self) -> str:
        return metadata.version("torch")

    @staticmethod
    def precision_notes(cfg) -> list[str]:
        """What --compile and --precision do in both torch backends (TorchTrainer)."""
        notes = []
        if cfg.compile:
            notes.append(f"--compile: torch.compile (mode {cfg.compile}) of the training module; the steps in which "
                         "dynamo compiled are timed apart (backend_metrics.compile_s, compile_steps)")
        if cfg.precision == "fp16":
            notes.append("--precision fp16: float16 autocast with torch.amp.GradScaler (dynamic loss scale from 2^16, "
                         "halved and the step skipped on overflow: backend_metrics.loss_scale_skipped_steps)")
        return notes


class TorchrunBackend(TorchBackend):
    """One process per device under torchrun (torch_ddp, torch_3d): its rendezvous, timeouts, restarts and
    failure report; a backend names the module each rank runs."""
    worker_module: str
    bare_module: str | None = None

    def plan_devices(self, count: int, kind: str, threads_per_device: int) -> DevicePlan:
        return torch_device_plan(count, kind, threads_per_device)

    def spans_hosts(self, cfg: RunConfig) -> bool:
        return True

    def run(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        return launch(cfg, workdir, ["-m", self.worker_module], Torchrun(cfg, plan.threads_per_device, workdir))

    def run_bare(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        if self.bare_module is None:
            return super().run_bare(cfg, plan, workdir)
        return launch(cfg, workdir, ["-m", self.bare_module], Torchrun(cfg, plan.threads_per_device, workdir))
