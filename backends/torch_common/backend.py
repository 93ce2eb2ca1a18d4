"""What both torch backends say about themselves."""
from __future__ import annotations

import torch

from backends.base import Backend


class TorchBackend(Backend):
    framework = "torch"

    def framework_version(self) -> str:
        return torch.__version__
