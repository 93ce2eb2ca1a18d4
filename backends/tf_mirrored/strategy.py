"""The two modes of the backend, their tf.distribute strategies and which all-reduce each one uses."""
from __future__ import annotations

import tensorflow as tf

from backends.tf_mirrored.devices import gpu_slices
from common.config import RunConfig

MODES = ("mirrored", "multi_worker")
DEFAULT_MODE = "mirrored"
STRATEGY_NAMES = {"mirrored": "MirroredStrategy", "multi_worker": "MultiWorkerMirroredStrategy"}


def mode_of(cfg: RunConfig) -> str:
    return cfg.backend_options.get("tf_mode") or DEFAULT_MODE


def all_reduce_name(mode: str, kind: str, devices: int, gpus_present: int) -> str:
    """The cross-device all-reduce a run uses, decided from the plan alone so the parent can record it.

    NCCL needs one physical GPU per participant, so GPU slices use the host-side reductions.
    """
    real_gpus = kind == "cuda" and not gpu_slices(devices, gpus_present)
    if mode == "multi_worker":
        return "CollectiveCommunication.NCCL" if real_gpus else "CollectiveCommunication.RING"
    return "NcclAllReduce" if real_gpus else "ReductionToOneDevice"


def build_strategy(mode: str, devices: list[str], all_reduce: str, collective_timeout_s: float):
    if mode == "mirrored":
        ops = tf.distribute.NcclAllReduce() if all_reduce == "NcclAllReduce" else tf.distribute.ReductionToOneDevice()
        return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    implementation = getattr(tf.distribute.experimental.CommunicationImplementation, all_reduce.split(".")[1])
    # The timeout bounds every collective, the gradient all-reduce and the loop's gathers alike:
    # a dead or stuck peer ends the run with an error instead of hanging it.
    options = tf.distribute.experimental.CommunicationOptions(implementation=implementation,
                                                              timeout_seconds=collective_timeout_s)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
