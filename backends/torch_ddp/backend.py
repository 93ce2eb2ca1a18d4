"""PyTorch DistributedDataParallel: one process per device, launched by a child torchrun."""
from __future__ import annotations

from backends.torch_common.backend import TorchrunBackend
from common.config import RunConfig
from common.devices import DevicePlan
from common.errors import Unsupported


class TorchDDP(TorchrunBackend):
    name = "torch_ddp"
    strategy = "DistributedDataParallel"
    worker_module = "backends.torch_ddp.worker"
    bare_module = "backends.torch_ddp.bare"

    def check(self, cfg: RunConfig, plan: DevicePlan) -> None:
        if cfg.sync_bn and plan.kind == "cpu" and cfg.devices > 1:
            raise Unsupported("--sync-bn: torch's SyncBatchNorm runs on GPU devices only")

    def notes(self, cfg: RunConfig, plan: DevicePlan) -> list[str]:
        notes = self.precision_notes(cfg)
        if cfg.workload == "cnn" and cfg.devices > 1 and not cfg.sync_bn:
            notes.append("BatchNorm statistics are per rank (no SyncBatchNorm), as DDP does by default")
        if plan.kind == "cpu":
            link = f"TCP between {cfg.nnodes} hosts" if cfg.multi_node else "loopback"
            notes.append(f"gloo all-reduce over {link} between CPU processes")
        if plan.kind == "cuda" and plan.virtual:
            notes.append(f"virtual GPUs: {cfg.devices} processes share {plan.physical_devices} GPU(s) and all-reduce "
                         "CUDA tensors over gloo (NCCL refuses two ranks on one GPU); real GPUs use NCCL")
        return notes
