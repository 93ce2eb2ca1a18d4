"""DistributedDataParallel on CPU ranks: correctness against one device, resume, and the harness end to end."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from backends.torch_common.launch import Torchrun, plan_over, process_group_backend
from backends.torch_common.models import build_model
from backends.torch_common.torchrun import failure_report
from backends.torch_common.trainer import CHECKPOINT_EXT, TorchTrainer
from common import loop
from common.checkpoints import valid_checkpoints
from common.config import RunConfig
from common.data.batches import TrainBatches
from common.data.datasets import SplitData, load_split
from common.errors import Unsupported
from common.loop import FAULT_AFTER_STEP_ENV, FAULT_MARKER_ENV, FAULT_RANK_ENV, run_loop
from common.results import validate_record
from common.spec import BERT_SIZES, CNN
from tests import faults
from tests.conftest import assert_profiled, assert_tensorboard_log_is_the_record, chrome_trace_steps, run_cli


def _run(out: Path, *args: str, env: dict | None = None):
    proc = run_cli("bench.run", "--backend", "torch_ddp", "--out", str(out), "--data", "real", *args, env=env)
    records = sorted((out / "runs").glob("*.json"), key=lambda p: p.stat().st_mtime)
    return proc, (json.loads(records[-1].read_text()) if records else None)


def _params(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    _, newest = next(valid_checkpoints(ckpt_dir, CHECKPOINT_EXT, []))
    state = torch.load(newest, weights_only=True)["model"]
    # BatchNorm running statistics are buffers, not parameters: DDP broadcasts rank 0's, so they
    # legitimately differ from a single device's.
    return {k: v for k, v in state.items() if "running_" not in k and "num_batches" not in k}


def _assert_same_params(a: dict, b: dict, rtol: float):
    assert a.keys() == b.keys()
    for k in a:
        rel = (a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-12)
        assert rel <= rtol, f"{k}: relative difference {rel:.2e}"


# Two ranks against one device on the same global batch (the CNN's BatchNorm as two accumulated micro-batches) is
# bench.parity's "torch_ddp: 2 devices = 1 device x 2 micro-batches", for both workloads (tests/test_parity.py).


RESUME_RUN = ["--workload", "cnn", "--devices", "2", "--batch-size", "16", "--steps", "6", "--warmup-steps", "1",
              "--checkpoint-every", "3", "--skip-eval"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_dir):
    """The reference for the resume tests: (record, checkpoint dir) of a run nothing interrupts."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    p, full = _run(tmp / "out", *RESUME_RUN, "--checkpoint-dir", str(tmp / "full"), "--tensorboard", str(tmp / "tb"))
    assert p.returncode == 0, p.stderr
    return full, tmp / "full"


@pytest.mark.e2e
def test_the_tensorboard_log_is_the_records(uninterrupted):
    """--tensorboard: rank 0 of the 2-rank run logs the global loss curve, learning rate and step times."""
    full, full_ckpt = uninterrupted
    assert_tensorboard_log_is_the_record(full_ckpt.parent / "tb", full)


