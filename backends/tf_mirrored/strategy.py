"""The two modes of the backend, their tf.distribute strategies and which all-reduce each one uses.

Both modes all-reduce with TensorFlow's collective ops (CollectiveAllReduce), TF's own default for
MirroredStrategy since 2.x: RING on CPUs and on GPU slices, NCCL when every replica has its own
GPU. Building the op explicitly lets both modes carry the collective timeout.
"""
from __future__ import annotations

import itertools

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops, cross_device_utils

from backends.tf_mirrored.devices import gpu_slices
from common.config import RunConfig

MODES = ("mirrored", "multi_worker")
DEFAULT_MODE = "mirrored"
STRATEGY_NAMES = {"mirrored": "MirroredStrategy", "multi_worker": "MultiWorkerMirroredStrategy"}
# TF rejects a collective key reused with another shape, so every strategy built in this process
# (the tests build several over the same devices) gets its own range of group keys.
_KEY_RANGES = itertools.count(1, 1000)


def mode_of(cfg: RunConfig) -> str:
    return cfg.backend_options.get("tf_mode") or DEFAULT_MODE


def all_reduce_implementation(kind: str, devices: int, gpus_present: int) -> str:
    """RING or NCCL, decided from the plan alone so that the parent can record it.

    NCCL needs one physical GPU per participant, so GPU slices use RING.
    """
    return "NCCL" if kind == "cuda" and not gpu_slices(devices, gpus_present) else "RING"


def build_strategy(mode: str, devices: list[str], implementation: str, collective_timeout_s: float):
    # The timeout bounds every collective, the gradient all-reduce and the loop's gathers alike:
    # a dead or stuck peer ends the run with an error instead of hanging it.
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=getattr(tf.distribute.experimental.CommunicationImplementation, implementation),
        timeout_seconds=collective_timeout_s)
    if mode == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    keys = cross_device_utils.CollectiveKeys(group_key_start=next(_KEY_RANGES))
    ops = cross_device_ops.CollectiveAllReduce(devices=devices, group_size=len(devices), options=options,
                                               collective_keys=keys)
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
