"""The typed sections of backend_metrics: written and read through one type, checked by validate_record."""
from __future__ import annotations

import pytest

from common.results import validate_record
from common.sections import (
    ATTRIBUTION_CATEGORIES,
    RECORD_SECTIONS,
    SECTIONS,
    AchievablePeak,
    Attribution,
    Breakdown,
    Bubble,
    CategoryTime,
    Collective,
    CommPerStep,
    CoRun,
    FastPath,
    FitCheck,
    Fp32Math,
    GradComm,
    Memory,
    StateBytes,
    StateBytesPerRank,
    TrainableParams,
    merged,
    record_section_problems,
    section_problems,
)

WRITTEN = [
    TrainableParams(2328298),
    Fp32Math("tf32"),
    StateBytesPerRank([StateBytes(100, 100, 200), StateBytes(50, 50, 100)]),
    CommPerStep([{"all_reduce": Collective(4096, 2, 0.01), "send_recv": Collective(512, 4, None)}, None]),
    Bubble(0.2, [0.67, 0.06]),
    Breakdown(0.5, 0.1, 0.05, 0.001, 0.002, 0.653, 0.66, "torch", 3),
    GradComm(4096, 0.1, 1.2, 1.9, 0.05, 2, "hook"),
    Attribution(0.5, 0.5, 0.45, 2, {c: CategoryTime(0.5 / len(ATTRIBUTION_CATEGORIES), 1 / len(ATTRIBUTION_CATEGORIES),
                                                    2e9 if c == "matmul" else None) for c in ATTRIBUTION_CATEGORIES},
                "torch.profiler", "/tmp/profiles/run", 3e9, [["aten::weird", 0.001]]),
    FastPath({"fused_adamw": True, "sdpa_kernel": "FLASH_ATTENTION"}, {"fused_adamw": "fastest"}),
]


@pytest.mark.parametrize("section", WRITTEN, ids=[type(s).__name__ for s in WRITTEN])
def test_a_section_reads_back_what_was_written(section):
    metrics = merged(section, tf_mode="mirrored")
    assert type(section).from_metrics(metrics) == section and metrics["tf_mode"] == "mirrored"
    assert section_problems(metrics) == []


def test_every_typed_section_is_registered_under_its_own_key():
    assert len({s.key for s in SECTIONS}) == len(SECTIONS) == len({type(s) for s in WRITTEN})


def test_absent_sections_read_as_none_and_are_left_out():
    assert Bubble.from_metrics({}) is None and Breakdown.from_metrics(None) is None
    assert merged(None, TrainableParams(3)) == {"trainable_params": 3}


def test_the_json_is_the_records_as_before():
    """Writers moved to the types; the record's JSON did not change shape."""
    assert StateBytesPerRank([StateBytes(1, 2, 3)]).to_metrics() == {
        "state_bytes_per_rank": [{"params": 1, "grads": 2, "optimizer": 3}]}
    assert CommPerStep([{"all_gather": Collective(8, 1, 0.5)}]).to_metrics() == {
        "comm_per_step": [{"all_gather": {"bytes": 8, "calls": 1, "time_s": 0.5}}]}
    assert Bubble(0.25).to_metrics() == {"bubble": {"analytic": 0.25, "measured_per_stage": None}}
    assert WRITTEN[5].total_s == pytest.approx(0.653)  # the phases of one step added up


def test_a_record_with_a_malformed_section_is_refused():
    record = {"status": "failed", "error": "x", "backend_metrics": {"trainable_params": "many", "fp32_math": "fp8",
                                                                    "bubble": {"measured_per_stage": [0.1]}}}
    problems = validate_record(record)
    assert any("backend_metrics.trainable_params" in p for p in problems)
    assert any("backend_metrics.fp32_math" in p for p in problems)
    assert any("backend_metrics.bubble" in p for p in problems)


TOP_LEVEL = [
    Memory([2_300_000_000, 2_200_000_000], [150_000_000, None], "growth of VmHWM", False, [2_000_000_000, None]),
    AchievablePeak(6.1e10, "fp32", "best of 5", [512, 512, 512], [6.1e10, None]),
    FitCheck([600_000_000, 580_000_000], 1_073_741_824, "--memory-per-device 1 GiB", "fits", "state", 0.12),
    CoRun(2, [0.659, 0.658], 1.022, ["r-a", "r-b"]),
]


@pytest.mark.parametrize("section", TOP_LEVEL, ids=[type(s).__name__ for s in TOP_LEVEL])
def test_a_top_level_section_reads_back_what_was_written(section):
    assert {type(s) for s in TOP_LEVEL} == set(RECORD_SECTIONS)
    record = {"status": "failed", "error": "x", **section.to_record()}
    assert type(section).from_record(record) == section
    assert record_section_problems(record) == []


@pytest.mark.parametrize("key, value, says", [
    ("memory", {"process_peak_per_rank": [None], "training_per_rank": [], "method": None,
                "processes_share": False}, "process_peak_per_rank"),
    ("memory", {"process_peak_per_rank": [1], "training_per_rank": ["big"], "method": None,
                "processes_share": False}, "training_per_rank"),
    ("memory", {"process_peak_per_rank": [1], "training_per_rank": [1], "method": None,
                "processes_share": "no"}, "processes_share"),
    ("memory", {"process_peak_per_rank": [1]}, "memory"),
    ("achievable_peak", {"flops_per_s": 1.0, "precision": "fp32", "method": "m", "shape": [4, 4],
                         "per_rank": [1.0]}, "shape"),
    ("achievable_peak", {"flops_per_s": "fast", "precision": "fp32", "method": "m", "shape": [4, 4, 4],
                         "per_rank": [1.0]}, "flops_per_s"),
    ("mfu_achievable", -0.5, "mfu_achievable"),
    ("fit_check", {"predicted_per_rank": [1], "available_bytes": 2, "limit": "x", "verdict": "squeezes",
                   "counts": "y"}, "verdict"),
    ("co_run", {"processes": 2, "step_s_p50": [0.6], "slowdown": 1.0, "run_ids": ["a"]}, "2 >= 2 medians"),
    ("co_run", {"processes": 1, "step_s_p50": [0.6], "slowdown": 1.0, "run_ids": ["a"]}, "1 >= 2"),
])
def test_a_record_with_a_malformed_top_level_section_is_refused(key, value, says):
    problems = validate_record({"status": "failed", "error": "x", key: value})
    assert any(p.startswith(key) and says in p for p in problems), problems


def test_an_attribution_without_every_category_is_refused():
    section = WRITTEN[7].to_metrics()
    del section["attribution"]["categories"]["host_idle"]
    assert any("host_idle missing" in p for p in section_problems(section))
