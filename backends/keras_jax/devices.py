"""The devices a keras_jax process sees, set in its environment before JAX starts."""
from __future__ import annotations

import os

from common.devices import process_cores

# Read by the worker before it imports JAX: the cores its XLA thread pools may use.
CORES_ENV = "PARBENCH_JAX_CORES"


def jax_env(kind: str, devices: int, threads_per_device: int, first_core: int, gpu: int | None = None
            ) -> dict[str, str]:
    """KERAS_BACKEND, and the devices of one process: `devices` virtual CPU devices (XLA's host platform split),
    or its GPUs (all of the node's in one process; GPU `gpu` alone for a process per device)."""
    env = {"KERAS_BACKEND": "jax"}
    if kind == "cpu":
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
        env["JAX_PLATFORMS"] = "cpu"
        # XLA sizes its pools from the cores the process may run on: pinning gives each virtual device its
        # threads-per-device cores, as the other backends' thread settings do. Oversubscribed: every core.
        chosen = process_cores(sorted(os.sched_getaffinity(0)), first_core, devices * max(1, threads_per_device))
        env[CORES_ENV] = ",".join(str(c) for c in chosen)
    elif gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return env
