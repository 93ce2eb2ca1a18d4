"""keras_jax's fast path (backend_metrics.fast_path): what JAX and Keras document for speed, what parbench turns on
and why. On by default where the numerics stay within parity's tolerances; an option otherwise."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import keras

from common.config import RunConfig
from common.sections import FastPath
from common.spec import BertSpec

WHY = {
    "prng_impl": "JAX's default (threefry2x32): dropout is 0 by spec (common.spec), so the step draws no random "
                 "numbers and a faster generator (jax_default_prng_impl=rbg, JAX's advice for dropout-heavy models) "
                 "would change nothing",
    "flash_attention": "keras' own choice (keras.config flash attention left on auto): MultiHeadAttention calls "
                       "ops.dot_product_attention when dropout is 0, which runs cuDNN flash attention where the "
                       "device and dtype allow it (a GPU, bfloat16 or float16), else XLA's fused attention",
    "xla_flags": "XLA's defaults: the only flag parbench sets is the number of virtual host devices on a CPU "
                 "(--xla_force_host_platform_device_count)",
    "matmul_precision": "JAX's default: float32 products as TF32 on GPUs that have it (the record's fp32_math says "
                        "which), full float32 on CPUs",
}


def keras_flash_attention(spec, precision: str) -> bool | str:
    """Whether keras' JAX backend would take flash attention for one sequence of the model (its own check)."""
    if not isinstance(spec, BertSpec):
        return "none (no attention)"
    try:
        from keras.src.backend.jax.nn import _can_use_flash_attention  # keras' own test, internal
    except ImportError:
        return "not measured"
    dtype = {"amp": jnp.bfloat16, "fp16": jnp.float16}.get(precision, jnp.float32)
    q = jnp.zeros((1, spec.seq_len, spec.heads, spec.head_dim), dtype)
    try:
        return bool(_can_use_flash_attention(q, q, q, None))
    except Exception:  # an internal whose signature moved: not measured, never a failed run
        return "not measured"


def fast_path(cfg: RunConfig) -> FastPath:
    enabled = keras.config.is_flash_attention_enabled()
    options = {"prng_impl": str(jax.config.jax_default_prng_impl),
               "flash_attention": keras_flash_attention(cfg.spec, cfg.precision) if enabled is None else enabled,
               "xla_flags": os.environ.get("XLA_FLAGS") or "none",
               "matmul_precision": str(jax.config.jax_default_matmul_precision or "default")}
    return FastPath(options, dict(WHY))
