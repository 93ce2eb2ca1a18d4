"""How the mindspore_auto parent finds msrun's workers: each registers its pid in a folder the parent names, and
marks its exit; without MindSpore, so that the parent side imports none."""
from __future__ import annotations

import os
from pathlib import Path

PID_DIR_ENV = "PARBENCH_WORKER_PID_DIR"
FINISHED = "finished"


def _pid_file() -> Path | None:
    return Path(os.environ[PID_DIR_ENV]) / str(os.getpid()) if PID_DIR_ENV in os.environ else None


def register_pid() -> None:
    """msrun starts workers in sessions of their own (setsid), out of reach of the harness's
    process-group kill: the backend ends whoever registered here once msrun is gone. The file says
    the role and rank msrun gave this process, so that the backend can name a worker that dies."""
    path = _pid_file()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{os.environ.get('MS_ROLE', '')} {os.environ.get('RANK_ID', '')}\n")


def mark_finished() -> None:
    """A registered worker that is gone without this mark died (signal, os._exit, crash)."""
    path = _pid_file()
    if path is not None:
        with open(path, "a") as fh:
            fh.write(f"{FINISHED}\n")
