"""Two sweeps started at once on one machine, into the same results folder, do not collide: ports,
run ids, checkpoints, logs and summary.csv stay apart or stay consistent."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pandas as pd
import pytest

from common import launch
from common.results import load_records, validate_record
from tests.conftest import REPO

pytestmark = pytest.mark.e2e  # every test here starts processes

SWEEP = ["--gpus", "1,2", "--backends", "torch_ddp", "--workloads", "mlm", "--model-size", "tiny", "--steps", "3",
         "--warmup-steps", "1", "--batch-size", "4", "--skip-eval", "--data", "real",
         # checkpoints too: their default folder is derived from the run, not unique to it
         "--checkpoint-every", "2", "--timeout", "240", "--collective-timeout", "60"]


@pytest.mark.timeout(420)
def test_two_sweeps_at_once_share_a_results_folder(tmp_path, data_dir):
    out = tmp_path / "results"
    sweeps = [subprocess.Popen([sys.executable, "-m", "bench.compare", *SWEEP, "--out", str(out)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = []
    for proc in sweeps:
        try:
            outputs.append(proc.communicate(timeout=400)[0])
        except subprocess.TimeoutExpired:
            for p in sweeps:
                p.kill()
            pytest.fail("a sweep did not finish")
    assert [p.returncode for p in sweeps] == [0, 0], "\n".join(o[-3000:] for o in outputs)

    records = load_records(out)
    assert len(records) == 4, [r["run_id"] for r in records]
    assert all(validate_record(r) == [] for r in records)
    assert [r["status"] for r in records] == ["ok"] * 4, [r["error"] for r in records]
    assert len({r["run_id"] for r in records}) == 4
    sweep_ids = {r["sweep_id"] for r in records}
    assert len(sweep_ids) == 2
    assert sorted(r["devices"] for r in records) == [1, 1, 2, 2]
    # Each run checkpointed into its own sweep's folder, and each has its own log folder.
    for sweep in sweep_ids:
        assert len(list((out / "checkpoints" / sweep).iterdir())) == 2
    assert len([d for d in (out / "logs").iterdir() if not d.name.startswith("sweep-")]) == 4

    # Whichever sweep wrote summary.csv last read every record: one row per run, none lost.
    summary = pd.read_csv(out / "summary.csv")
    assert sorted(summary.run_id) == sorted(r["run_id"] for r in records)
    assert summary.scaling_efficiency.notna().sum() == 4  # each sweep's N=2 against its own N=1


def test_a_port_stays_leased_while_its_holder_lives(tmp_path, monkeypatch):
    """free_port hands a port to one live process only; a dead holder's lease is taken over."""
    monkeypatch.setattr(launch, "PORT_LEASE_DIR", tmp_path)
    port = launch.free_port()
    assert (tmp_path / str(port)).read_text() == str(os.getpid())
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / "40001").write_text(str(holder.pid))
        assert not launch._lease(40001)  # another sweep's bench.run holds it
    finally:
        holder.kill()
        holder.wait()
    assert launch._lease(40001)  # its holder is gone
    assert (tmp_path / "40001").read_text() == str(os.getpid())


@pytest.mark.timeout(240)
def test_torch_ddp_starts_again_when_its_rendezvous_port_is_taken(tmp_path, data_dir, monkeypatch):
    """A process outside parbench binds the picked port before torchrun does: the run moves to another."""
    from backends.torch_common import launch as torch_launch
    from backends.torch_ddp import backend as ddp
    from bench import run as bench_run

    with socket.create_server(("127.0.0.1", 0)) as stranger:
        picks = iter([stranger.getsockname()[1]])
        monkeypatch.setattr(torch_launch, "free_port", lambda: next(picks, None) or launch.free_port())
        args = bench_run.build_parser().parse_args([
            "--backend", "torch_ddp", "--workload", "cnn", "--devices", "1", "--steps", "2", "--warmup-steps", "1",
            "--skip-eval", "--data", "real", "--device-kind", "cpu", "--out", str(tmp_path)])
        backend = ddp.TorchDDP()
        plan = backend.plan_devices(1, "cpu", 1)
        outcome = backend.run(bench_run.build_config(args, "port-taken", plan), plan, tmp_path)
    assert outcome["measured_steps"] == 1
    assert "EADDRINUSE" in (tmp_path / "torchrun.log").read_text()  # the first attempt met the stranger
