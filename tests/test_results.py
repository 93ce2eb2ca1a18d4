"""The record schema, atomic writing and the summary's scaling efficiency."""
from __future__ import annotations

import json
import subprocess

import pytest

from common.record import skeleton
from common.results import (
    REQUIRED_FIELDS,
    load_records,
    summary_frame,
    utc_now,
    validate_record,
    write_record,
    write_summary,
)
from common.timing import aggregate_ranks, summarize
from tests.conftest import REPO


def ok_record(run_id, devices, sps, backend="torch_ddp", sweep="s1", host="h1", started="2026-01-01T00:00:00"):
    r = skeleton(run_id, backend, "cnn", devices, started, sweep_id=sweep)
    r["host"]["name"] = host
    r.update(status="ok", strategy="DDP", data="real", device_kind="cpu", scaling="weak", measured_steps=10,
             samples_per_s=sps, params=1, flops_per_sample=1,
             step_time_s={"mean": 1, "p50": 1, "p90": 1, "min": 1, "max": 1, "std": 0})
    return r


def test_skeleton_has_every_field_and_failed_needs_a_reason():
    r = skeleton("x", "torch_ddp", "cnn", 2, utc_now())
    assert set(REQUIRED_FIELDS) <= set(r)
    r["status"] = "failed"
    assert validate_record(r) == ["failed record without an error"]
    r["error"] = "rank 1 died"
    assert validate_record(r) == []


def test_ok_record_needs_measurements():
    r = ok_record("a", 1, 100.0)
    assert validate_record(r) == []
    r["samples_per_s"] = None
    assert any("samples_per_s" in p for p in validate_record(r))


def test_write_is_atomic_and_refuses_malformed(tmp_path):
    path = write_record(ok_record("a", 1, 100.0), tmp_path)
    assert json.loads(path.read_text())["run_id"] == "a"
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]  # no temp file left behind
    bad = ok_record("b", 1, 100.0)
    del bad["host"]
    with pytest.raises(ValueError, match="missing field host"):
        write_record(bad, tmp_path)
    assert not (tmp_path / "runs" / "b.json").exists()


def test_scaling_efficiency_within_groups(tmp_path):
    records = [
        ok_record("a1", 1, 100.0), ok_record("a2", 2, 150.0), ok_record("a4", 4, 200.0),
        ok_record("b2", 2, 500.0, host="h2"),  # another host: no 1-device baseline there
        ok_record("c1", 1, 10.0, backend="other"), ok_record("c2", 2, 20.0, backend="other"),
    ]
    failed = skeleton("f", "torch_ddp", "cnn", 2, "2026-01-01T00:00:01", sweep_id="s1")
    failed.update(status="failed", error="boom")
    for r in [*records, failed]:
        write_record(r, tmp_path)
    frame = summary_frame(load_records(tmp_path)).set_index("run_id")
    assert frame.loc["a1", "scaling_efficiency"] == pytest.approx(1.0)
    assert frame.loc["a2", "scaling_efficiency"] == pytest.approx(150 / 200)
    assert frame.loc["a4", "scaling_efficiency"] == pytest.approx(200 / 400)
    assert frame.loc["c2", "scaling_efficiency"] == pytest.approx(1.0)
    assert frame.loc[["b2", "f"], "scaling_efficiency"].isna().all()
    assert frame.loc["f", "error"] == "boom"
    csv = write_summary(tmp_path).read_text().splitlines()
    assert len(csv) == 1 + 7 and "scaling_efficiency" in csv[0]


def test_aggregate_takes_the_slowest_rank():
    fast = {"step_times": [1.0, 1.0], "data_wait": [0.1, 0.1]}
    slow = {"step_times": [1.0, 3.0], "data_wait": [0.0, 0.0]}
    agg = aggregate_ranks([fast, slow])
    assert agg["measured_steps"] == 2
    assert agg["measured_time_s"] == 4.0
    assert agg["step_time_s"]["max"] == 3.0 and agg["step_time_s"]["min"] == 1.0
    assert agg["step_times_s"] == [1.0, 3.0]
    assert agg["data_wait_fraction"] == pytest.approx((0.1 + 0.0) / 2)
    assert summarize([]) is None


def test_a_step_in_which_any_rank_compiled_leaves_every_rank_window():
    compiled = {"step_times": [9.0, 1.0, 1.0], "data_wait": [0.0, 0.1, 0.1], "compiled_steps": [0]}
    other = {"step_times": [2.0, 1.0, 3.0], "data_wait": [0.0, 0.0, 0.0], "compiled_steps": []}
    agg = aggregate_ranks([compiled, other])
    assert agg["measured_steps"] == 2 and agg["step_times_s"] == [1.0, 3.0]
    assert agg["measured_time_s"] == 4.0 and agg["data_wait_fraction"] == pytest.approx((0.2 / 2 + 0.0) / 2)


@pytest.mark.parametrize("path", ["results/.summary.lock", "results/summary.csv", "results/runs/r.json",
                                  "results/logs/sweep/r.log", "results/report.md", "results/plots/cnn-loss.png",
                                  "results/validation.json", "results/predict-mlm-base-h100-sxm-8.json"])
def test_what_runs_and_reports_write_under_results_is_git_ignored(path):
    """A clone stays clean after its first sweep and report (the summary's lock file was not ignored)."""
    proc = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, f"{path} is not git-ignored {proc.stderr}"


def test_the_test_session_names_its_slowest_tests(pytestconfig):
    """The suite must stay under 30 minutes on 2 cores: every run lists its 15 slowest tests."""
    assert pytestconfig.option.durations == 15
