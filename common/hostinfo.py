"""What a record says about the machine and the software behind a figure."""
from __future__ import annotations

import os
import platform
import re
import resource
import socket
import subprocess
import time
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from common.devices import cpu_cores

REPO_ROOT = Path(__file__).resolve().parents[1]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_governor() -> str | None:
    """cpufreq's scaling governor of CPU 0 (performance, powersave, ...); None where not readable (VMs)."""
    try:
        return Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text().strip()
    except OSError:
        return None


def host_info(gpus: list[str] | None = None) -> dict:
    return {"name": socket.gethostname(), "cpu": _cpu_model(), "cores": cpu_cores(),
            "cpu_governor": _cpu_governor(), "gpus": gpus or [], "os": platform.platform(),
            "python": platform.python_version()}


# Environment variables that change how fast a framework runs: thread pools, compilers, collectives.
PERFORMANCE_ENV = re.compile(r"^(OMP_|MKL_|OPENBLAS_|KMP_|GOMP_|ONEDNN_|DNNL_|XLA_|TF_|NCCL_|GLOO_|TORCH_|CUDA_|"
                             r"JAX_|KERAS_|MS_|GLOG_|PYTORCH_)")


def performance_env() -> dict[str, str]:
    """The variables of this process's environment that change performance, for a record to be reproduced."""
    # TF_CLI_*: Terraform's variables, which share TensorFlow's prefix.
    return {k: v for k, v in sorted(os.environ.items()) if PERFORMANCE_ENV.match(k) and not k.startswith("TF_CLI_")}


def _own_cpu_s() -> float:
    """CPU seconds of this process and of its children it has reaped (a run's launcher and workers)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def machine_load() -> dict:
    """The machine's load now: the 1-minute load average, the CPU time counters (/proc/stat) and this process's
    own CPU time with its reaped children's, from which two readings give the share of CPU time stolen by the
    hypervisor and the cores other programs kept busy in between."""
    load = {"loadavg_1m": os.getloadavg()[0], "wall_s": time.monotonic(), "own_cpu_s": _own_cpu_s()}
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        load.update(cpu_total_ticks=sum(fields[:8]), cpu_steal_ticks=fields[7] if len(fields) > 7 else 0,
                    cpu_idle_ticks=fields[3] + fields[4])
    except (OSError, ValueError, IndexError):
        pass
    return load


def load_over(before: dict, after: dict) -> dict:
    """What a record says of the machine's load during a run: load averages at both ends, the stolen share, and
    other_busy_cores: the cores busy in between (/proc/stat) less what the run itself used (its processes' CPU
    time over the wall time), i.e. the other programs' demand while it ran, which the 1-minute load average
    (it holds the minute before, and a sweep's previous run) only approximates."""
    ticks = after.get("cpu_total_ticks", 0) - before.get("cpu_total_ticks", 0)
    steal = after.get("cpu_steal_ticks", 0) - before.get("cpu_steal_ticks", 0)
    out = {"loadavg_1m_before": round(before["loadavg_1m"], 2), "loadavg_1m_after": round(after["loadavg_1m"], 2),
           "cpu_steal_share": round(steal / ticks, 4) if ticks > 0 else None}
    wall = after.get("wall_s", 0.0) - before.get("wall_s", 0.0)
    if ticks > 0 and wall > 0 and "cpu_idle_ticks" in after and "own_cpu_s" in after:
        # /proc/stat sums every CPU of the machine
        busy = (ticks - steal - (after["cpu_idle_ticks"] - before["cpu_idle_ticks"])) / ticks * (os.cpu_count() or 1)
        own = (after["own_cpu_s"] - before["own_cpu_s"]) / wall
        out["other_busy_cores"] = round(max(0.0, busy - own), 2)
    return out


def package_versions(names=("numpy", "torch", "tensorflow", "keras", "keras-hub", "jax", "jaxlib",
                            "mindspore")) -> dict:
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


@lru_cache(maxsize=1)
def git_sha() -> str:
    """HEAD of the checkout the harness runs from, with '+dirty' when it has local changes."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
