"""Shared fixtures. Real data comes from $PARBENCH_DATA_DIR; its absence fails the tests, never skips them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.data.files import DATA_DIR_ENV, FILES, resolve_data_dir

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    raw = os.environ.get(DATA_DIR_ENV)
    if not raw:
        pytest.fail(f"set {DATA_DIR_ENV} to a directory with the real data (CI uses ../shared/data)")
    path = resolve_data_dir()
    missing = [f.relpath for f in FILES if not (path / f.relpath).is_file()]
    if missing:
        pytest.fail(f"{DATA_DIR_ENV}={path} lacks {', '.join(missing)}")
    return path


def run_cli(module: str, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `python -m module args` from the repo root, as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          env=full_env, timeout=timeout)


@pytest.fixture
def foreign_python_path(tmp_path) -> str:
    """A PATH whose first `python` is not this interpreter but a shim that fails: what a user has who
    calls the venv's python by path without activating the venv."""
    shim_dir = tmp_path / "foreign-bin"
    shim_dir.mkdir()
    for name in ("python", "python3"):
        shim = shim_dir / name
        shim.write_text("#!/bin/sh\necho 'the foreign python ran' >&2\nexit 1\n")
        shim.chmod(0o755)
    return os.pathsep.join([str(shim_dir), os.environ.get("PATH", "")])
