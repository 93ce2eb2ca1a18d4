"""CONVENTIONS §3 at the command line: bad input is exit 2 with one line and no record; a valid run
this machine cannot do is exit 3 with a record saying why."""
from __future__ import annotations

import json

import pytest

from common.results import validate_record
from tests.conftest import run_cli

BASE = ["--backend", "torch_ddp", "--workload", "cnn", "--devices", "1"]

BAD_RUNS = {
    "missing backend": ["--workload", "cnn", "--devices", "1"],
    "unknown backend": ["--backend", "nope", "--workload", "cnn", "--devices", "1"],
    "unknown workload": ["--backend", "torch_ddp", "--workload", "gpt", "--devices", "1"],
    "zero devices": ["--backend", "torch_ddp", "--workload", "cnn", "--devices", "0"],
    "devices not a number": ["--backend", "torch_ddp", "--workload", "cnn", "--devices", "two"],
    "zero steps": [*BASE, "--steps", "0"],
    "steps and epochs": [*BASE, "--steps", "5", "--epochs", "1"],
    "negative epochs": [*BASE, "--epochs", "-1"],
    "negative batch": [*BASE, "--batch-size", "-4"],
    "unknown scaling": [*BASE, "--scaling", "diagonal"],
    "unknown data mode": [*BASE, "--data", "imaginary"],
    "real data missing": [*BASE, "--data", "real", "--data-dir", "/nonexistent/parbench"],
    "patience without eval": [*BASE, "--patience", "2"],
    "skip-eval with eval-every": [*BASE, "--skip-eval", "--eval-every", "2"],
    "warm-up swallows the run": [*BASE, "--steps", "5", "--warmup-steps", "5"],
    "strong batch not divisible": ["--backend", "torch_ddp", "--workload", "cnn", "--devices", "2",
                                   "--scaling", "strong", "--batch-size", "3"],
    "global batch beyond the dataset": [*BASE, "--batch-size", "100000", "--data", "synthetic"],
    "zero timeout": [*BASE, "--timeout", "0"],
    "resume without checkpoints": [*BASE, "--resume"],
    "unknown model size": [*BASE, "--model-size", "huge"],
    "unknown flag": [*BASE, "--frobnicate"],
    "unknown precision": [*BASE, "--precision", "fp8"],
}


@pytest.mark.parametrize("args", BAD_RUNS.values(), ids=BAD_RUNS.keys())
def test_bad_run_input_is_one_line_and_no_record(tmp_path, args):
    out = tmp_path / "out"
    proc = run_cli("bench.run", *args, "--out", str(out))
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("bench.run: error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (out / "runs").exists() or not any((out / "runs").iterdir())


def test_out_that_is_a_file_is_bad_input(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    proc = run_cli("bench.run", *BASE, "--out", str(target))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


BAD_SWEEPS = {
    "zero devices": ["--gpus", "0,1"],
    "letters": ["--gpus", "a,b"],
    "unknown backend": ["--backends", "torch_ddp,caffe"],
    "unknown workload": ["--workloads", "rnn"],
}


@pytest.mark.parametrize("args", BAD_SWEEPS.values(), ids=BAD_SWEEPS.keys())
def test_bad_sweep_input(tmp_path, args):
    proc = run_cli("bench.compare", *args, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "out").exists()


UNSUPPORTED = {
    "cuda on a machine without": ([*BASE, "--device-kind", "cuda"], "CUDA devices requested"),
    "SyncBatchNorm on CPU ranks": (["--backend", "torch_ddp", "--workload", "cnn", "--devices", "2", "--sync-bn"],
                                   "SyncBatchNorm"),
}


@pytest.mark.parametrize("args, reason", UNSUPPORTED.values(), ids=UNSUPPORTED.keys())
def test_unsupported_writes_a_record_and_exits_3(tmp_path, args, reason):
    out = tmp_path / "out"
    proc = run_cli("bench.run", *args, "--data", "synthetic", "--out", str(out))
    assert proc.returncode == 3, proc.stderr
    [path] = (out / "runs").glob("*.json")
    record = json.loads(path.read_text())
    assert record["status"] == "unsupported" and reason in record["error"]
    assert validate_record(record) == []