@pytest.mark.e2e
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path, uninterrupted):
    full, full_ckpt = uninterrupted
    # Both ranks die after step 4; the checkpoint of step 3 survives and step 4 is redone.
    p, crashed = _run(tmp_path / "out", *RESUME_RUN, "--checkpoint-dir", str(tmp_path / "resumed"),
                      env={FAULT_AFTER_STEP_ENV: "4"})
    assert p.returncode == 1 and crashed["status"] == "failed"
    assert "exited with code" in crashed["error"] and validate_record(crashed) == []
    p, resumed = _run(tmp_path / "out", *RESUME_RUN, "--checkpoint-dir", str(tmp_path / "resumed"), "--resume")
    assert p.returncode == 0, p.stderr
    assert resumed["start_step"] == 3 and resumed["steps_done"] == 6
    assert resumed["measured_steps"] == 2  # steps 5 and 6; step 4 is this process's warm-up
    _assert_same_params(_params(tmp_path / "resumed"), _params(full_ckpt), rtol=0.0)
    assert resumed["loss"]["last"] == full["loss"]["last"]


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_torchrun_restarts_after_a_dead_rank_and_ends_where_an_uninterrupted_run_ends(tmp_path, uninterrupted):
    """--max-restarts 1: rank 1 exits hard after step 4 (once: the marker stops it from doing so again);
    torchrun restarts both ranks, which resume from the step-3 checkpoint and finish bit-identical."""
    full, full_ckpt = uninterrupted
    env = {FAULT_AFTER_STEP_ENV: "4", FAULT_RANK_ENV: "1", FAULT_MARKER_ENV: str(tmp_path / "fault")}
    p, elastic = _run(tmp_path / "out", *RESUME_RUN, "--max-restarts", "1", "--checkpoint-dir",
                      str(tmp_path / "elastic"), env=env)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "fault.rank1").exists(), "the fault never fired"
    assert elastic["status"] == "ok" and validate_record(elastic) == []
    assert elastic["backend_metrics"]["restarts"] == 1
    assert elastic["config"]["max_restarts"] == 1
    assert elastic["start_step"] == 3 and elastic["steps_done"] == 6
    _assert_same_params(_params(tmp_path / "elastic"), _params(full_ckpt), rtol=0.0)
    assert elastic["loss"]["last"] == full["loss"]["last"]


@pytest.mark.e2e
def test_compare_one_and_two_devices_on_real_mnist(torch_sweep):
    """bench.compare --gpus 1,2 on real MNIST (the sweep of both torch backends, conftest.TORCH_SWEEP)."""
    proc, out = torch_sweep
    assert proc.returncode == 0, proc.stderr
    records = [r for r in (json.loads(p.read_text()) for p in (out / "runs").glob("*.json"))
               if r["backend"] == "torch_ddp"]
    assert sorted(r["devices"] for r in records) == [1, 2]
    for r in records:
        assert validate_record(r) == [], r["run_id"]
        assert r["status"] == "ok" and r["data"] == "real" and r["virtual"] and r["device_kind"] == "cpu"
        assert r["measured_steps"] == 6 and r["eval"]["count"] == 10000
        assert r["params"] == r["backend_metrics"]["trainable_params"] == 2_328_298 and "params_note" not in r
        assert r["threads_per_device"] == r["config"]["threads_per_device"]
        assert r["samples_per_s"] > 0 and r["achieved_flops"] == pytest.approx(r["samples_per_s"] * 69_257_088)
        memory = r["memory"]
        assert len(memory["training_per_rank"]) == len(memory["process_peak_per_rank"]) == r["devices"]
        # gradients and AdamW's two moments of 2.3M float32 parameters at least, the process's peak at most
        assert all(3 * 4 * 2_328_298 <= t < p for t, p in zip(memory["training_per_rank"],
                                                               memory["process_peak_per_rank"]))
        assert r["mfu"] is None and 0 < r["mfu_achievable"] < 1  # a CPU: the measured peak is the only one
        assert_profiled(r, chrome_trace_steps)  # --profile 2 (conftest.TORCH_SWEEP)
        assert r["backend_metrics"]["fast_path"]["options"]["fused_adamw"] is True
    two = next(r for r in records if r["devices"] == 2)["backend_metrics"]["attribution"]["categories"]
    assert two["all_reduce"]["seconds"] > 0  # DDP's gradient all-reduce, seen by the profiler on 2 ranks
    assert len({r["sweep_id"] for r in records}) == 1
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 4  # torch_dp's two rows too
    by_n = summary[summary.backend == "torch_ddp"].set_index("devices")
    assert by_n.loc[1, "scaling_efficiency"] == pytest.approx(1.0)
    expected = by_n.loc[2, "samples_per_s"] / (2 * by_n.loc[1, "samples_per_s"])
    assert by_n.loc[2, "scaling_efficiency"] == pytest.approx(expected)
    assert (by_n.mfu_achievable > 0).all()
    assert "torch_ddp" in proc.stdout and "ok" in proc.stdout  # the table


