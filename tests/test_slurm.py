"""SLURM for real: a slurmctld and two slurmd (tests/slurm_cluster.py), each slurmd in its own network namespace,
started once per test session; every client and test process runs inside a namespace. Plus the allocation
reading's checks that need no daemon (common.scheduler).

What is held: a bench.slurm script submitted with sbatch runs two-node runs that finish ok, whose records say
the nodes, the job and which ranks ran where; scancel leaves no process and no ok record; a drained node
leaves the job waiting (SLURM's choice) with nothing started; bench.run outside a usable allocation, or with
flags that contradict it, says why in one line.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.errors import BadInput
from common.results import NODE_RECORDS, RUN_RECORDS, SCHEDULER_FIELDS, validate_record
from common.scheduler import (
    PORT_BASE,
    PORT_SPAN,
    SlurmStep,
    check_port_free,
    job_node_count,
    slurm_step,
    srun_command,
)
from tests.conftest import REPO, run_cli
from tests.netns import or_unavailable
from tests.slurm_cluster import NODES, slurm_cluster, why_unavailable

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
TINY = ["--workloads", "mlm", "--gpus", "1", "--steps", "4", "--warmup-steps", "1", "--batch-size", "4",
        "--skip-eval", "--data", "synthetic", "--threads-per-device", "1", "--collective-timeout", "120",
        "--timeout", "300"]


# ---- the cluster ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def cluster():
    with or_unavailable(why_unavailable, slurm_cluster, "cannot start a SLURM cluster in two network namespaces") as c:
        yield c


def _submit_sweep(cluster, folder: Path, *args: str) -> str:
    """bench.slurm --submit from namespace A, started in `folder` (the job's working directory and its
    slurm-<id>.out); the job id it prints."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**cluster.env, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cluster.command([sys.executable, "-m", "bench.slurm", "--nodes", "2", "--submit", *args]),
                          cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().isdigit(), done.stderr
    return done.stdout.strip()


def _submit_script(cluster, folder: Path, body: str, *sbatch: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "job.sh"
    script.write_text(f"#!/bin/bash\ncd {REPO}\n{body}\n")
    return cluster.must("sbatch", "--parsable", f"--chdir={folder}", f"--output={folder}/slurm-%j.out",
                        *sbatch, str(script)).strip().split(";")[0]


def _wait(cluster, job_id: str, timeout: float, until=TERMINAL) -> str:
    """Poll squeue (sbatch --wait polls every 2 to 8 s) until the job's state is in `until`."""
    deadline, state = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        state, _ = cluster.job_state(job_id)
        if state in until:
            return state
        time.sleep(0.5)
    cluster.run("scancel", job_id)
    pytest.fail(f"job {job_id} still {state or 'unknown'} after {timeout:.0f} s: {cluster.log_tail()}")


def _records(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def _job_processes(cluster) -> dict[str, list[str]]:
    """Per namespace, the command lines of every process but the cluster's daemons (and slurmctld's script
    helper) and the test's own clients: what a job left."""
    daemons = {int(p.read_text().split()[0]) for p in cluster.root.glob("*.pid")}
    found = {}
    for host in cluster.hosts:
        pids = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True).stdout.split()
        lines = []
        for pid in (int(p) for p in pids if p.isdigit() and int(p) not in daemons):
            try:
                lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip())
            except OSError:  # gone meanwhile
                continue
        found[host.netns] = [ln for ln in lines if ln and not ln.startswith(("squeue", "ip "))
                             and "slurmscriptd" not in ln]
    return found


