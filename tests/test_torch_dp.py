"""nn.DataParallel: equal to the plain module at N = 1, a real record, and an honest `unsupported` beyond."""
from __future__ import annotations

import json

import pytest
import torch

from backends.torch_common.models import build_model
from backends.torch_common.trainer import TorchTrainer
from backends.torch_dp.backend import data_parallel_plan
from backends.torch_dp.timed import per_step_means
from backends.torch_dp.worker import wrap
from common.config import RunConfig
from common.data.batches import TrainBatches
from common.data.datasets import load_split
from common.errors import Unsupported
from common.results import validate_record
from common.spec import BERT_SIZES, CNN
from tests.conftest import assert_profiled, chrome_trace_steps, run_cli


def _cfg(workload: str) -> RunConfig:
    return RunConfig(run_id="t", backend="torch_dp", workload=workload, devices=1, device_kind="cpu",
                     threads_per_device=1, scaling="weak", batch_size=8, per_device_batch=8, grad_accum=1,
                     data="real", data_dir="", seed=0, total_steps=10, warmup_steps=0, out="")


H100 = "NVIDIA H100 80GB HBM3"


def test_cpu_asked_for_stays_on_the_cpu_on_a_machine_with_gpus():
    # nn.DataParallel moves to CUDA whenever CUDA exists: on CPU the worker runs the module unwrapped.
    plan = data_parallel_plan(1, "cpu", 1, [H100])
    assert (plan.kind, plan.hardware) == ("cpu", ())
    core = build_model("cnn", CNN)
    model, device_ids = wrap(core, _cfg("cnn"))
    assert model is core and device_ids == []
    with pytest.raises(Unsupported, match="--device-kind cpu asked for CPU"):
        data_parallel_plan(2, "cpu", 1, [H100])


def test_more_replicas_than_gpus_are_virtual_replicas_round_robin():
    plan = data_parallel_plan(4, "auto", 1, [H100, H100])
    assert (plan.kind, plan.virtual, plan.physical_devices) == ("cuda", True, 2)
    assert "device_ids=[0, 1, 0, 1]" in plan.description
    assert data_parallel_plan(2, "auto", 1, [H100, H100]).virtual is False


def test_phase_means_average_per_step_and_leave_out_absent_phases():
    four = {"scatter": 0.1, "replicate": 0.2, "parallel_apply": 0.3, "gather": 0.4}
    assert per_step_means([four] * 4, forwards_per_step=2) == {  # 4 forwards = 2 steps
        "scatter": 0.2, "replicate": 0.4, "parallel_apply": 0.6, "gather": 0.8}
    assert per_step_means([{"scatter": 0.1, "parallel_apply": 0.3}] * 2, 1) == {"scatter": 0.1, "parallel_apply": 0.3}


def _sweep_records(torch_sweep) -> dict[tuple[str, int], dict]:
    proc, out = torch_sweep
    assert proc.returncode == 0, proc.stderr
    return {(r["backend"], r["devices"]): r for r in (json.loads(p.read_text()) for p in (out / "runs").glob("*.json"))}


@pytest.mark.e2e
def test_record_at_one_device_on_real_mnist(torch_sweep):
    """torch_dp at 1 device in the sweep of both torch backends on real MNIST (conftest.TORCH_SWEEP)."""
    r = _sweep_records(torch_sweep)[("torch_dp", 1)]
    assert validate_record(r) == [] and r["status"] == "ok"
    assert (r["strategy"], r["devices"], r["global_batch"], r["measured_steps"]) == ("DataParallel", 1, 64, 6)
    assert r["eval"]["count"] == 10000 and r["params"] == 2_328_298
    assert any("runs unwrapped" in n for n in r["notes"])
    assert_profiled(r, chrome_trace_steps)  # --profile 2 (conftest.TORCH_SWEEP)