def _in_process_config(tmp_path, **overrides) -> RunConfig:
    base = dict(run_id="t", backend="torch_ddp", workload="cnn", devices=1, device_kind="cpu",
                threads_per_device=1, scaling="weak", batch_size=32, per_device_batch=32, grad_accum=1,
                data="real", data_dir="", seed=0, total_steps=40, warmup_steps=3, out=str(tmp_path))
    return RunConfig(**{**base, **overrides})


@pytest.mark.usefixtures("one_torch_thread")
def test_loop_warmup_exclusion(tmp_path, data_dir):
    """The common loop with the real torch trainer in one process, on a small slice of real MNIST, evaluated every
    2 steps without early stopping (--patience 0): every step runs."""
    cfg = _in_process_config(tmp_path, eval_every=2, total_steps=20)
    train = load_split("cnn", "train", "real", data_dir, CNN, 0)
    test = load_split("cnn", "test", "real", data_dir, CNN, 0)
    small_eval = SplitData("cnn", "test", False, {k: v[:200] for k, v in test.arrays.items()})
    torch.manual_seed(0)
    model = build_model("cnn", CNN)
    outcome = run_loop(TorchTrainer(model, model, cfg, torch.device("cpu")), cfg,
                       TrainBatches(train, CNN, 0, 32, 1, 0), small_eval)
    assert not outcome["stopped_early"] and outcome["steps_done"] == cfg.total_steps
    assert [h["step"] for h in outcome["eval_history"]] == [*range(2, cfg.total_steps, 2), cfg.total_steps]
    assert outcome["measured_steps"] == outcome["steps_done"] - cfg.warmup_steps
    assert outcome["eval"]["count"] == 200
    assert len(outcome["loss"]["curve"]) == outcome["steps_done"]
    assert np.isfinite(outcome["loss"]["last"]) and outcome["loss"]["last"] < outcome["loss"]["first"]
    # the evaluations (--eval-every) are left out of the training's memory; the probe comes after the steps
    assert outcome["memory"]["training_per_rank"][0] > 0 and outcome["achievable_peak"]["per_rank"][0] > 0


@pytest.mark.e2e  # trains the tiny BERT in this process, a few seconds a case
@pytest.mark.parametrize("patience, steps_done", [(2, 3), (3, 4)])
@pytest.mark.usefixtures("one_torch_thread")
def test_early_stopping_waits_patience_evaluations_without_improvement(tmp_path, data_dir, monkeypatch, patience,
                                                                        steps_done):
    """A learning rate of 0 (the loop's schedule, patched) leaves the tiny BERT's weights where they are, so no
    evaluation after the first improves on it. Evaluated after each of 4 steps: --patience 2 must stop after the
    third (two evaluations without improvement), --patience 3 must not stop at all."""
    monkeypatch.setattr(loop, "learning_rate", lambda step, total, optim: 0.0)
    spec = BERT_SIZES["tiny"]
    cfg = _in_process_config(tmp_path, workload="mlm", batch_size=4, per_device_batch=4, total_steps=4,
                             warmup_steps=0, eval_every=1, eval_samples=8, patience=patience, skip_eval=True)
    torch.manual_seed(0)
    model = build_model("mlm", spec)
    valid = load_split("mlm", "valid", "real", data_dir, spec, 0)  # trained on too: the weights never move
    outcome = run_loop(TorchTrainer(model, model, cfg, torch.device("cpu")), cfg, TrainBatches(valid, spec, 0, 4, 1, 0),
                       valid)
    history = [h["value"] for h in outcome["eval_history"]]
    assert len(set(history)) == 1, history  # nothing improved
    assert outcome["stopped_early"] is (steps_done < cfg.total_steps)
    assert outcome["steps_done"] == steps_done and len(history) == min(steps_done, cfg.total_steps - 1)