# ---- end to end ----------------------------------------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_sbatch_sweep_runs_two_node_runs(cluster, tmp_path):
    """torch_ddp and tf_mirrored multi_worker, one job step each over both nodes, one record each."""
    out = tmp_path / "out"
    started = time.monotonic()
    job = _submit_sweep(cluster, tmp_path, "--backends", "torch_ddp,tf_mirrored", "--tf-mode", "multi_worker",
                        *TINY, "--out", str(out))
    state = _wait(cluster, job, 360)
    wall = time.monotonic() - started
    log = next(tmp_path.glob("slurm-*.out")).read_text()
    assert state == "COMPLETED", log[-3000:]
    records = _records(out / RUN_RECORDS)
    assert sorted(r["backend"] for r in records) == ["tf_mirrored", "torch_ddp"], log[-3000:]
    for record in records:
        assert validate_record(record) == [] and record["status"] == "ok", record.get("error")
        assert (record["nnodes"], record["devices_per_node"], record["devices"]) == (2, 1, 2)
        sched = record["scheduler"]
        assert (sched["name"], sched["job_id"], sched["nodes"], sched["restart_count"]) == ("slurm", job,
                                                                                              list(NODES), 0)
        # Which ranks ran on which node: rank 0 on A's address, rank 1 on B's.
        assert [(h["node_rank"], h["address"], h["ranks"]) for h in record["nodes"]["hosts"]] == \
            [(0, cluster.hosts[0].address, [0]), (1, cluster.hosts[1].address, [1])]
        assert record["nodes"]["master"].startswith(f"{cluster.hosts[0].address}:")
    assert sorted(r["scheduler"]["step_id"] for r in records) == ["0", "1"]  # one job step per run
    assert sorted(r["run_id"] for r in _records(out / NODE_RECORDS)) == sorted(r["run_id"] for r in records)
    assert (out / "summary.csv").is_file()
    print(f"\n2-node sweep job {job}: {wall:.0f} s from submit to COMPLETED; "
          + "; ".join(f"{r['backend']} nodes {r['nodes']} scheduler {r['scheduler']}" for r in records))


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_scancel_leaves_no_process_and_no_ok_record(cluster, tmp_path):
    """SLURM stops a job the same way at its time limit: SIGTERM to every step and to the batch script. The
    sweep's first run (torch_dp: one host, so refused on two nodes) finishes; the second is cancelled while
    training: it leaves no record and no process, the first one's record stays, the summary is rewritten."""
    out = tmp_path / "out"
    job = _submit_sweep(cluster, tmp_path, "--backends", "torch_dp,torch_ddp", *TINY, "--steps", "100000",
                        "--out", str(out))
    _wait(cluster, job, 60, until={"RUNNING", *TERMINAL})
    deadline = time.monotonic() + 150
    while not all(any("worker" in c for c in cmds) for cmds in _job_processes(cluster).values()):
        assert time.monotonic() < deadline, f"the run's workers did not start on both nodes: {_job_processes(cluster)}"
        time.sleep(0.5)
    cancelled = time.monotonic()
    cluster.must("scancel", job)
    while any(_job_processes(cluster).values()):
        assert time.monotonic() - cancelled < 30, f"left after scancel: {_job_processes(cluster)}"
        time.sleep(0.2)
    gone = time.monotonic() - cancelled
    assert _wait(cluster, job, 30) == "CANCELLED"
    records = _records(out / RUN_RECORDS)
    assert [(r["backend"], r["status"]) for r in records] == [("torch_dp", "invalid")], records
    assert "runs on one host" in records[0]["error"] and records[0]["devices"] == 2
    assert records[0]["run_id"] in (out / "summary.csv").read_text()
    assert "bench.compare: cancelled by SIGTERM" in next(tmp_path.glob("slurm-*.out")).read_text()
    print(f"\nscancel of job {job}: no process of it on either node after {gone:.1f} s")


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_a_drained_node_leaves_the_job_waiting_with_nothing_started(cluster, tmp_path):
    cluster.must("scontrol", "update", f"NodeName={NODES[1]}", "State=DRAIN", "Reason=parbench test")
    try:
        job = _submit_sweep(cluster, tmp_path, "--backends", "torch_ddp", *TINY, "--out", str(tmp_path / "out"))
        time.sleep(3)  # a few scheduling passes: it would have started by now
        state, reason = cluster.job_state(job)
        assert state == "PENDING" and reason.strip(), (state, reason)
        assert not any(_job_processes(cluster).values()) and not (tmp_path / "out").exists()
        cluster.must("scancel", job)
        assert _wait(cluster, job, 30) == "CANCELLED"
    finally:
        cluster.must("scontrol", "update", f"NodeName={NODES[1]}", "State=RESUME")
        cluster.wait_idle()


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_bench_run_refuses_what_it_cannot_span_in_one_line(cluster, tmp_path):
    """In a two-node job: bench.run in the batch script itself (one node of two), two tasks per node, and a
    flag that contradicts the step; each bench.run says why in one line and exits 2, before any framework."""
    run = f"{sys.executable} -m bench.run --backend torch_ddp --workload mlm --devices 1 --out {tmp_path}/out"
    step = "srun --nodes=2 --kill-on-bad-exit=0"
    body = "\n".join([f"{run}; echo rc=$?", f"{step} --ntasks=4 --ntasks-per-node=2 {run}; echo rc=$?",
                      f"{step} --ntasks-per-node=1 {run} --nnodes 3; echo rc=$?",
                      f"{step} --ntasks-per-node=1 {run} --master-addr 10.9.9.9; echo rc=$?"])
    job = _submit_script(cluster, tmp_path, body, "--nodes=2", "--ntasks-per-node=1", "--exclusive",
                         f"--export=ALL,PYTHONPATH={REPO}")
    _wait(cluster, job, 150)
    log = (tmp_path / f"slurm-{job}.out").read_text()
    errors = [ln for ln in log.splitlines() if ln.startswith("bench.run: error:")]
    assert [ln for ln in log.splitlines() if ln.startswith("rc=")] == ["rc=2"] * 4, log
    assert "this is its batch script" in errors[0], log
    assert sum("one task per node" in ln for ln in errors) == 4, log  # each of the 4 tasks
    assert sum("--nnodes 3 contradicts SLURM job" in ln for ln in errors) == 2, log
    assert sum("--master-addr 10.9.9.9 contradicts" in ln for ln in errors) == 2, log
    assert not (tmp_path / "out" / RUN_RECORDS).exists()


