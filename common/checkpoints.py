"""Checkpoint files that a crash cannot leave half-trusted.

Each checkpoint is `checkpoint-<step>.<ext>`, written under a temporary name and renamed into place,
then vouched for by a sidecar `<name>.sha256` written (atomically) only after the payload is whole.
A checkpoint is loaded only if its sidecar exists and matches: a torn or tampered payload, or one
whose sidecar never got written, is skipped with a note and the previous one is used. The newest
`KEEP` checkpoints are kept, so that there is always one to fall back on.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

KEEP = 2
DIGEST_SUFFIX = ".sha256"
_NAME = re.compile(r"^checkpoint-(\d{8})(\.\w+)$")


def checkpoint_path(directory: Path, step: int, ext: str) -> Path:
    return Path(directory) / f"checkpoint-{step:08d}{ext}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def commit(directory: Path, step: int, ext: str, write: Callable[[Path], None], keep: int = KEEP) -> Path:
    """`write(tmp_path)` the payload, then make it checkpoint `step`: payload renamed into place,
    digest sidecar after it, older checkpoints beyond `keep` removed."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, step, ext)
    # The temporary name keeps the extension: some savers (MindSpore) append theirs otherwise.
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint.", suffix=ext, dir=directory)
    os.close(fd)
    try:
        write(Path(tmp))
        _fsync(Path(tmp))
        digest = sha256_of(Path(tmp))
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _write_text_atomic(final.with_name(final.name + DIGEST_SUFFIX), f"{digest}  {final.name}\n")
    # Only older steps go: a folder that also holds a later run's higher steps must not lose this one.
    for _, old in [c for c in _candidates(directory, ext) if c[0] < step][keep - 1:]:
        old.unlink(missing_ok=True)
        old.with_name(old.name + DIGEST_SUFFIX).unlink(missing_ok=True)
    return final


def _candidates(directory: Path, ext: str) -> Iterator[tuple[int, Path]]:
    """(step, path) of every checkpoint file in `directory`, newest first."""
    found = []
    for path in Path(directory).glob(f"checkpoint-*{ext}") if Path(directory).is_dir() else ():
        match = _NAME.match(path.name)
        if match and match[2] == ext:
            found.append((int(match[1]), path))
    return iter(sorted(found, reverse=True))


def verify(path: Path) -> str | None:
    """Why `path` must not be loaded, or None when its sidecar vouches for it."""
    sidecar = path.with_name(path.name + DIGEST_SUFFIX)
    try:
        expected = sidecar.read_text().split()[0]
    except (OSError, IndexError):
        return "no digest (the write did not complete)"
    actual = sha256_of(path)
    if actual != expected:
        return f"SHA-256 {actual[:12]}... does not match its digest {expected[:12]}... (torn or altered)"
    return None


def valid_checkpoints(directory: Path, ext: str, skipped: list[str]) -> Iterator[tuple[int, Path]]:
    """(step, path) of verified checkpoints, newest first; each one passed over adds a note to `skipped`."""
    for step, path in _candidates(directory, ext):
        problem = verify(path)
        if problem:
            skipped.append(f"checkpoint {path.name} skipped: {problem}")
            continue
        yield step, path
