"""Fetch the public data files into the data dir, each one verified and put in place atomically.

Stdlib only, so that a fresh machine can fetch its data before any framework is installed.
Nothing reaches its final name without matching the size and sha256 of ``common.data.files``.
"""
from __future__ import annotations

import hashlib
import http.client
import math
import os
import secrets
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import BinaryIO

from common.data.files import FILES, WIKITEXT_ZIP_MEMBER_DIR, WIKITEXT_ZIP_URL, DataFile, files_of
from common.errors import BadInput, DataError

DATASET_NAMES: tuple[str, ...] = tuple(dict.fromkeys(f.dataset for f in FILES))
DEFAULT_DATASETS: tuple[str, ...] = ("mnist", "wikitext-2")
MIRROR_SCHEMES = ("http", "https", "file")

# Datasets whose official release is one archive: (archive URL, folder of the files inside it).
_ARCHIVES = {"wikitext-2": (WIKITEXT_ZIP_URL, WIKITEXT_ZIP_MEMBER_DIR)}
_CHUNK = 1 << 20
# Some hosts refuse urllib's default agent string.
_HEADERS = {"User-Agent": "parbench-data-download/1"}

Log = Callable[[str], None]
Opener = Callable[[], BinaryIO]


class _Rejected(Exception):
    """A source answered, but not with the expected file."""


# Everything a bad source can raise: it is reported, and the next source is tried.
_SOURCE_ERRORS = (_Rejected, OSError, http.client.HTTPException, zipfile.BadZipFile, EOFError, zlib.error)


def download(data_dir: Path, datasets: Iterable[str] = DEFAULT_DATASETS, mirror: str | None = None,
             timeout: float = 60, force: bool = False, log: Log = print) -> list[Path]:
    """Make every file of `datasets` present and verified under `data_dir`; return their paths.

    Files already there with the right checksum are kept unless `force`. With `mirror` (a base URL
    laid out like the data dir) that is the only source; otherwise the canonical ones, in order.
    Raises BadInput for bad arguments and DataError (one line) when a file cannot be had.
    """
    names = _check_datasets(datasets)
    if mirror is not None:
        _check_mirror(mirror)
    if not (timeout > 0 and math.isfinite(timeout)):
        raise BadInput(f"timeout must be a positive number of seconds, got {timeout}")
    paths: list[Path] = []
    for dataset in names:
        paths += _download_dataset(Path(data_dir), dataset, mirror, timeout, force, log)
    return paths


def verify(data_dir: Path, datasets: Iterable[str] = DEFAULT_DATASETS) -> list[str]:
    """One line per missing, wrong-size or wrong-checksum file; empty when all is well."""
    problems = []
    for dataset in _check_datasets(datasets):
        for df in files_of(dataset):
            problem = _problem(df, Path(data_dir) / df.relpath)
            if problem:
                problems.append(f"{df.relpath}: {problem}")
    return problems


def _check_datasets(datasets: Iterable[str]) -> tuple[str, ...]:
    names = tuple(datasets)
    if not names:
        raise BadInput("no dataset given")
    unknown = [n for n in names if n not in DATASET_NAMES]
    if unknown:
        raise BadInput(f"unknown dataset {unknown[0]!r} (known: {', '.join(DATASET_NAMES)})")
    return tuple(dict.fromkeys(names))


def _check_mirror(mirror: str) -> None:
    parts = urllib.parse.urlsplit(mirror)
    if parts.scheme not in MIRROR_SCHEMES or (parts.scheme != "file" and not parts.netloc):
        raise BadInput(f"mirror must be an http://, https:// or file:// URL, got {mirror!r}")


def _problem(df: DataFile, path: Path) -> str | None:
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size != df.size:
        return f"size {size} bytes, expected {df.size}"
    with path.open("rb") as fh:
        if hashlib.file_digest(fh, "sha256").hexdigest() != df.sha256:
            return "sha256 mismatch"
    return None


def _download_dataset(data_dir: Path, dataset: str, mirror: str | None, timeout: float, force: bool,
                      log: Log) -> list[Path]:
    folder = data_dir / dataset
    created = _make_dirs(folder)
    archive = None
    if mirror is None and dataset in _ARCHIVES:
        archive = _Archive(*_ARCHIVES[dataset], folder=folder, timeout=timeout)
    try:
        for df in files_of(dataset):
            dest = data_dir / df.relpath
            if force or not _keep_present(df, dest, log):
                _fetch(df, dest, _sources(df, mirror, archive, timeout), log)
    finally:
        if archive is not None:
            archive.close()
        _remove_if_empty(created)
    return [data_dir / df.relpath for df in files_of(dataset)]