# ---- no daemon -----------------------------------------------------------------------------------------------

STEP_ENV = {"SLURM_JOB_ID": "4711", "SLURMD_NODENAME": "n2", "SLURM_STEP_ID": "3", "SLURM_STEP_NODELIST": "n[1-2]",
            "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2"}


@pytest.mark.parametrize("env, message", [
    ({"SLURM_JOB_ID": "4711"}, "runs outside the job's nodes"),
    ({"SLURM_JOB_ID": "x1", "SLURMD_NODENAME": "n1"}, "is not a job id"),
    ({"SLURM_JOB_ID": "4711", "SLURMD_NODENAME": "n1", "SLURM_JOB_NUM_NODES": "2"}, "this is its batch script"),
    ({**STEP_ENV, "SLURM_STEP_NODELIST": ""}, "has no nodes"),
    ({**STEP_ENV, "SLURM_STEP_NUM_TASKS": "4"}, "one task per node"),
])
def test_an_allocation_bench_run_cannot_span_is_bad_input(env, message):
    with pytest.raises(BadInput, match=message):
        slurm_step(env)


def test_a_missing_scontrol_is_bad_input_never_a_world_of_one(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BadInput, match="scontrol is not on PATH"):
        slurm_step(STEP_ENV)


def test_outside_slurm_there_is_no_step():
    assert slurm_step({"PATH": os.environ.get("PATH", "")}) is None


def _step(node: str = "n2", gpus: int | None = None, nodes=("n1",)) -> SlurmStep:
    return SlurmStep("4711", "3", (*nodes, node) if node not in nodes else nodes, node, 0, gpus)


def test_node_flags_that_contradict_the_step_are_bad_input():
    with pytest.raises(BadInput, match="--nnodes 3 contradicts SLURM job 4711 step 3"):
        _step().world(nnodes=3, devices=1)
    with pytest.raises(BadInput, match="--node-rank 0 contradicts .* n2 is node 1"):
        _step().world(node_rank=0, devices=1)
    with pytest.raises(BadInput, match="gave this task no GPUs"):
        _step(nodes=("n2",)).world()
    with pytest.raises(BadInput, match="--devices 8: .* gave this task 4 GPU"):
        _step(nodes=("n2",), gpus=4).world(devices=8)


