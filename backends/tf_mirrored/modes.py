"""The two modes of the backend, the strategy each builds and which all-reduce it uses, decided without
TensorFlow: the parent plans and records them before any worker imports it (backends.tf_mirrored.strategy
builds the strategies).

Both modes all-reduce with TensorFlow's collective ops (CollectiveAllReduce), TF's own default for
MirroredStrategy since 2.x: RING on CPUs and on GPU slices, NCCL when every replica has its own GPU.
"""
from __future__ import annotations

from backends.tf_mirrored.devices import gpu_slices
from common.config import RunConfig

MODES = ("mirrored", "multi_worker")
DEFAULT_MODE = "mirrored"
STRATEGY_NAMES = {"mirrored": "MirroredStrategy", "multi_worker": "MultiWorkerMirroredStrategy"}


def mode_of(cfg: RunConfig) -> str:
    return cfg.backend_options.get("tf_mode") or DEFAULT_MODE


def all_reduce_implementation(kind: str, devices: int, gpus_present: int) -> str:
    """RING or NCCL, decided from the plan alone so that the parent can record it.

    NCCL needs one physical GPU per participant, so GPU slices use RING.
    """
    return "NCCL" if kind == "cuda" and not gpu_slices(devices, gpus_present) else "RING"
