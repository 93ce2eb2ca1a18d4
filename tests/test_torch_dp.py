"""nn.DataParallel: equal to the plain module at N = 1, a real record, and an honest `unsupported` beyond."""
from __future__ import annotations

import json

import torch

from backends.torch_common.models import build_model
from backends.torch_common.trainer import TorchTrainer
from backends.torch_dp.timed import TimedDataParallel
from common.config import RunConfig
from common.data.batches import TrainBatches
from common.data.datasets import load_split
from common.results import validate_record
from common.spec import BERT_SIZES, CNN
from tests.conftest import run_cli


def _cfg(workload: str) -> RunConfig:
    return RunConfig(run_id="t", backend="torch_dp", workload=workload, devices=1, device_kind="cpu",
                     threads_per_device=1, scaling="weak", batch_size=8, per_device_batch=8, grad_accum=1,
                     data="real", data_dir="", seed=0, total_steps=10, warmup_steps=0, out="")


def test_data_parallel_step_at_one_device_equals_plain_step(data_dir):
    for workload, spec in (("cnn", CNN), ("mlm", BERT_SIZES["tiny"])):
        cfg = _cfg(workload)
        batches = TrainBatches(load_split(workload, "train", "real", data_dir, spec, 0), spec, 0, 8, 1, 0)
        params = []
        for wrap in (False, True):
            torch.manual_seed(0)
            core = build_model(workload, spec)
            model = TimedDataParallel(core) if wrap else core
            trainer = TorchTrainer(model, core, cfg, torch.device("cpu"))
            losses = [trainer.train_step(batches.get(s), 1e-3) for s in range(2)]
            params.append((losses, [p.detach().clone() for p in core.parameters()]))
        (l_plain, p_plain), (l_dp, p_dp) = params
        assert l_plain == l_dp
        assert all(torch.equal(a, b) for a, b in zip(p_plain, p_dp))


def test_phase_means_skip_warmup_and_average_per_step():
    model = TimedDataParallel(torch.nn.Linear(2, 2))
    model.phase_log = [{"scatter": 9.0, "parallel_apply": 9.0}] + [
        {"scatter": 0.1, "replicate": 0.2, "parallel_apply": 0.3, "gather": 0.4}] * 4
    means = model.phase_means(skip=1, forwards_per_step=2)  # 4 measured forwards = 2 steps
    assert means == {"scatter": 0.2, "replicate": 0.4, "parallel_apply": 0.6, "gather": 0.8}
    assert model.phase_means(skip=5, forwards_per_step=1) is None


def test_record_at_one_device_on_real_mnist(tmp_path, data_dir):
    out = tmp_path / "out"
    proc = run_cli("bench.run", "--backend", "torch_dp", "--workload", "cnn", "--devices", "1", "--data", "real",
                   "--steps", "6", "--warmup-steps", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    [path] = (out / "runs").glob("*.json")
    r = json.loads(path.read_text())
    assert validate_record(r) == [] and r["status"] == "ok"
    assert (r["strategy"], r["devices"], r["global_batch"], r["measured_steps"]) == ("DataParallel", 1, 64, 4)
    assert r["eval"]["count"] == 10000 and r["params"] == 2_328_298
    assert any("calls the module directly" in n for n in r["notes"])


def test_more_devices_than_cuda_is_unsupported_with_a_record(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("bench.run", "--backend", "torch_dp", "--workload", "mlm", "--devices", "2",
                   "--data", "synthetic", "--out", str(out))
    assert proc.returncode == 3, proc.stderr
    [path] = (out / "runs").glob("*.json")
    r = json.loads(path.read_text())
    assert r["status"] == "unsupported" and "needs 2 CUDA devices" in r["error"]
    assert r["strategy"] == "DataParallel" and r["framework"] == "torch"
    assert validate_record(r) == []


def test_sweep_with_both_torch_backends_has_every_row(tmp_path, data_dir):
    out = tmp_path / "out"
    proc = run_cli("bench.compare", "--gpus", "1,2", "--backends", "torch_dp,torch_ddp", "--workloads", "cnn",
                   "--data", "real", "--steps", "4", "--warmup-steps", "1", "--skip-eval", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = {(r["backend"], r["devices"]): r["status"]
            for r in (json.loads(p.read_text()) for p in (out / "runs").glob("*.json"))}
    assert rows == {("torch_dp", 1): "ok", ("torch_dp", 2): "unsupported",
                    ("torch_ddp", 1): "ok", ("torch_ddp", 2): "ok"}
