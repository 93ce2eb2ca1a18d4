"""The workload table (bench.reporting.tables) and the plan table (bench.reporting.plan): each cell's format, the
remarks, the efficiency or why there is none, and a workload's table from records written here, row by row."""
from __future__ import annotations

import json
import math
from functools import partial
from types import SimpleNamespace

from bench.reporting import tables
from bench.reporting.document import Heading, Table, Text
from bench.reporting.plan import COLUMNS, PLANS_DIR, plan_blocks, plan_rows
from common.config_key import NO_REFERENCE
from common.results import summary_frame
from tests.conftest import summary_record

NAN = float("nan")


def test_each_figure_has_its_format_and_a_missing_one_an_empty_cell():
    assert [tables.fmt_number(1234.567), tables.fmt_number(1234.567, 0), tables.fmt_number(0)] == \
        ["1,234.6", "1,235", "0.0"]
    assert [tables.fmt_ms(1.2345678), tables.fmt_ms(0)] == ["1,234.57", "0.00"]
    assert [tables.fmt_share(0.12345), tables.fmt_mib(3 * 2**20 + 2**19 + 1), tables.fmt_mib(2**30)] == \
        ["12.3%", "4", "1,024"]
    assert [tables.fmt_efficiency(0.876), tables.fmt_accuracy(0.98765)] == ["0.88", "0.9877"]
    for fmt in (tables.fmt_number, tables.fmt_ms, tables.fmt_share, tables.fmt_mib, tables.fmt_efficiency,
                tables.fmt_accuracy):
        assert fmt(None) == "" and fmt(NAN) == ""


def _row(**fields):
    return SimpleNamespace(**{"status": "ok", "error": None, "oversubscribed": None, "device_kind": "cpu",
                              "virtual": None, "scaling_efficiency": NAN, **fields})


def test_the_device_cell_says_virtual_only_where_the_run_was():
    assert tables.device_cell(_row(device_kind=NAN)) == "" and tables.device_cell(_row(device_kind=None)) == ""
    assert tables.device_cell(_row(virtual=True)) == "cpu (virtual)"
    assert [tables.device_cell(_row(virtual=v)) for v in (False, None, NAN)] == ["cpu", "cpu", "cpu"]


def test_a_remark_says_why_there_are_no_numbers_or_what_qualifies_them():
    assert tables.remark(_row(status="failed", error="OOM at step 3"), {}, 1, 1, 0) == "OOM at step 3"
    assert tables.remark(_row(status="unsupported"), {}, 1, 1, 0) == ""
    assert tables.remark(_row(), {}, 1, 1, 1) == ""
    assert tables.remark(_row(oversubscribed=True), {"stopped_early": True, "steps_done": 7}, 3, 2, 2) == (
        "oversubscribed: devices x threads > cores; stopped early at step 7; the latest of 3 runs of this "
        "configuration in its sweep; measured in 2 sweeps, a row each; its spread over them: Repeated rows")
    # one timed run over the sweeps: no spread to point to
    assert tables.remark(_row(oversubscribed=NAN), {"stopped_early": False}, 2, 2, 1) == (
        "the latest of 2 runs of this configuration in its sweep; measured in 2 sweeps, a row each")


def test_the_efficiency_cell_says_why_an_ok_run_has_none():
    assert tables.efficiency_cell(_row(scaling_efficiency=0.876), False) == "0.88"
    assert tables.efficiency_cell(_row(), False) == NO_REFERENCE
    assert tables.efficiency_cell(_row(), True) == NO_REFERENCE + " in its sweep"
    assert tables.efficiency_cell(_row(status="failed"), True) == ""


_record = partial(summary_record, virtual=True)


