"""The tf.distribute strategy of each mode (backends.tf_mirrored.modes), its all-reduce built explicitly so
that both modes carry the collective timeout."""
from __future__ import annotations

import itertools

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops, cross_device_utils

# TF rejects a collective key reused with another shape, so every strategy built in this process
# (the tests build several over the same devices) gets its own range of group keys.
_KEY_RANGES = itertools.count(1, 1000)


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
