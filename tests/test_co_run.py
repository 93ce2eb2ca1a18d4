"""bench.co_run: the copies run side by side, are reaped, and their medians become the reference's section."""
from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import sys

import pytest

from bench import co_run
from common.errors import Cancelled
from common.launch import REPO_ROOT
from common.sections import CoRun

REFERENCE = {"run_id": "ref", "step_time_s": {"p50": 0.5}}


def stop(proc: subprocess.Popen, sig: int = 15) -> None:
    proc.kill()
    proc.wait()


def leaves_a_record(p50: float, status: str = "ok"):
    """A stand-in for bench.run that writes one record of that median step into the folder it is given."""
    def command(folder):
        record = json.dumps({"run_id": f"copy-{folder.name}", "status": status, "step_time_s": {"p50": p50}})
        return ["sh", "-c", f"mkdir -p {folder}/runs && echo {shlex.quote(record)} > {folder}/runs/r.json"]
    return command


def test_the_copies_medians_over_the_reference_s_become_its_section(tmp_path):
    section = co_run.probe(REFERENCE, 2, leaves_a_record(0.52), tmp_path, 30, stop)
    assert section == CoRun(processes=2, step_s_p50=[0.52, 0.52], slowdown=pytest.approx(1.04),
                            run_ids=["copy-0", "copy-1"])
    assert sorted(p.name for p in (tmp_path / "co-run" / "ref").iterdir()) == ["0", "1"]
    path = tmp_path / "ref.json"
    path.write_text(json.dumps({**REFERENCE, "status": "ok"}))
    co_run.attach(path, section)
    written = json.loads(path.read_text())
    assert CoRun.from_record(written) == section and written["status"] == "ok"


def test_a_copy_without_an_ok_record_measures_nothing_and_says_so(tmp_path, capsys):
    assert co_run.probe(REFERENCE, 2, leaves_a_record(0.52, "failed"), tmp_path, 30, stop) is None
    assert "a copy left no ok record" in capsys.readouterr().out


def test_a_copy_past_its_time_is_stopped_and_reaped(tmp_path):
    stopped = []

    def stop_and_note(proc, sig=15):
        stop(proc)
        stopped.append(proc.returncode)
    assert co_run.probe(REFERENCE, 2, lambda folder: ["sleep", "30"], tmp_path, 0.2, stop_and_note) is None
    assert len(stopped) == 2 and all(rc is not None for rc in stopped)


def test_each_copy_runs_in_its_own_session_with_the_repo_on_its_path_no_stdin_and_one_log(tmp_path, monkeypatch):
    """A copy is its own process group (stopped as one, never by the harness's Ctrl-C), reads nothing of the
    harness's stdin, imports this checkout, and leaves what it printed and its errors in its folder's log."""
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    read, write = os.pipe()  # the harness's stdin a pipe: a copy that inherited it would read from it
    saved = os.dup(0)
    os.dup2(read, 0)
    try:
        def command(folder):
            record = json.dumps({"run_id": f"copy-{folder.name}", "status": "ok", "step_time_s": {"p50": 0.5}})
            return ["sh", "-c", f"echo out; echo err >&2; readlink /proc/self/fd/0 > {folder}/stdin; "
                    f"cut -d' ' -f6 /proc/$$/stat > {folder}/session; echo $$ > {folder}/pid; "
                    f"echo \"$PYTHONPATH\" > {folder}/pythonpath; mkdir -p {folder}/runs; "
                    f"echo {shlex.quote(record)} > {folder}/runs/r.json"]
        assert co_run.probe(REFERENCE, 2, command, tmp_path, 30, stop) is not None
    finally:
        os.dup2(saved, 0)
        os.close(saved), os.close(read), os.close(write)
    for i in (0, 1):
        folder = tmp_path / "co-run" / "ref" / str(i)
        assert (folder / "bench.run.log").read_text() == "out\nerr\n"
        assert (folder / "stdin").read_text() == "/dev/null\n"
        assert (folder / "session").read_text() == (folder / "pid").read_text()
        assert (folder / "pythonpath").read_text() == f"{REPO_ROOT}{os.pathsep}/elsewhere\n"


def test_the_slowdown_is_the_copies_median_over_the_reference_s_from_each_copy_s_ok_record(tmp_path):
    def command(folder):
        p50 = {"0": 0.9, "1": 0.5, "2": 0.6}[folder.name]
        failed = json.dumps({"run_id": "failed-first", "status": "failed", "step_time_s": {"p50": 9.0}})
        ok = json.dumps({"run_id": f"copy-{folder.name}", "status": "ok", "step_time_s": {"p50": p50}})
        return ["sh", "-c", f"mkdir -p {folder}/runs && echo {shlex.quote(failed)} > {folder}/runs/a.json && "
                f"echo {shlex.quote(ok)} > {folder}/runs/b.json"]
    # 0.9, 0.5 and 0.6: the median 0.6 over the reference's 0.5
    section = co_run.probe(REFERENCE, 3, command, tmp_path, 30, stop)
    assert section == CoRun(processes=3, step_s_p50=[0.9, 0.5, 0.6], slowdown=pytest.approx(1.2),
                            run_ids=["copy-0", "copy-1", "copy-2"])
    # Probed again into the same folders: the copies overwrite their records, nothing refuses.
    assert co_run.probe(REFERENCE, 3, command, tmp_path, 30, stop) == section


def test_a_copy_without_an_ok_record_is_named_with_the_folder_of_the_logs(tmp_path, capsys):
    assert co_run.probe(REFERENCE, 1, lambda folder: ["true"], tmp_path, 30, stop) is None
    assert capsys.readouterr().out == f"co-run probe of ref: a copy left no ok record (logs in " \
        f"{tmp_path / 'co-run' / 'ref'}); side by side not measured\n"


def test_a_cancel_stops_every_copy_started_with_its_signal_and_goes_on_up(tmp_path):
    started, stopped = [], []

    def command(folder):
        if folder.name == "2":
            raise Cancelled(signal.SIGINT)
        started.append(folder.name)
        return ["sleep", "30"]

    def stop_and_note(proc, sig=15):
        stopped.append(sig)
        stop(proc)
    with pytest.raises(Cancelled):
        co_run.probe(REFERENCE, 3, command, tmp_path, 30, stop_and_note)
    assert started == ["0", "1"] and stopped == [signal.SIGINT, signal.SIGINT]   # Ctrl-C's, not stop's default


def test_the_reason_nothing_was_measured_reaches_the_log_at_once(tmp_path, monkeypatch):
    """A harness's stdout to a file is buffered: the line is flushed, so that the log says why before what follows
    (the next run's output, or a crash)."""
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8"))
    assert co_run.probe(REFERENCE, 1, lambda folder: ["true"], tmp_path, 30, stop) is None
    assert raw.getvalue().decode().endswith("side by side not measured\n")
