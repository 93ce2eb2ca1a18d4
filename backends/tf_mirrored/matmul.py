"""TensorFlow's part of the achievable-peak probe (common.achievable): timed square products, one on each
device the process drives, all at once (as a MirroredStrategy step runs its replicas)."""
from __future__ import annotations

import tensorflow as tf

from common.achievable import timed_repeats
from common.peak_flops import PRECISION_MATH

# The dtype a run's --precision puts Keras' matrix products in (its mixed policies' compute dtype).
MATMUL_DTYPES = {"amp": tf.bfloat16, "fp16": tf.float16, "fp32": tf.float32}


def time_matmul(devices: list[str], precision: str, n: int, repeats: int) -> tuple[str, list[float]]:
    """(math mode, seconds of each of `repeats` rounds of one n x n x n product per device, after an untimed
    round): a round ends when every device's product is reduced to a scalar and read."""
    dtype = MATMUL_DTYPES[precision]
    operands = []
    for d in devices:
        with tf.device(d):
            operands.append((tf.random.normal((n, n), dtype=dtype), tf.random.normal((n, n), dtype=dtype)))

    @tf.function
    def round_():
        sums = []
        for d, (a, b) in zip(devices, operands):
            with tf.device(d):
                sums.append(tf.reduce_sum(tf.matmul(a, b)))
        return sums

    seconds = timed_repeats(lambda: [s.numpy() for s in round_()], repeats)
    gpu = any("GPU" in d.upper() for d in devices)
    tf32 = precision == "fp32" and gpu and tf.config.experimental.tensor_float_32_execution_enabled()
    return "tf32" if tf32 else PRECISION_MATH[precision], seconds