def test_a_step_that_compiles_after_the_warmup_leaves_the_measured_window(tmp_path, data_dir):
    """CONVENTIONS 2.3: compilation steps are not throughput, even when --warmup-steps is too short for them.
    dynamo's eager backend: the same graph capture and compile count as inductor, without its minutes."""
    cfg = _in_process_config(tmp_path, total_steps=4, warmup_steps=0, compile="default", skip_eval=True)
    train = load_split("cnn", "train", "real", data_dir, CNN, 0)
    torch.manual_seed(0)
    model = build_model("cnn", CNN)
    trainer = TorchTrainer(torch.compile(model, backend="eager"), model, cfg, torch.device("cpu"))
    outcome = run_loop(trainer, cfg, TrainBatches(train, CNN, 0, 32, 1, 0), None)
    assert trainer.backend_metrics()["recompiled_in_measured_window"] == [0]
    assert outcome["steps_done"] == 4 and outcome["measured_steps"] == 3
    assert outcome["measured_time_s"] == pytest.approx(sum(outcome["step_times_s"]), abs=1e-5)  # rounded to 1 us

@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_sweep_records_a_dead_rank_and_goes_on(tmp_path, data_dir):
    """Rank 1 of the 2-device run dies after step 2 while rank 0 waits in the next all-reduce: torchrun
    ends that run (not the collective timeout), its record names the rank, and the sweep goes on."""
    out = tmp_path / "results"
    proc = run_cli("bench.compare", "--gpus", "1,2", "--backends", "torch_ddp", "--workloads", "cnn", "--data", "real",
                   "--steps", "4", "--warmup-steps", "1", "--batch-size", "8", "--skip-eval",
                   "--collective-timeout", "600", "--out", str(out),
                   env={FAULT_AFTER_STEP_ENV: "2", FAULT_RANK_ENV: "1"})
    assert proc.returncode == 0, proc.stderr
    records = {r["devices"]: r for r in (json.loads(p.read_text()) for p in (out / "runs").glob("*.json"))}
    assert records[1]["status"] == "ok"  # a 1-device run has no rank 1 to fail
    failed = records[2]
    assert failed["status"] == "failed" and "rank 1 exited with code 17" in failed["error"], failed["error"]
    assert failed["duration_s"] < 120 and validate_record(failed) == []
    assert len(pd.read_csv(out / "summary.csv")) == 2


def _failed_group(tmp_path: Path, error_file_message: str | None, stopped_at: int = 200) -> ChildFailedError:
    """torchrun's own exception for a group whose rank 1 failed first (rank 0 was stopped after it, at
    `stopped_at`: the same whole second as rank 1's failure where the agent stopped it at once)."""
    error_file = tmp_path / "error.json"
    if error_file_message is not None:
        error_file.write_text(json.dumps({"message": {"message": error_file_message,
                                                      "extraInfo": {"timestamp": "100"}}}))
    failures = {0: ProcessFailure(0, 4351, -15, str(tmp_path / "none.json")),
                1: ProcessFailure(1, 4352, 1 if error_file_message else -6, str(error_file))}
    failures[0].timestamp, failures[1].timestamp = stopped_at, 100
    return ChildFailedError("worker", failures)


