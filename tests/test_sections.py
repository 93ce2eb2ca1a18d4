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


# ----------------------------------------------------------------------------- what a refusal says, word for word
# validate_record prints these lines for a record it refuses: each names the section, the field and the value.

MEMORY = {"process_peak_per_rank": [1], "training_per_rank": [1], "method": None, "processes_share": False}
PEAK = {"flops_per_s": 1.0, "precision": "fp32", "method": "m", "shape": [4, 4, 4], "per_rank": [1.0]}
FIT = {"predicted_per_rank": [1], "available_bytes": 2, "limit": "x", "verdict": "fits", "counts": "y"}
CO_RUN = {"processes": 2, "step_s_p50": [0.6, 0.7], "slowdown": 1.1, "run_ids": ["a", "b"]}


@pytest.mark.parametrize("section, raw, says", [
    (TrainableParams, "many", "backend_metrics.trainable_params: expected an integer, got 'many'"),
    (TrainableParams, True, "backend_metrics.trainable_params: expected an integer, got True"),
    (Fp32Math, "fp8", "backend_metrics.fp32_math: expected one of ('fp32', 'tf32'), got 'fp8'"),
    (Memory, {**MEMORY, "process_peak_per_rank": [None]}, "memory: process_peak_per_rank: expected numbers, got None"),
    (Memory, {**MEMORY, "process_peak_per_rank": 5}, "memory: process_peak_per_rank: expected a list, got 5"),
    (Memory, {**MEMORY, "training_per_rank": ["big"]},
     "memory: training_per_rank: expected numbers or null, got 'big'"),
    (Memory, {**MEMORY, "training_per_rank": [True]}, "memory: training_per_rank: expected numbers or null, got True"),
    (Memory, {**MEMORY, "at_start_per_rank": ["x"]}, "memory: at_start_per_rank: expected numbers or null, got 'x'"),
    (Memory, {**MEMORY, "processes_share": "no"}, "memory: processes_share: expected true or false, got 'no'"),
    (AchievablePeak, {**PEAK, "flops_per_s": None}, "achievable_peak: flops_per_s: expected numbers, got None"),
    (AchievablePeak, {**PEAK, "flops_per_s": "fast"}, "achievable_peak: flops_per_s: expected numbers, got 'fast'"),
    (AchievablePeak, {**PEAK, "per_rank": ["x"]}, "achievable_peak: per_rank: expected numbers or null, got 'x'"),
    (AchievablePeak, {**PEAK, "shape": [4, 4]}, "achievable_peak: shape: expected [m, n, k], got [4, 4]"),
    (AchievablePeak, {**PEAK, "shape": [4, 4, None]}, "achievable_peak: shape: expected numbers, got None"),
    (FitCheck, {**FIT, "predicted_per_rank": [None]}, "fit_check: predicted_per_rank: expected numbers, got None"),
    (FitCheck, {**FIT, "predicted_per_rank": ["x"]}, "fit_check: predicted_per_rank: expected numbers, got 'x'"),
    (FitCheck, {**FIT, "available_bytes": 2.5}, "fit_check: available_bytes: expected numbers, got 2.5"),
    (FitCheck, {**FIT, "verdict": "squeezes"},
     "fit_check: verdict: expected one of ('fits', 'may not fit', 'does not fit', 'not checked'), got 'squeezes'"),
    (CoRun, {**CO_RUN, "processes": "2"}, "co_run: processes: expected numbers, got '2'"),
    (CoRun, {**CO_RUN, "processes": None}, "co_run: processes: expected numbers, got None"),
    (CoRun, {**CO_RUN, "step_s_p50": [0.6, None]}, "co_run: step_s_p50: expected numbers, got None"),
    (CoRun, {**CO_RUN, "step_s_p50": [0.6, "x"]}, "co_run: step_s_p50: expected numbers, got 'x'"),
    (CoRun, {**CO_RUN, "slowdown": None}, "co_run: slowdown: expected numbers, got None"),
    (CoRun, {**CO_RUN, "slowdown": "x"}, "co_run: slowdown: expected numbers, got 'x'"),
    (CoRun, {**CO_RUN, "processes": 1, "step_s_p50": [0.6]},
     "co_run: expected 1 >= 2 medians and a positive slowdown, got [0.6] and 1.1"),
    (CoRun, {**CO_RUN, "step_s_p50": [0.6]},
     "co_run: expected 2 >= 2 medians and a positive slowdown, got [0.6] and 1.1"),
    (CoRun, {**CO_RUN, "slowdown": 0}, "co_run: expected 2 >= 2 medians and a positive slowdown, got [0.6, 0.7] and 0"),
], ids=lambda v: v.__name__ if isinstance(v, type) else "")
def test_a_refused_section_says_which_field_and_value(section, raw, says):
    assert section.problems(raw) == [says]


@pytest.mark.parametrize("section, raw", [
    (Memory, {**MEMORY, "training_per_rank": [None], "at_start_per_rank": [None, 3]}),
    (AchievablePeak, {**PEAK, "per_rank": [None, 2]}),
    (FitCheck, {**FIT, "predicted_per_rank": None, "available_bytes": None}),
    (CoRun, {**CO_RUN, "slowdown": 0.5}),  # co-running may even be faster: any positive slowdown reads
], ids=lambda v: v.__name__ if isinstance(v, type) else "")
def test_what_a_section_allows_reads(section, raw):
    assert section.problems(raw) == []
    assert section.from_record({section.key: raw}) == section.from_value(raw)


def test_a_record_without_a_top_level_section_reads_none():
    assert Memory.from_record({}) is None and CoRun.from_record(None) is None and FitCheck.from_record({"x": 1}) is None


def test_missing_state_parts_read_as_zero_bytes():
    [rank] = StateBytesPerRank.from_value([{"params": 5, "grads": None}]).ranks
    assert rank == StateBytes(5, 0, 0) and rank.total == 5


def test_a_rank_s_bytes_of_a_collective_it_did_not_issue_are_zero():
    comm = CommPerStep([{"all_reduce": Collective(4096, 2, 0.01)}, None])
    assert comm.bytes_of(0, "all_reduce") == 4096
    assert comm.bytes_of(0, "all_gather") == 0 and comm.bytes_of(1, "all_reduce") == 0


def test_an_attribution_is_written_with_its_fields_only_and_adds_up_its_categories():
    section = WRITTEN[7]
    written = section.to_metrics()["attribution"]
    assert set(written) == {"step_s", "wall_step_s", "measured_step_s", "steps", "categories", "profiler", "trace_dir",
                            "model_flops_per_s_in_matmul", "unclassified", "op_concurrency"}
    assert written["categories"]["matmul"] == {"seconds": 0.5 / len(ATTRIBUTION_CATEGORIES),
                                               "share": 1 / len(ATTRIBUTION_CATEGORIES), "flops_per_s": 2e9,
                                               "bytes_per_s": None}
    assert section.seconds("matmul", "attention", "other") == pytest.approx(3 * 0.5 / len(ATTRIBUTION_CATEGORIES))
    assert section.seconds() == 0
    del written["categories"]["host_idle"], written["categories"]["softmax"]
    assert Attribution.problems(written) == ["backend_metrics.attribution: categories: softmax, host_idle missing"]
