"""tf_mirrored's fast path (backend_metrics.fast_path): what TensorFlow documents for speed, what parbench turns on
and why. On by default where the numerics stay within parity's tolerances; an option otherwise."""
from __future__ import annotations

import keras
import tensorflow as tf

from common.config import RunConfig
from common.sections import FastPath

WHY = {
    "xla_jit_compile": "an option (--compile): XLA compiles each replica's forward and backward (a cluster cannot "
                       "reach the variables of several devices, so not the whole step, as fit(jit_compile=True) "
                       "would); off by default, as tf.function's own default",
    "tf32": "TensorFlow's default: float32 products run as TF32 on GPUs that have it (the record's fp32_math), never "
            "on CPUs",
    "dtype_policy": "keras' mixed policy follows --precision (mixed_bfloat16 for amp, mixed_float16 for fp16)",
}


def fast_path(cfg: RunConfig) -> FastPath:
    options = {"xla_jit_compile": bool(cfg.compile),
               "tf32": cfg.device_kind == "cuda" and bool(tf.config.experimental.tensor_float_32_execution_enabled()),
               "dtype_policy": keras.config.dtype_policy().name}
    return FastPath(options, dict(WHY))
