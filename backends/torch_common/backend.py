"""What both torch backends say about themselves."""
from __future__ import annotations

import torch

from backends.base import Backend


class TorchBackend(Backend):
    framework = "torch"

    def framework_version(self) -> str:
        return torch.__version__

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
