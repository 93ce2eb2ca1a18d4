"""The logical devices one TensorFlow process trains on, set up before TensorFlow initialises them.

What N devices means here (shared by the parent's plan and the workers):
- CPU: N virtual CPU devices of one physical CPU, the cores shared through the intra-op pool;
- CUDA with at least N GPUs: N real GPUs;
- CUDA with fewer: N logical slices of GPU 0, each capped at GPU_SLICE_MB (the seed article's setup).
"""
from __future__ import annotations

from common.devices import accelerator_driver_present

GPU_SLICE_MB = 4096


def physical_gpus() -> list[str]:
    """Names of the GPUs TensorFlow can use (an empty list on a CPU build or machine)."""
    if not accelerator_driver_present():
        return []
    import tensorflow as tf  # five seconds: only where a driver could show a GPU

    return [tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
            for gpu in tf.config.list_physical_devices("GPU")]


def gpu_slices(count: int, available: int) -> bool:
    """True when `count` devices must be carved out of GPU 0 rather than be real GPUs."""
    return count > available


def configure_devices(kind: str, replicas: int, intra_op_threads: int, world_devices: int,
                      first_device: int = 0) -> list[str]:
    """Declare this process's `replicas` logical devices and return their names.

    `world_devices` is the run's device count over all processes and `first_device` the index of this
    process's first one, so that a multi-worker run on N real GPUs gives worker i GPU i. Nothing here
    initialises the TensorFlow context: MultiWorkerMirroredStrategy must be built before that happens.
    """
    import tensorflow as tf  # a worker's: the parent plans without TensorFlow

    if intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
    if kind == "cpu":
        tf.config.set_visible_devices([], "GPU")
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
        return [f"/device:CPU:{i}" for i in range(replicas)]
    gpus = tf.config.list_physical_devices("GPU")
    if gpu_slices(world_devices, len(gpus)):
        tf.config.set_visible_devices(gpus[0], "GPU")
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=GPU_SLICE_MB)] * replicas)
    else:
        mine = gpus[first_device:first_device + replicas]
        tf.config.set_visible_devices(mine, "GPU")
        for gpu in mine:
            tf.config.experimental.set_memory_growth(gpu, True)
    return [f"/device:GPU:{i}" for i in range(replicas)]
