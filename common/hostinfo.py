"""What a record says about the machine and the software behind a figure."""
from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
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


def machine_load() -> dict:
    """The machine's load now: the 1-minute load average, and the CPU time counters (/proc/stat) from
    which two readings give the share of CPU time stolen by the hypervisor in between."""
    load = {"loadavg_1m": os.getloadavg()[0]}
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        load.update(cpu_total_ticks=sum(fields[:8]), cpu_steal_ticks=fields[7] if len(fields) > 7 else 0)
    except (OSError, ValueError):
        pass
    return load


def load_over(before: dict, after: dict) -> dict:
    """What a record says of the machine's load during a run: load averages at both ends and the stolen share."""
    ticks = after.get("cpu_total_ticks", 0) - before.get("cpu_total_ticks", 0)
    steal = after.get("cpu_steal_ticks", 0) - before.get("cpu_steal_ticks", 0)
    return {"loadavg_1m_before": round(before["loadavg_1m"], 2), "loadavg_1m_after": round(after["loadavg_1m"], 2),
            "cpu_steal_share": round(steal / ticks, 4) if ticks > 0 else None}


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
