"""What a record says about the machine and the software behind a figure."""
from __future__ import annotations

import platform
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


def host_info(gpus: list[str] | None = None) -> dict:
    return {"name": socket.gethostname(), "cpu": _cpu_model(), "cores": cpu_cores(),
            "gpus": gpus or [], "os": platform.platform(), "python": platform.python_version()}


def package_versions(names=("numpy", "torch", "tensorflow", "keras", "keras-hub", "mindspore")) -> dict:
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