def test_a_one_node_step_sets_the_world_without_scontrol():
    assert _step(nodes=("n2",), gpus=4).world() == _step(nodes=("n2",), gpus=4).world(nnodes=1, node_rank=0)
    world = _step(nodes=("n2",), gpus=4).world(devices=2)
    assert (world.nnodes, world.node_rank, world.devices, world.master_addr) == (1, 0, 2, None)


def test_record_section_and_port_are_the_schema_and_in_range():
    step = _step()
    assert tuple(step.record()) == SCHEDULER_FIELDS and step.record()["nodes"] == ["n1", "n2"]
    assert validate_record({"scheduler": step.record()}) == validate_record({"scheduler": None})
    ports = {SlurmStep(str(j), str(s), ("a",), "a", 0, None).rendezvous_port() for j in (1, 999, 1000, 123456)
             for s in (0, 1, 9)}
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports) and len(ports) >= 9
    assert step.rendezvous_port() == SlurmStep("4711", "3", ("x",), "x", 1, None).rendezvous_port()
    assert SlurmStep("4711", "interactive", ("x",), "x", 0, None).rendezvous_port() == PORT_BASE + 7110
    assert step.run_tag() == "slurm4711.3" and SlurmStep("4711", None, ("x",), "x", 1, None).run_tag() == \
        "slurm4711.batchr1"


def test_node_0_refuses_a_derived_port_that_is_taken_in_one_line():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(BadInput, match=f"rendezvous port {port} .* is taken on 127.0.0.1.*--master-port"):
            check_port_free("127.0.0.1", port, _step())
    check_port_free("127.0.0.1", port, _step())  # free again once the listener is gone


def test_srun_command_and_job_nodes():
    assert srun_command(2, {"SLURM_CPUS_ON_NODE": "8"}) == [
        "srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--cpus-per-task=8"]
    assert job_node_count({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "3"}) == 3
    with pytest.raises(BadInput, match="not inside a SLURM job"):
        job_node_count({})


@pytest.mark.e2e
def test_bench_run_outside_a_usable_allocation_says_why_in_one_line(tmp_path):
    """A shell holding a job's variables (salloc's, on the login node) is not on the job's nodes."""
    proc = run_cli("bench.run", "--backend", "torch_ddp", "--workload", "mlm", "--devices", "1", "--out",
                   str(tmp_path), env={"SLURM_JOB_ID": "4711", "SLURMD_NODENAME": ""}, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "runs outside the job's nodes" in proc.stderr and not (tmp_path / RUN_RECORDS).exists()


def test_bench_slurm_prints_a_script_that_runs_bench_compare_over_the_job(capsys, tmp_path, monkeypatch):
    from bench import slurm

    monkeypatch.chdir(tmp_path)
    assert slurm.main(["--nodes", "2", "--time", "01:00:00", "--account", "proj x", "--gpus", "1,2",
                       "--backends", "torch_ddp", "--timeout", "60"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("#!/bin/bash\n") and "#SBATCH --nodes=2\n" in text and "#SBATCH --time=01:00:00\n" in text
    assert "#SBATCH '--account=proj x'\n" in text and "--partition" not in text  # untouched, quoted, only if given
    assert f"cd {tmp_path}\n" in text
    assert text.rstrip().endswith(f"exec {sys.executable} -m bench.compare --srun --gpus 1,2 --backends torch_ddp "
                                  "--timeout 60")
    for argv, message in ((["--nodes", "2", "--gpus", "x"], "--gpus/--devices"), (["--gpus", "1"], "--nodes"),
                          (["--nodes", "2", "--srun"], "set by the script itself")):
        with pytest.raises(SystemExit) as exit_:
            slurm.main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
