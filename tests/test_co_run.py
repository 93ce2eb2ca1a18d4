"""bench.co_run: the copies run side by side, are reaped, and their medians become the reference's section."""
from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from bench import co_run
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
