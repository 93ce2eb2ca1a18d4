"""The validation table and its summary sentence (bench.reporting.validation), from a validation.json written by
hand: every cell and every clause of the sentence as a reader sees it."""
from __future__ import annotations

import json

from bench.reporting import validation as v
from bench.reporting.document import Heading, Table, Text
from common.predict.basis import MEASURE_THE_SPLIT

FULL = {"backend": "torch_ddp", "layout": "dp2", "devices": 2, "oversubscribed": True,
        "step_s": {"predicted": 1.2344, "measured": 1.0, "error": 0.2344, "error_ignoring_load": -0.05},
        "basis_guesses": ["split a", "split b"], "notes": ["n1", "n2"],
        "memory_per_rank": {"error": 0.01}, "training_memory_per_rank": {"error": -0.1},
        "state_bytes_per_rank": {"exact": False},
        "idle_per_stage": {"predicted": [0.1, 0.25], "measured": [0.125]},
        "comm_per_step": {"grad": {"predicted": 10, "measured": 10}, "params": {"predicted": 4, "measured": 5},
                          "acts": {"predicted": 1, "measured": 2}}}
BARE = {"backend": "tf_mirrored", "layout": "dp4", "devices": 4, "oversubscribed": False,
        "step_s": {"predicted": 0.0125, "measured": 0.01, "error": None},
        "memory_per_rank": {"error": None}, "state_bytes_per_rank": {"exact": None}}


def _summary(runs=3, configurations=None, **extra) -> dict:
    return {"all": {"step_s": {"runs": runs, "median_abs_error": 0.05, "max_abs_error": 0.125},
                    "state_bytes_exact": 2, "state_bytes_compared": 3, **extra},
            "oversubscribed_runs": 0, "skipped_runs": 0, **({"configurations": configurations} if configurations
                                                             else {})}


def test_each_run_is_a_row_of_its_predicted_and_measured_figures_and_notes():
    rows = v.rows({"runs": [FULL, BARE, {**BARE, "state_bytes_per_rank": {"exact": True},
                                           "comm_per_step": {"grad": {"predicted": 3, "measured": 3}},
                                           "idle_per_stage": {"predicted": None, "measured": [0.5]}}]})
    assert len(v.COLUMNS) == len(rows[0])
    assert rows[0] == ["torch_ddp", "dp2", "2", "1,234", "1,000", "+23.4%", "-5.0%", "+1.0%", "-10.0%", "NO",
                       "10.0%, 25.0%", "12.5%", "params: 4 vs 5; acts: 1 vs 2",
                       "oversubscribed; GUESSED basis: split a; split b; n1; n2"]
    assert rows[1] == ["tf_mirrored", "dp4", "4", "12", "10", "", "", "", "", "", "", "", "", ""]
    # counted bytes that all match say yes; a stage list missing on one side is an empty cell
    assert rows[2][9:13] == ["yes", "", "50.0%", "yes"]


def test_a_validation_that_predicted_nothing_says_so():
    assert v.summary_line({"summary": _summary(runs=0)}, "v.json") == "Validation (v.json): no run could be predicted."


def test_the_summary_says_each_error_it_has_and_nothing_it_lacks():
    plain = {"hardware": "h100", "summary": _summary()}
    assert v.summary_line(plain, "v.json") == (
        "Validation (v.json, hardware h100): step time median |error| 5.0%, largest 12.5% over 3 runs; "
        "state bytes exact in 2 of 3.")
    every = {"hardware": "h100", "summary": {
        **_summary(memory_per_rank={"runs": 3, "median_abs_error": 0.02, "max_abs_error": 0.04},
                   training_memory_per_rank={"runs": 2, "median_abs_error": 0.1, "max_abs_error": 0.3},
                   resting_on_a_guess=2),
        "oversubscribed_runs": 1, "skipped_runs": 4}}
    assert v.summary_line(every, "F") == (
        "Validation (F, hardware h100): step time median |error| 5.0%, largest 12.5% over 3 runs; memory per rank "
        "median 2.0%, largest 4.0%; training memory median 10.0%, largest 30.0%; state bytes exact in 2 of 3; "
        "1 run(s) oversubscribed, predicted as such; 4 run(s) left out (see validation.json). 2 of 3 predictions "
        "rest on a GUESSED split of their 1-device step; " + MEASURE_THE_SPLIT + ".")
    # a part no run measured is left out, not said as 0 of 0
    none = {"hardware": "h", "summary": _summary(memory_per_rank={"runs": 0}, training_memory_per_rank=None)}
    assert "memory" not in v.summary_line(none, "F").replace("median |error|", "")


