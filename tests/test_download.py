"""common.data.download and `python -m bench.data`, against a loopback HTTP server of ../shared/data."""
from __future__ import annotations

import hashlib
import http.server
import io
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import pytest

from common.data import download as dl
from common.data.files import FILES, DataFile, files_of
from common.errors import DataError
from tests.conftest import run_in_process

REPO = Path(__file__).resolve().parents[1]
SMALL = "mnist/t10k-labels-idx1-ubyte.gz"  # the smallest file: the one the fault tests break


@dataclass(frozen=True)
class Reply:
    """A canned answer for one path: `body`, announced as `length` bytes, or an error `status`."""
    body: bytes = b""
    status: int = 200
    length: int | None = None


class _Handler(http.server.SimpleHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        reply = self.server.replies.get(self.path.lstrip("/"))
        if reply is None:
            super().do_GET()
        elif reply.status != 200:
            self.send_error(reply.status)
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(reply.length or len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep pytest output clean


class _Server(http.server.ThreadingHTTPServer):
    requests: list[str]
    replies: dict[str, Reply]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"


@pytest.fixture(scope="session")
def shared_data(data_dir: Path) -> Path:
    """The verified copies the downloads are served from: conftest's data dir, checked and absolute."""
    return data_dir


@pytest.fixture
def serve(shared_data: Path) -> Iterator[Callable[[Path], _Server]]:
    """Start loopback servers of a folder, plus per-path canned replies; all stopped afterwards."""
    running: list[tuple[_Server, threading.Thread]] = []

    def start(root: Path = shared_data) -> _Server:
        server = _Server(("127.0.0.1", 0), partial(_Handler, directory=str(root)))
        server.requests, server.replies = [], {}
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        running.append((server, thread))
        return server

    yield start
    for server, thread in running:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def mirror(serve: Callable[..., _Server]) -> _Server:
    return serve()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> set[str]:
    """Every file under root, hidden temp files included, as relative paths."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def relpaths(*datasets: str) -> set[str]:
    return {f.relpath for d in datasets for f in files_of(d)}


def quiet(_: str) -> None:
    pass


def test_mirror_download_is_byte_identical(mirror: _Server, shared_data: Path, tmp_path: Path) -> None:
    paths = dl.download(tmp_path, mirror=mirror.url, timeout=10, log=quiet)

    assert paths == [tmp_path / f.relpath for f in FILES]
    assert tree(tmp_path) == relpaths("mnist", "wikitext-2")
    for f in FILES:
        assert sha256(tmp_path / f.relpath) == sha256(shared_data / f.relpath) == f.sha256
    assert dl.verify(tmp_path) == []


def test_second_run_skips_verified_files(mirror: _Server, tmp_path: Path) -> None:
    dl.download(tmp_path, mirror=mirror.url, timeout=10, log=quiet)
    mirror.requests.clear()
    lines: list[str] = []

    dl.download(tmp_path, mirror=mirror.url, timeout=10, log=lines.append)

    assert mirror.requests == []
    assert len(lines) == len(FILES) and all("checksum ok" in line for line in lines)


def test_force_downloads_again(mirror: _Server, tmp_path: Path) -> None:
    dl.download(tmp_path, ["mnist"], mirror=mirror.url, timeout=10, log=quiet)
    mirror.requests.clear()

    dl.download(tmp_path, ["mnist"], mirror=mirror.url, timeout=10, force=True, log=quiet)

    assert sorted(mirror.requests) == sorted(f"/{p}" for p in relpaths("mnist"))


@pytest.mark.parametrize("fault", ["truncated", "altered", "too long"])
def test_corrupt_server_leaves_nothing_behind(mirror: _Server, shared_data: Path, tmp_path: Path,
                                             fault: str) -> None:
    good = (shared_data / SMALL).read_bytes()
    mirror.replies[SMALL] = {
        "truncated": Reply(good[: len(good) // 2], length=len(good)),
        "altered": Reply(good[:100] + bytes([good[100] ^ 0xFF]) + good[101:]),
        "too long": Reply(good + b"\0"),
    }[fault]

    with pytest.raises(DataError, match=SMALL):
        dl.download(tmp_path, ["mnist"], mirror=mirror.url, timeout=10, log=quiet)

    assert tree(tmp_path) == relpaths("mnist") - {SMALL}  # the good ones stay, no bad or temp file


def test_404_fails_naming_the_file(mirror: _Server, tmp_path: Path) -> None:
    first = files_of("mnist")[0].relpath
    mirror.replies[first] = Reply(status=404)
    data_dir = tmp_path / "new" / "data"

    with pytest.raises(DataError, match=rf"{first}.*HTTP 404") as err:
        dl.download(data_dir, ["mnist"], mirror=mirror.url, timeout=10, log=quiet)

    assert "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []  # the folders it made for nothing are gone


def test_present_corrupt_file_is_replaced(mirror: _Server, tmp_path: Path) -> None:
    dl.download(tmp_path, ["mnist"], mirror=mirror.url, timeout=10, log=quiet)
    bad = tmp_path / SMALL
    bad.write_bytes(b"\0" * bad.stat().st_size)  # right size, wrong content: only sha256 can tell
    mirror.requests.clear()
    lines: list[str] = []

    dl.download(tmp_path, ["mnist"], mirror=mirror.url, timeout=10, log=lines.append)

    assert mirror.requests == [f"/{SMALL}"]
    assert any(SMALL in line and "sha256 mismatch" in line for line in lines)
    assert dl.verify(tmp_path, ["mnist"]) == []


def test_verify_reports_each_problem(shared_data: Path, tmp_path: Path) -> None:
    train, labels, *_ = files_of("mnist")
    (tmp_path / "mnist").mkdir()
    (tmp_path / train.relpath).write_bytes(b"short")
    (tmp_path / labels.relpath).write_bytes(b"\0" * labels.size)

    problems = dl.verify(tmp_path, ["mnist"])

    assert problems == [
        f"{train.relpath}: size 5 bytes, expected {train.size}",
        f"{labels.relpath}: sha256 mismatch",
        *(f"{f.relpath}: missing" for f in files_of("mnist")[2:]),
    ]
    assert dl.verify(shared_data) == []


def test_file_url_mirror(shared_data: Path, tmp_path: Path) -> None:
    dl.download(tmp_path, ["mnist"], mirror=shared_data.as_uri(), log=quiet)

    assert dl.verify(tmp_path, ["mnist"]) == []


@pytest.fixture
def canonical(serve: Callable[..., _Server], shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> _Server:
    """Point wikitext-2's canonical sources (zip, then per-file URLs) at a loopback server."""
    server = serve()
    monkeypatch.setitem(dl._ARCHIVES, "wikitext-2", (f"{server.url}/wikitext-2-v1.zip", "wikitext-2/"))

    def local_files_of(dataset: str) -> tuple[DataFile, ...]:
        return tuple(replace(f, urls=(f"{server.url}/gone/{f.name}", f"{server.url}/{f.relpath}"))
                     for f in files_of(dataset))

    monkeypatch.setattr(dl, "files_of", local_files_of)
    server.replies["wikitext-2-v1.zip"] = Reply(_wikitext_zip(shared_data, altered="wiki.train.tokens"))
    return server


def _wikitext_zip(shared_data: Path, altered: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for f in files_of("wikitext-2"):
            data = (shared_data / f.relpath).read_bytes()
            zf.writestr(f"wikitext-2/{f.name}", data[:-1] + b"?" if f.name == altered else data)
    return buf.getvalue()


def test_canonical_sources_zip_first_then_per_file(canonical: _Server, tmp_path: Path) -> None:
    dl.download(tmp_path, ["wikitext-2"], timeout=10, log=quiet)

    assert dl.verify(tmp_path, ["wikitext-2"]) == []
    assert tree(tmp_path) == relpaths("wikitext-2")  # the zip is gone too
    # Fetched once; train's member fails its checksum, so train falls through to its URLs in order.
    assert canonical.requests == ["/wikitext-2-v1.zip", "/gone/wiki.train.tokens",
                                  "/wikitext-2/wiki.train.tokens"]


def test_canonical_sources_all_failing(canonical: _Server, tmp_path: Path) -> None:
    canonical.replies["wikitext-2-v1.zip"] = Reply(status=503)
    canonical.replies["wikitext-2/wiki.train.tokens"] = Reply(status=404)

    with pytest.raises(DataError) as err:
        dl.download(tmp_path, ["wikitext-2"], timeout=10, log=quiet)

    message = str(err.value)
    assert message.startswith("could not download wikitext-2/wiki.train.tokens: ")
    assert message.count("HTTP 503") == 1 and message.count("HTTP 404") == 2
    assert list(tmp_path.iterdir()) == []


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench.data", *args], check=False, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.e2e
def test_cli_download_then_verify(mirror: _Server, tmp_path: Path) -> None:
    got = cli("download", "--mirror", mirror.url, "--data-dir", str(tmp_path), "--datasets", "mnist")

    assert got.returncode == 0, got.stderr
    assert dl.verify(tmp_path, ["mnist"]) == []
    assert cli("verify", "--data-dir", str(tmp_path), "--datasets", "mnist").returncode == 0
    assert cli("verify", "--data-dir", str(tmp_path)).returncode == 1  # wikitext-2 is missing


def one_line_error(got: subprocess.CompletedProcess[str]) -> str:
    lines = got.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), got.stderr
    assert "Traceback" not in got.stderr
    return lines[0]


@pytest.mark.e2e
def test_cli_failed_download_exits_1(mirror: _Server, tmp_path: Path) -> None:
    mirror.replies[SMALL] = Reply(status=404)

    got = cli("download", "--mirror", mirror.url, "--data-dir", str(tmp_path), "--datasets", "mnist")

    assert got.returncode == 1
    assert SMALL in one_line_error(got)


@pytest.mark.parametrize("args", [
    ["download", "--datasets", "mnist,imagenet"],
    ["download", "--mirror", "ftp://x"],
    ["download", "--timeout", "0"],
    ["download", "--bogus"],
    ["fetch"],
    [],
])
def test_cli_bad_input_exits_2(args: list[str], tmp_path: Path) -> None:
    """bench.data's main() in this process (test_cli holds its bad input as a process too)."""
    code, _, stderr = run_in_process("bench.data", *args, "--data-dir", str(tmp_path)) if args else \
        run_in_process("bench.data")

    assert code == 2
    assert one_line_error(subprocess.CompletedProcess([], code, "", stderr)).startswith("bench.data: error: ")
    assert list(tmp_path.iterdir()) == []