def _keep_present(df: DataFile, dest: Path, log: Log) -> bool:
    if not dest.exists():
        return False
    problem = _problem(df, dest)
    if problem is None:
        log(f"{df.relpath}: present, checksum ok")
        return True
    log(f"{df.relpath}: present but {problem}; downloading it again")
    return False


def _sources(df: DataFile, mirror: str | None, archive: _Archive | None,
             timeout: float) -> list[tuple[str, Opener]]:
    urls = [mirror.rstrip("/") + "/" + urllib.parse.quote(df.relpath)] if mirror else list(df.urls)
    sources: list[tuple[str, Opener]] = [(url, partial(_open_url, url, timeout)) for url in urls]
    if archive is not None:
        # The official archive first: the per-file URLs are redistributions.
        sources.insert(0, (archive.label(df.name), partial(archive.open, df.name)))
    return sources


def _fetch(df: DataFile, dest: Path, sources: list[tuple[str, Opener]], log: Log) -> None:
    reasons = []
    for label, opener in sources:
        log(f"{df.relpath}: fetching {label}")
        try:
            _install(df, dest, opener)
        except _SOURCE_ERRORS as exc:
            reasons.append(f"{label}: {_reason(exc)}")
            log(f"{df.relpath}: failed ({_reason(exc)})")
        else:
            log(f"{df.relpath}: ok ({df.size} bytes, sha256 verified)")
            return
    raise DataError(f"could not download {df.relpath}: " + "; ".join(reasons))


def _install(df: DataFile, dest: Path, opener: Opener) -> None:
    """Stream into a temp file beside `dest`, check it, then rename it over `dest`."""
    tmp = _temp_path(dest)
    try:
        with tmp.open("xb") as out, opener() as src:
            size, digest = _copy(src, out, limit=df.size)
            out.flush()
            os.fsync(out.fileno())
        if size != df.size:
            raise _Rejected(f"truncated: got {size} of {df.size} bytes")
        if digest != df.sha256:
            raise _Rejected("sha256 mismatch")
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _temp_path(dest: Path) -> Path:
    # Same folder as dest so os.replace is atomic; not tempfile.mkstemp, whose 0600 mode would
    # stick to the data file after the rename.
    return dest.with_name(f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.part")


def _copy(src: BinaryIO, out: BinaryIO, limit: int | None = None) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    while chunk := src.read(_CHUNK):
        size += len(chunk)
        if limit is not None and size > limit:
            raise _Rejected(f"more than the expected {limit} bytes")
        digest.update(chunk)
        out.write(chunk)
    return size, digest.hexdigest()


def _open_url(url: str, timeout: float) -> BinaryIO:
    return urllib.request.urlopen(urllib.request.Request(url, headers=_HEADERS), timeout=timeout)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


def _make_dirs(folder: Path) -> list[Path]:
    """Create `folder` and its missing parents; return those created, deepest first."""
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    return created


def _remove_if_empty(created: list[Path]) -> None:
    # A failed first download should not leave empty folders that look like a half-set-up data dir.
    for folder in created:
        try:
            folder.rmdir()
        except OSError:
            return  # not empty: it and its parents stay


class _Archive:
    """A zip release, fetched at most once per download into the folder its files go to."""

    def __init__(self, url: str, member_dir: str, folder: Path, timeout: float) -> None:
        self.url = url
        self.member_dir = member_dir
        self.folder = folder
        self.timeout = timeout
        self._zip: zipfile.ZipFile | None = None
        self._path: Path | None = None
        self._error: BaseException | None = None

    def label(self, name: str) -> str:
        return f"{self.url} [{self.member_dir}{name}]"

    def open(self, name: str) -> BinaryIO:
        zf = self._load()
        try:
            return zf.open(self.member_dir + name)
        except KeyError:
            raise _Rejected(f"archive has no member {self.member_dir}{name}") from None

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)

    def _load(self) -> zipfile.ZipFile:
        # A failed fetch is remembered, so that each member reports it without refetching.
        if self._error is not None:
            raise self._error
        if self._zip is None:
            try:
                self._zip = self._fetch()
            except _SOURCE_ERRORS as exc:
                self._error = exc
                raise
        return self._zip

    def _fetch(self) -> zipfile.ZipFile:
        self._path = _temp_path(self.folder / Path(urllib.parse.urlsplit(self.url).path).name)
        with self._path.open("xb") as out, _open_url(self.url, self.timeout) as src:
            _copy(src, out)
        return zipfile.ZipFile(self._path)