def test_a_workload_table_keeps_the_latest_run_of_each_row_and_fills_every_cell():
    measured = {"mfu": 0.125, "mfu_achievable": 0.25, "step_time_s": {"p50": 0.32, "p90": 0.4},
                "data_wait_fraction": 0.015, "peak_memory_bytes": 3 * 2**20, "step_times_s": [0.32]}
    records = [
        _record("old", 1, 50.0, "2026-01-01T00:00:00", **measured),
        _record("one", 1, 100.0, "2026-01-01T01:00:00", **measured,
                eval={"metric": "perplexity", "value": 12.345678}),
        _record("two", 2, 160.0, "2026-01-01T02:00:00", oversubscribed=True),
        _record("amp2", 2, 150.0, "2026-01-01T03:00:00", precision="amp"),
        _record("tf2", 2, None, "2026-01-01T04:00:00", backend="tf_mirrored", status="failed", error="boom"),
        _record("other", 1, 90.0, "2026-01-01T05:00:00", sweep="sweep-b", **measured),
        _record("lone", 2, 180.0, "2026-01-01T05:30:00", sweep="sweep-c"),
        _record("cnn", 1, 10.0, "2026-01-01T06:00:00", workload="cnn", eval={"metric": "accuracy", "value": 0.5})]
    frame = summary_frame(records)
    above, columns, body = tables.workload_table(frame, {r["run_id"]: r for r in records}, "mlm")
    assert columns == ["backend", "precision", "sweep", "device", "N", "data", "status", "tokens/s",
                       "scaling efficiency", "MFU", "MFU (measured peak)", "step p50 (ms)", "step p90 (ms)",
                       "data wait", "peak memory (MiB)", "perplexity", "reason / notes"]
    # the device and data are columns always, never said here
    assert above == ("Same in every row: host h1, model tiny, batch 32 per device, micro-batches 1, layout dp, "
                     "compile eager, threads/device 1, scaling weak. tf_mirrored: strategy/mode tf_mirrored. "
                     "torch_ddp: strategy/mode torch_ddp.")
    assert body == [
        ["tf_mirrored", "fp32", "a", "cpu (virtual)", "2", "synthetic", "failed", "", "", "", "", "", "", "", "",
         "", "boom"],
        ["torch_ddp", "amp", "a", "cpu (virtual)", "2", "synthetic", "ok", "19,200.0", NO_REFERENCE, "", "", "",
         "", "", "", "", ""],
        ["torch_ddp", "fp32", "a", "cpu (virtual)", "1", "synthetic", "ok", "12,800.0", "1.00", "12.5%", "25.0%",
         "320.00", "400.00", "1.5%", "3", "12.3457",
         "the latest of 2 runs of this configuration in its sweep; measured in 2 sweeps, a row each; its spread "
         "over them: Repeated rows"],
        ["torch_ddp", "fp32", "a", "cpu (virtual)", "2", "synthetic", "ok", "20,480.0", "0.80", "", "", "", "", "",
         "", "", "oversubscribed: devices x threads > cores; measured in 2 sweeps, a row each"],
        ["torch_ddp", "fp32", "b", "cpu (virtual)", "1", "synthetic", "ok", "11,520.0", "1.00", "12.5%", "25.0%",
         "320.00", "400.00", "1.5%", "3", "", "measured in 2 sweeps, a row each; its spread over them: "
                                              "Repeated rows"],
        # a 1-device run of its configuration, but in another sweep
        ["torch_ddp", "fp32", "c", "cpu (virtual)", "2", "synthetic", "ok", "23,040.0", NO_REFERENCE + " in its sweep",
         "", "", "", "", "", "", "", "measured in 2 sweeps, a row each"]]
    # samples/s where the workload counts samples, and accuracy where no run evaluated
    _, columns, body = tables.workload_table(frame, {r["run_id"]: r for r in records}, "cnn")
    assert columns[:3] == ["backend", "device", "N"] and "samples/s" in columns and "accuracy" in columns
    assert body[0][5] == "10.0" and body[0][-2] == "0.5000"
    both = [records[1], {**records[2], "eval": {"metric": "accuracy", "value": 0.25}}]
    assert tables.workload_table(summary_frame(both), {r["run_id"]: r for r in both}, "mlm")[1][-2] == \
        "accuracy/perplexity"
    no_eval = [r for r in records if r["run_id"] == "two"]
    assert tables.workload_table(summary_frame(no_eval), {"two": no_eval[0]}, "mlm")[1][-2] == "accuracy"


def _plan_row(rank, layout, step_s, measured=None, fit="yes") -> dict:
    row = {"rank": rank, "layout": layout, "step_s": step_s, "samples_per_s": 32 / step_s,
           "memory_per_rank_max": 1.5 * 2**30, "fit": fit, "explanation": f"{layout} wins"}
    return {**row, "measured": measured} if measured is not None else row


def test_a_plan_row_sets_the_prediction_beside_what_was_measured():
    rows = plan_rows([
        _plan_row(1, "dp2", 0.0125, {"samples_per_s": 2500.25, "low": 2400.0, "high": 2600.5, "rank": 2,
                                     "peak_per_rank_max": 2**30}),
        _plan_row(2, "tp2", 1.6, {"samples_per_s": 1999.0, "rank": 1}),
        _plan_row(None, "pp2", 2.0, {"status": "failed"}, fit="no"),
        _plan_row(3, "dp1", 4.0)])
    assert rows == [
        ["1", "dp2", "12", "2,560.0", "2,500.2 [2,400.0, 2,600.5]", "2", "1.50", "1.00", "yes", "dp2 wins"],
        ["2", "tp2", "1,600", "20.0", "1,999.0", "1", "1.50", "", "yes", "tp2 wins"],
        ["-", "pp2", "2,000", "16.0", "failed", "", "1.50", "", "no", "pp2 wins"],
        ["3", "dp1", "4,000", "8.0", "", "", "1.50", "", "yes", "dp1 wins"]]
    assert len(rows[0]) == len(COLUMNS)


def test_the_plan_section_shows_each_plan_s_top_ten_and_every_measured_row(tmp_path):
    assert plan_blocks(tmp_path) == []
    ranked = [_plan_row(i, f"l{i}", 1.0) for i in range(1, 13)]
    ranked.append(_plan_row(None, "refused", 1.0, fit="no"))
    ranked.append(_plan_row(None, "ran", 1.0, {"status": "failed"}, fit="no"))
    ranked[11] = _plan_row(12, "l12", 1.0, {"samples_per_s": 30.0})
    plans = tmp_path / PLANS_DIR
    plans.mkdir()
    (plans / "a.json").write_text(json.dumps({"title": "Plan A", "basis": "From x", "summary": ["One.", "Two."],
                                              "rows": ranked, "measured": {"summary": "Measured 2."}}))
    (plans / "b.json").write_text(json.dumps({"title": "Plan B", "basis": "From y", "summary": [],
                                              "rows": ranked[:1]}))
    blocks = plan_blocks(tmp_path)
    assert blocks[:2] == [Heading("Plans: layouts chosen without trial runs", 2), Text(
        "Each plan (`bench.plan`, docs/plan.md) predicts every valid layout of its devices, drops those predicted not "
        "to fit and ranks the rest by predicted step; where the plan was run (`--run`, `nox -s plan-check`) the "
        "measured samples/s stand beside the predicted ones.")]
    assert blocks[2:5] == [Heading("Plan A", 3), Text("From x. One. Two. Measured 2."),
                           Table(COLUMNS, plan_rows(ranked[:10] + [ranked[11], ranked[13]]))]
    assert blocks[5:] == [Heading("Plan B", 3), Text("From y. "), Table(COLUMNS, plan_rows(ranked[:1]))]
    assert math.isclose(ranked[0]["samples_per_s"], 32.0)
