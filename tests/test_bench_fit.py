"""bench.fit, the fit check every run meets before launch: which limit a device has (--memory-per-device, else a
GPU's memory shared by the devices on it, else none on a CPU), and the check made from --out's records (the
framework's overhead of the latest matching 1-device run, the model's memory error from validation.json), read
again when --out gains a run."""
from __future__ import annotations

import argparse
import json
import os
import socket

import pytest

from bench import fit
from common.layout import Layout
from common.plan.fit import GIB, DoesNotFit
from common.predict.executed import memory_per_rank
from common.spec import BERT_SIZES, DEFAULTS
from tests.test_plan_cli import _folder, _record

TINY = BERT_SIZES["tiny"]

EVAL_BATCH = DEFAULTS["mlm"].eval_batch  # the evaluation batch of the MLM and the CNN


def _args(out, **changes) -> argparse.Namespace:
    values = {"device_kind": "cpu", "memory_per_device": None, "workload": "mlm", "model_size": "tiny",
              "out": str(out), "backend": "torch_3d", "precision": "fp32", "skip_eval": False, "no_fit_check": False}
    return argparse.Namespace(**{**values, **changes})


def _here(record: dict) -> dict:
    record["host"]["name"] = socket.gethostname()    # the overhead is this host's own
    return record


def test_the_limit_is_the_flag_else_the_gpu_s_memory_shared_by_its_devices_else_none(monkeypatch, tmp_path):
    monkeypatch.setattr(fit, "gpu_memory_bytes", lambda: pytest.fail("a CPU device asks no GPU"))
    assert fit.device_limit(_args(tmp_path), 4) == \
        (None, "no device limit known (a CPU device: give --memory-per-device)", "cpu")
    assert fit.device_limit(_args(tmp_path, memory_per_device=1.5), 4) == (1.5 * GIB, "--memory-per-device 1.5 GiB",
                                                                           "cpu")
    monkeypatch.setattr(fit, "gpu_memory_bytes", lambda: (80 * GIB, 79 * GIB))
    cuda = _args(tmp_path, device_kind="cuda")
    # 4 devices on 2 GPUs: two to each, of the smaller GPU's memory
    assert fit.device_limit(cuda, 4) == (79 * GIB / 2, "the GPU's memory (nvidia-smi: 79.0 GiB, shared by 2 "
                                                       "devices)", "cuda")
    assert fit.device_limit(cuda, 2) == (79 * GIB, "the GPU's memory (nvidia-smi: 79.0 GiB)", "cuda")
    assert fit.device_limit(cuda, 3) == (79 * GIB / 2, "the GPU's memory (nvidia-smi: 79.0 GiB, shared by 2 "
                                                       "devices)", "cuda")
    assert fit.device_limit(_args(tmp_path, device_kind="cuda", memory_per_device=8.0), 4) == \
        (8 * GIB, "--memory-per-device 8 GiB", "cuda")


def test_the_check_counts_the_latest_run_s_overhead_and_allows_the_validated_error(tmp_path):
    out = _folder(tmp_path / "out", _here(_record("k1", peak=3 * GIB)))
    (out / fit.VALIDATION).write_text(json.dumps({"summary": {"all": {"memory_per_rank": {"max_abs_error": 0.2}}}}))
    tp2 = Layout(tp=2)
    check = fit.fit_before_launch(_args(out, memory_per_device=8.0), tp2, 32, 2)
    _, model, _ = memory_per_rank(TINY, tp2, 32, "fp32", "torch_3d", EVAL_BATCH)
    _, alone, _ = memory_per_rank(TINY, Layout(), 32, "fp32", "torch_3d", None)   # that run skipped its evaluation
    overhead = 3 * GIB - alone[0]      # the 1-device run's peak beyond what the model counts for it
    assert check.predicted_per_rank == [int(m + overhead) for m in model]
    assert (check.available_bytes, check.limit, check.error) == (8 * GIB, "--memory-per-device 8 GiB", 0.2)
    assert check.counts.endswith(f"+ the framework's overhead {overhead / 2**20:,.0f} MiB measured by 1-device "
                                 "run k1") and "evaluation's live values" in check.counts
    # --skip-eval: the evaluation's values are not counted; fp16 has no 1-device run of its own here
    skipped = fit.fit_before_launch(_args(out, memory_per_device=8.0, skip_eval=True, precision="amp"), tp2, 32, 2)
    _, no_eval, _ = memory_per_rank(TINY, tp2, 32, "amp", "torch_3d", None)
    assert skipped.predicted_per_rank == [int(m) for m in no_eval] and "evaluation" not in skipped.counts
    assert "no framework overhead" in skipped.counts


