"""keras_jax's two ways of running N devices (bench.run --jax-mode), without importing JAX."""
from __future__ import annotations

from common.config import RunConfig

# single_process: one process drives every device (virtual CPU devices, or the node's GPUs);
# multi_process: one process per device, joined by jax.distributed (JAX's coordinator service).
MODES = ("single_process", "multi_process")
DEFAULT_MODE = "single_process"


def mode_of(cfg: RunConfig) -> str:
    return cfg.backend_options.get("jax_mode") or DEFAULT_MODE
