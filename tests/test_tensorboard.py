"""The TensorBoard log every backend writes with --tensorboard, on fixed numbers."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from common.config import RunConfig
from common.spec import learning_rate
from common.tensorboard import write_run_log
from tests.conftest import REPO, assert_tensorboard_log_is_the_record, tensorboard_scalars


def test_the_log_holds_loss_learning_rate_speed_and_evaluations(tmp_path):
    cfg = RunConfig(run_id="run-1", backend="torch_ddp", workload="mlm", devices=2, device_kind="cpu",
                    threads_per_device=1, scaling="weak", batch_size=8, per_device_batch=8, grad_accum=1,
                    data="synthetic", data_dir="", seed=0, total_steps=4, warmup_steps=1, out="",
                    tensorboard_dir=str(tmp_path))
    outcome = {"loss": {"curve": [[1, 10.5], [2, 10.25], [3, 10.0], [4, 9.75]]}, "step_times_s": [0.5, 0.25, 0.4],
               "eval": {"metric": "masked_accuracy"}, "eval_history": [{"step": 2, "value": 0.1, "loss": 9.9},
                                                                      {"step": 4, "value": 0.2, "loss": 9.5}],
               "run_id": "run-1"}
    assert write_run_log(cfg, outcome) == tmp_path / "run-1"
    scalars = tensorboard_scalars(tmp_path / "run-1")
    assert scalars["perf/samples_per_s"] == [(0, 32.0), (1, 64.0), (2, pytest.approx(40.0))]
    rates = [(s, pytest.approx(learning_rate(s - 1, 4, cfg.optim))) for s in (1, 2, 3, 4)]
    assert scalars["train/learning_rate"] == rates
    assert scalars["eval/loss"] == [(2, pytest.approx(9.9)), (4, pytest.approx(9.5))]
    assert_tensorboard_log_is_the_record(tmp_path, outcome)
    # Another run in the same folder has a folder of its own.
    write_run_log(replace(cfg, run_id="run-2"), {**outcome, "eval_history": []})
    assert "eval/masked_accuracy" not in tensorboard_scalars(tmp_path / "run-2")


@pytest.mark.e2e
def test_writing_the_log_loads_no_framework(tmp_path):
    """A torch or MindSpore rank 0 writing its log must not pay for TensorFlow (TensorBoard's own event-file writer
    imports it wherever it is installed: 9.2 s and 609 MB a run) nor load torch for it."""
    script = (
        "import sys\n"
        "from common.config import RunConfig\n"
        "from common.tensorboard import write_run_log\n"
        f"cfg = RunConfig(run_id='r', backend='mindspore_auto', workload='cnn', devices=1, device_kind='cpu',"
        " threads_per_device=1, scaling='weak', batch_size=8, per_device_batch=8, grad_accum=1, data='synthetic',"
        f" data_dir='', seed=0, total_steps=2, warmup_steps=1, out='', tensorboard_dir={str(tmp_path)!r})\n"
        "write_run_log(cfg, {'loss': {'curve': [[1, 2.0], [2, 1.5]]}, 'step_times_s': [0.5]})\n"
        "print(sorted(m for m in ('tensorflow', 'torch', 'jax', 'mindspore') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert tensorboard_scalars(tmp_path / "r")["train/loss"] == [(1, 2.0), (2, 1.5)]
