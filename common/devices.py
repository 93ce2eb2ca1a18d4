"""Which devices a run uses, and how CPU cores are shared when the devices are virtual."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

# What an accelerator's driver leaves on a Linux machine: NVIDIA's (/proc and its control device), ROCm's kernel
# driver, WSL's GPU paravirtualisation, Ascend's device manager. None of them: no framework can see one here.
ACCELERATOR_DRIVER_PATHS = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/kfd", "/dev/dxg",
                            "/dev/davinci_manager")


@dataclass(frozen=True)
class DevicePlan:
    kind: str                 # "cpu" | "cuda" | "ascend"
    count: int
    virtual: bool             # True when a "device" is a slice of something (CPU cores, a shared GPU)
    threads_per_device: int   # intra-op threads each device gets (CPU); 0 when not applicable
    oversubscribed: bool      # count x threads_per_device > cores: timings are contended
    description: str
    hardware: tuple[str, ...] = ()  # names of the physical accelerators behind the devices

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def physical_devices(self) -> int:
        """Accelerators the run occupies: virtual GPU devices share them (N processes or replicas on one GPU
        share its one peak), so MFU divides by this, not by `count`."""
        if self.kind != "cpu" and self.virtual and self.hardware:
            return min(self.count, len(self.hardware))
        return self.count


def accelerator_driver_present() -> bool:
    """Whether this machine has a GPU's or NPU's driver: the parent asks a framework for its accelerators
    (importing it takes seconds, TensorFlow's five) only where one could answer other than none."""
    return any(Path(path).exists() for path in ACCELERATOR_DRIVER_PATHS)


def cpu_cores() -> int:
    """Cores this process may run on (cgroup/affinity aware, unlike os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def process_cores(allowed: list[int], first: int, wanted: int) -> list[int]:
    """The cores a process of `wanted` threads runs on, `first` cores into those it may use: its own when the
    sweep's processes fit the cores side by side; every core when they do not (oversubscribed: pinning would
    stack processes on the same cores while others idle)."""
    if wanted > len(allowed):
        return sorted(allowed)
    return sorted({allowed[(first + i) % len(allowed)] for i in range(wanted)})


def default_threads_per_device(max_devices: int) -> int:
    """Fixed for a whole sweep, from its largest device count, so every N gets the same cores."""
    return max(1, cpu_cores() // max(1, max_devices))


def threads_phrase(threads_per_device: int, device_kind: str) -> str:
    """A sweep's header on its devices' threads: said only where the devices are virtual CPUs (a GPU run's threads
    feed no device), so "auto" says it only on a machine without an accelerator's driver."""
    if device_kind == "cuda" or (device_kind == "auto" and accelerator_driver_present()):
        return ""
    return f", {threads_per_device} thread(s) per virtual CPU device"


def cpu_plan(count: int, threads_per_device: int) -> DevicePlan:
    cores = cpu_cores()
    over = count * threads_per_device > cores
    desc = f"{count} virtual CPU device(s) x {threads_per_device} thread(s) on {cores} core(s)"
    if over:
        desc += " (oversubscribed)"
    return DevicePlan("cpu", count, True, threads_per_device, over, desc)


def cuda_plan(count: int, available: int, names: list[str]) -> DevicePlan:
    label = names[0] if names else "CUDA device"
    return DevicePlan("cuda", count, False, 0, False, f"{count} of {available} x {label}", tuple(names))


def shared_cuda_plan(count: int, names: list[str], how: str) -> DevicePlan:
    """`count` virtual devices over the GPUs present, round robin (device i on GPU i mod len(names)):
    the counterpart of TensorFlow's logical GPUs. `how` says what one virtual device is."""
    used = names[:count]
    return DevicePlan("cuda", count, True, 0, False,
                      f"{count} virtual devices on {len(used)} x {used[0]} ({how})", tuple(used))


def nvidia_smi_command(query: str, *options: str) -> list[str] | None:
    """nvidia-smi asked `query` (its --query-gpu fields) of the GPUs this process may use: CUDA_VISIBLE_DEVICES
    (indices or UUIDs, as nvidia-smi --id takes them) selects them as CUDA would. None without an NVIDIA driver,
    nvidia-smi or a visible GPU."""
    if not accelerator_driver_present() or shutil.which("nvidia-smi") is None:
        return None
    cmd = ["nvidia-smi", f"--query-gpu={query}", *options]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        if not visible.strip():
            return None
        cmd.append(f"--id={visible}")
    return cmd


@functools.lru_cache(maxsize=1)
def gpu_memory_bytes() -> tuple[int, ...]:
    """The total memory of each NVIDIA GPU this process may use, from nvidia-smi (no framework imported: a fit
    check runs before any); () without an NVIDIA driver, nvidia-smi or a visible GPU."""
    cmd = nvidia_smi_command("memory.total", "--format=csv,noheader,nounits")
    if cmd is None:
        return ()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
        return tuple(int(float(v)) * 2**20 for v in out.split())  # MiB
    except (OSError, ValueError, subprocess.SubprocessError):
        return ()