def test_a_run_that_does_not_fit_is_refused_unless_asked_and_a_new_record_is_read(tmp_path):
    out = _folder(tmp_path / "out")
    tiny_limit = _args(out, memory_per_device=0.05)
    with pytest.raises(DoesNotFit, match=r"dp2 is predicted not to fit: rank 0 needs .* GiB, --memory-per-device "
                                         r"0.05 GiB allows 0.050 GiB per device"):
        fit.fit_before_launch(tiny_limit, Layout(dp=2), 32, 2)
    anyway = fit.fit_before_launch(_args(out, memory_per_device=0.05, no_fit_check=True), Layout(dp=2), 32, 2)
    assert anyway.verdict == "does not fit" and "no framework overhead" in anyway.counts
    # a 1-device run lands in --out: the next check reads it (the folder's runs/ changed)
    _folder(out, _here(_record("k2", peak=2 * GIB)))
    os.utime(out / "runs", ns=(os.stat(out / "runs").st_atime_ns, os.stat(out / "runs").st_mtime_ns + 10**9))
    again = fit.fit_before_launch(_args(out, memory_per_device=0.05, no_fit_check=True), Layout(dp=2), 32, 2)
    assert again.counts.endswith("measured by 1-device run k2")


def test_the_check_is_of_the_run_s_own_model_and_its_gpu_s_share(monkeypatch, tmp_path):
    """The CNN is checked as the CNN, the mini MLM as the mini; on GPUs the limit is each device's share of one GPU's
    memory."""
    from common.spec import CNN

    out = _folder(tmp_path / "out")
    cnn = fit.fit_before_launch(_args(out, workload="cnn", memory_per_device=8.0), Layout(dp=2), 64, 2)
    _, model, _ = memory_per_rank(CNN, Layout(dp=2), 64, "fp32", "torch_3d", EVAL_BATCH)
    assert cnn.predicted_per_rank == [int(m) for m in model]
    mini = fit.fit_before_launch(_args(out, model_size="mini", memory_per_device=8.0), Layout(dp=2), 32, 2)
    _, model, _ = memory_per_rank(BERT_SIZES["mini"], Layout(dp=2), 32, "fp32", "torch_3d", EVAL_BATCH)
    assert mini.predicted_per_rank == [int(m) for m in model]
    monkeypatch.setattr(fit, "gpu_memory_bytes", lambda: (16 * GIB,))
    shared = fit.fit_before_launch(_args(out, device_kind="cuda"), Layout(dp=4), 32, 4)   # 4 devices on one GPU
    assert (shared.available_bytes, shared.limit) == (4 * GIB, "the GPU's memory (nvidia-smi: 16.0 GiB, shared by 4 "
                                                               "devices)")


def test_a_folder_whose_runs_appear_is_read_again_whatever_their_folder_s_time(tmp_path):
    """--out without runs/ is read as empty; once runs/ exists it is read again, even where its modification time
    is the epoch (an archive's reproducible stamp): no time of a folder is taken for the absence of one."""
    out = tmp_path / "out"
    out.mkdir()
    before = fit.fit_before_launch(_args(out, memory_per_device=8.0), Layout(dp=2), 32, 2)
    assert "no framework overhead" in before.counts
    _folder(out, _here(_record("k1", peak=3 * GIB)))
    os.utime(out / "runs", ns=(0, 0))
    after = fit.fit_before_launch(_args(out, memory_per_device=8.0), Layout(dp=2), 32, 2)
    assert after.counts.endswith("measured by 1-device run k1")