def test_a_failed_run_says_which_rank_failed_first_and_why(tmp_path):
    """From torchrun's exception and the failing rank's own output, not from torchrun's prose."""
    launcher = Torchrun(_tiny_config(), 1, tmp_path)
    rank1 = tmp_path / "ranks" / "run_x" / "attempt_0" / "1"
    rank1.mkdir(parents=True)
    (rank1 / "stderr.log").write_text("step 1/10\nterminate called without an active exception\n")
    launcher.report_path.write_text(json.dumps(failure_report(_failed_group(tmp_path, None))))
    assert launcher.failure(1) == ("torchrun exited with code 1, rank 1 exited with code -6 (signal 6) first: last "
                                   "output: step 1/10 | terminate called without an active exception")
    # A Python exception reaches the error file (errors.record) and is quoted from there.
    launcher.report_path.write_text(json.dumps(failure_report(_failed_group(tmp_path, "ValueError: bad batch"))))
    assert launcher.failure(1).startswith("torchrun exited with code 1, rank 1 exited with code 1 first: "
                                          "ValueError: bad batch | last output: ")
    # No report: torchrun itself failed before it could write one.
    launcher.report_path.unlink()
    assert launcher.failure(2).startswith("torchrun exited with code 2: ")
    (rank1 / "stderr.log").unlink()
    launcher.report_path.write_text(json.dumps(failure_report(_failed_group(tmp_path, None))))
    assert launcher.failure(1).endswith("rank 1 exited with code -6 (signal 6) first (no error file, no output)")
    # The rank the agent stopped with SIGTERM in the same second is not the first, whatever its rank number.
    launcher.report_path.write_text(json.dumps(failure_report(_failed_group(tmp_path, None, stopped_at=100))))
    assert "rank 1 exited with code -6 (signal 6) first" in launcher.failure(1)
    # ... nor in an earlier second: its collective broke when rank 1 died and its error file was stamped then,
    # while the agent stamped rank 1's exit, which wrote no error file, when it saw it (a loaded machine: seen in CI's
    # suite on two pytest workers, "rank 0 exited with code -15 (signal 15) first").
    launcher.report_path.write_text(json.dumps(failure_report(_failed_group(tmp_path, None, stopped_at=99))))
    assert "rank 1 exited with code -6 (signal 6) first" in launcher.failure(1)


def _tiny_config() -> RunConfig:
    return RunConfig(run_id="r", backend="torch_ddp", workload="cnn", devices=2, device_kind="cpu",
                     threads_per_device=1, scaling="weak", batch_size=8, per_device_batch=8, grad_accum=1,
                     data="synthetic", data_dir="", seed=0, total_steps=2, warmup_steps=1, out="")


@pytest.mark.e2e
def test_sigterm_to_bench_run_leaves_no_worker(tmp_path, data_dir):
    """What a sweep's timeout does: SIGTERM to bench.run must take torchrun and its ranks down."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    # A checkpoint after every step: the first one says the ranks are training (the first progress line
    # comes only after common.loop.PROGRESS_EVERY_S of it).
    proc = subprocess.Popen([sys.executable, "-m", "bench.run", "--backend", "torch_ddp", "--workload", "cnn",
                             "--devices", "2", "--steps", "100000", "--data", "real", "--skip-eval",
                             "--checkpoint-every", "1", "--checkpoint-dir", str(ckpt),
                             "--out", str(out)], cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        faults.wait_for(lambda: faults.training_started(ckpt), 240, "a first checkpoint", proc)
        workers = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
        assert len(workers) >= 3, "torchrun and two ranks should be running"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:  # the test failed before bench.run ended: nothing of it may outlive the test
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(1)
    status = {pid: Path(f"/proc/{pid}/status") for pid in workers}
    alive = [pid for pid, p in status.items() if p.exists() and "zombie" not in p.read_text().lower()]
    assert alive == [], f"left running: {alive}"


H100 = "NVIDIA H100 80GB HBM3"


def test_more_ranks_than_gpus_share_them_over_gloo_and_cpu_stays_cpu():
    # Planned for GPUs this machine does not have: plan_over takes the GPUs present as a list.
    one_gpu = plan_over(4, "auto", 1, [H100])
    assert (one_gpu.kind, one_gpu.virtual, one_gpu.physical_devices, one_gpu.hardware) == ("cuda", True, 1, (H100,))
    assert process_group_backend(one_gpu.kind, one_gpu.virtual) == "gloo"
    whole = plan_over(2, "cuda", 1, [H100, H100])
    assert (whole.virtual, whole.physical_devices) == (False, 2)
    assert process_group_backend(whole.kind, whole.virtual) == "nccl"
    assert plan_over(2, "cpu", 1, [H100]).kind == "cpu"
    assert plan_over(2, "auto", 1, []).kind == "cpu"
    with pytest.raises(Unsupported, match="none present"):
        plan_over(1, "cuda", 1, [])