@pytest.mark.e2e
def test_more_devices_than_cuda_is_unsupported_with_a_record(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("bench.run", "--backend", "torch_dp", "--workload", "mlm", "--devices", "2",
                   "--data", "synthetic", "--out", str(out))
    assert proc.returncode == 3, proc.stderr
    [path] = (out / "runs").glob("*.json")
    r = json.loads(path.read_text())
    assert r["status"] == "unsupported" and "needs CUDA devices" in r["error"]
    assert r["strategy"] == "DataParallel" and r["framework"] == "torch"
    assert validate_record(r) == []


@pytest.mark.e2e
def test_sweep_with_both_torch_backends_has_every_row(torch_sweep):
    rows = {key: r["status"] for key, r in _sweep_records(torch_sweep).items()}
    assert rows == {("torch_dp", 1): "ok", ("torch_dp", 2): "unsupported",
                    ("torch_ddp", 1): "ok", ("torch_ddp", 2): "ok"}


def _train_tiny_bert(data_dir, steps: int, **cfg_fields) -> tuple[list[float], TorchTrainer]:
    """`steps` steps of the tiny BERT, batch 8, on the CPU, the module unwrapped (as torch_dp's worker there)."""
    cfg = _cfg("mlm")
    for name, value in cfg_fields.items():
        setattr(cfg, name, value)
    spec = BERT_SIZES["tiny"]
    batches = TrainBatches(load_split("mlm", "train", "real", data_dir, spec, 0), spec, 0, 8, 1, 0)
    torch.manual_seed(0)
    core = build_model("mlm", spec)
    model = torch.compile(core) if cfg.compile else core
    trainer = TorchTrainer(model, core, cfg, torch.device("cpu"))
    return [trainer.train_step(batches.get(s), 1e-3) for s in range(steps)], trainer


@pytest.mark.e2e
def test_compiled_step_equals_the_eager_step_and_compiles_in_the_warmup(data_dir):
    compiled, trainer = _train_tiny_bert(data_dir, 3, compile="default", warmup_steps=1)
    eager, _ = _train_tiny_bert(data_dir, 3)
    assert compiled == pytest.approx(eager, rel=1e-5)  # inductor fuses and reorders float32 sums
    metrics = trainer.backend_metrics()
    assert [c["step"] for c in metrics["compile_steps"]] == [0] and metrics["recompiled_in_measured_window"] == []
    assert metrics["compile_s"] > 0 and metrics["compile_mode"] == "default"


@pytest.mark.e2e
def test_fp16_with_a_grad_scaler_follows_fp32(data_dir):
    """--precision fp16 on the CNN, batch 8: GradScaler's first scale (2^16) overflows the float16 gradients of
    step 1 (measured), so that step must leave every weight as it was and count as skipped; every other step
    updates. Replayed in float32 on the batches of the updates only, the same updates give the same losses
    within float16's precision (measured: 6e-4 after three updates; the fp32 run on every batch is 2-20% off)."""
    def trainer(**fields):
        cfg = _cfg("cnn")
        for name, value in fields.items():
            setattr(cfg, name, value)
        torch.manual_seed(0)
        core = build_model("cnn", CNN)
        return TorchTrainer(core, core, cfg, torch.device("cpu")), core

    batches = TrainBatches(load_split("cnn", "train", "real", data_dir, CNN, 0), CNN, 0, 8, 1, 0)
    half, core = trainer(precision="fp16")
    losses, kept, scales = [], [], []
    for step in range(4):
        before = [p.detach().clone() for p in core.parameters()]
        losses.append(half.train_step(batches.get(step), 1e-3))
        kept.append(all(torch.equal(b, p) for b, p in zip(before, core.parameters())))
        scales.append(half.scaler.get_scale())
    halved = [scale < previous for scale, previous in zip(scales, [2.0**16, *scales])]
    assert kept == halved and any(kept), scales  # weights unchanged exactly at the steps whose scale was halved
    assert half.backend_metrics()["loss_scale_skipped_steps"] == sum(kept)
    assert half.backend_metrics()["loss_scale_final"] == scales[-1]
    full, _ = trainer()
    updates = [step for step in range(4) if not kept[step]]
    assert len(updates) >= 2
    replayed = [full.train_step(batches.get(step), 1e-3) for step in updates]
    assert [losses[step] for step in updates] == pytest.approx(replayed, rel=5e-3)