def test_repeated_configurations_lead_the_summary_with_their_medians():
    configs = {"all": {"step_s": {"runs": 2, "median_abs_error": 0.1, "max_abs_error": 0.2}, "most_repeats": 3}}
    repeated = {"hardware": "h100", "summary": _summary(configurations=configs)}
    assert v.repeated(repeated)
    assert v.summary_line(repeated, "v.json") == (
        "Validation (v.json, hardware h100): step time median |error| 10.0%, largest 20.0% over 2 configurations "
        "(the median of up to 3 repeats each; run by run 5.0%, largest 12.5% over 3 runs); state bytes exact in "
        "2 of 3.")
    once = {"all": {**configs["all"], "most_repeats": 1}}
    assert not v.repeated({"summary": _summary(configurations=once)})
    assert not v.repeated({"summary": _summary()}) and not v.repeated({"summary": _summary(configurations={"x": 1})})


def test_each_configuration_is_a_row_of_its_repeats():
    validation = {"configurations": [
        {"backend": "torch_ddp", "layout": "dp2", "devices": 2, "oversubscribed": True, "runs": ["a", "b", "c"],
         "step_s": {"predicted": 1.5, "measured": 1.25, "error": 0.2, "measured_range": [1.0, 2.0]}},
        {"backend": "tf_mirrored", "layout": "dp4", "devices": 4, "oversubscribed": False, "runs": ["d"],
         "step_s": {"predicted": 0.0125, "measured": 0.0125, "error": None, "measured_range": [0.0125, 0.0125]}}]}
    assert v.config_rows(validation) == [
        ["torch_ddp", "dp2 (oversubscribed)", "2", "3", "1,500", "1,250", "1,000-2,000", "+20.0%"],
        ["tf_mirrored", "dp4", "4", "1", "12", "12", "12-12", ""]]
    assert v.config_rows({}) == []


def test_the_report_section_reads_validation_json_and_shows_the_configurations_only_when_repeated(tmp_path):
    assert v.validation_blocks(tmp_path) == []
    (tmp_path / v.FILE).write_text("{not json")
    assert v.load(tmp_path) is None and v.validation_blocks(tmp_path) == []
    plain = {"hardware": "h100", "summary": _summary(), "runs": [BARE]}
    (tmp_path / v.FILE).write_text(json.dumps(plain))
    assert v.load(tmp_path) == plain
    blocks = v.validation_blocks(tmp_path)
    assert blocks[0] == Heading("Prediction against measurement", 2)
    assert blocks[1] == Text(
        "Every multi-device run predicted by `bench.predict --validate` from this folder's 1-device runs and link "
        "probes only (docs/prediction.md). Errors are (predicted - measured) / measured of the median step and of "
        "each rank's peak memory (the worst rank); training memory is the growth over the start where a record "
        "measured it (record[\"memory\"]). " + v.summary_line(plain, "validation.json"))
    assert blocks[2:] == [Table(v.COLUMNS, v.rows(plain))]
    configs = {"all": {"step_s": {"runs": 1, "median_abs_error": 0.1, "max_abs_error": 0.2}, "most_repeats": 2}}
    repeated = {**plain, "summary": _summary(configurations=configs), "configurations": [
        {"backend": "tf_mirrored", "layout": "dp4", "devices": 4, "oversubscribed": False, "runs": ["d", "e"],
         "step_s": {"predicted": 0.0125, "measured": 0.01, "error": 0.25, "measured_range": [0.01, 0.01]}}]}
    (tmp_path / v.FILE).write_text(json.dumps(repeated))
    blocks = v.validation_blocks(tmp_path)
    assert blocks[2:] == [Text("Each configuration's repeats as one: the median of their predictions against the "
                               "median of their measured steps."),
                          Table(v.CONFIG_COLUMNS, [["tf_mirrored", "dp4", "4", "2", "12", "10", "10-10", "+25.0%"]]),
                          Table(v.COLUMNS, v.rows(repeated))]
