"""Token ids of a data file, kept on disk after the first time they are computed.

Tokenizing WikiText-2's 2M-word train split in Python (vocabulary and ids) takes 2-3 s, in every rank of every MLM
run on real data. The ids depend only on the files' bytes and on the tokenizer, so they are kept under a key made
of both: the SHA-256 of every file they were computed from and FORMAT, which a change to the tokenizer bumps.
A cache that cannot be read or written is skipped, never an error: the ids are then computed as before.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

CACHE_ENV = "PARBENCH_CACHE_DIR"
FORMAT = 1  # bump when tokenization changes: every cached array is then computed anew


def cache_dir() -> Path:
    """$PARBENCH_CACHE_DIR, else $XDG_CACHE_HOME/parbench/derived, else ~/.cache/parbench/derived (never the data
    dir, which may be a shared, read-only copy)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "parbench" / "derived"


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


def key(name: str, sources: list[Path]) -> str:
    """A file name for the ids of `name` computed from `sources` by tokenizer FORMAT."""
    sha = hashlib.sha256(f"{name}:{FORMAT}".encode())
    for source in sources:
        sha.update(_digest(source).encode())
    return f"{name}-{sha.hexdigest()[:24]}.npy"


def read(name: str) -> np.ndarray | None:
    try:
        ids = np.load(cache_dir() / name, allow_pickle=False)
    except (OSError, ValueError):
        return None
    return ids if ids.ndim == 1 and ids.dtype == np.int32 else None


def write(name: str, ids: np.ndarray) -> None:
    """Atomically (two ranks may write the same array at once); a cache dir that cannot be written is skipped."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.save(f, ids, allow_pickle=False)
            os.replace(tmp, folder / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        return
