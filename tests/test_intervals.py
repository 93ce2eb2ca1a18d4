"""Rows measured several times: intervals, efficiency, 'no difference', and a folder against a baseline."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench.reporting.intervals import ROW_KEYS, baseline_frame, busy, interval_frame, ranked, row_key, same_speed
from common.config_key import config_key


def _record(devices: int, speed: float, seed: int, backend: str = "torch_ddp", load: float = 0.3) -> dict:
    """An ok record of the tiny MLM, weak scaling (global batch 32 x devices), measured at `speed` samples/s."""
    batch = 32 * devices
    steps = (batch / speed * np.exp(np.random.default_rng(seed).normal(0, 0.02, 30))).tolist()
    return {"run_id": f"{backend}-{devices}-{seed}", "status": "ok", "workload": "mlm", "backend": backend,
            "strategy": backend, "devices": devices, "device_kind": "cpu", "scaling": "weak", "global_batch": batch,
            "data": "synthetic", "config": {"precision": "fp32", "model_size": "tiny"},
            "layout": {"dp": devices, "tp": 1, "pp": 1, "micro_batches": 1, "schedule": "gpipe",
                       "fsdp": 1, "recompute": "none", "vocab_split": False},
            "step_times_s": steps, "host": {"cores": 2},
            "load": {"loadavg_1m_before": load, "loadavg_1m_after": 1.0, "cpu_steal_share": 0.0}}


def test_repeats_of_a_row_give_one_line_with_intervals_and_efficiency():
    records = [_record(1, s, i) for i, s in enumerate((100, 104, 97))]
    records += [_record(2, s, 10 + i) for i, s in enumerate((160, 150, 170))]
    frame = interval_frame(records).set_index("devices")
    assert frame.loc[1, "runs"] == 3 and frame.loc[2, "runs"] == 3
    one, two = frame.loc[1], frame.loc[2]
    assert one.samples_per_s_low <= one.samples_per_s <= one.samples_per_s_high
    assert two.efficiency == two.samples_per_s / (2 * one.samples_per_s)
    assert two.efficiency_low < two.efficiency < two.efficiency_high
    assert (one.efficiency, one.efficiency_low, one.efficiency_high) == (1, 1, 1)


def test_two_backends_inside_each_others_noise_are_not_ranked():
    a = interval_frame([_record(1, s, i) for i, s in enumerate((100, 110, 92))]).iloc[0]
    b = interval_frame([_record(1, s, 5 + i, "tf_mirrored") for i, s in enumerate((103, 96, 108))]).iloc[0]
    c = interval_frame([_record(1, s, 9 + i, "mindspore_auto") for i, s in enumerate((60, 61, 59))]).iloc[0]
    assert same_speed(a, b) and not same_speed(a, c)


def test_a_baseline_flags_a_slowdown_and_not_a_rerun():
    before = [_record(1, s, i) for i, s in enumerate((100, 102, 98))]
    rerun = [_record(1, s, 20 + i) for i, s in enumerate((99, 103, 100))]
    slower = [_record(1, s, 30 + i) for i, s in enumerate((70, 72, 69))]
    assert baseline_frame(rerun, before).verdict.tolist() == ["no difference"]
    flagged = baseline_frame(slower, before).iloc[0]
    assert flagged.verdict == "slower" and flagged.ratio_high < 1 and abs(flagged.ratio - 0.7) < 0.03
    # Rows only one folder has are not compared.
    assert baseline_frame([_record(2, 150, 40)], before).empty


def test_a_run_on_a_busy_machine_is_marked():
    assert not busy(_record(1, 100, 0, load=2.5))
    assert busy(_record(1, 100, 0, load=3.5))  # more than 1.5 runnable processes per core before it started
    stolen = _record(1, 100, 0)
    stolen["load"]["cpu_steal_share"] = 0.2
    assert busy(stolen)


def _folder(path, speeds: list[float], seed: int):
    """A results folder with repeats of the 1-device torch_ddp MLM row at `speeds`, records the report accepts."""
    from common.record import skeleton
    from common.results import validate_record, write_record

    for i, speed in enumerate(speeds):
        fields = _record(1, speed, seed + i)
        record = skeleton(f"2026112{i}T100000Z-torch_ddp-mlm-n1-{seed:03d}{i:03d}", "torch_ddp", "mlm", 1,
                          f"2026-11-23T10:0{i}:00+00:00", sweep_id="sweep-x", framework="torch",
                          framework_version="2.13.0", warmup_steps=1, seed=0, virtual=True, threads_per_device=1,
                          per_device_batch=32)
        step = float(np.mean(fields["step_times_s"]))
        record.update({k: fields[k] for k in ("strategy", "device_kind", "scaling", "global_batch", "data", "config",
                                              "layout", "step_times_s", "load")},
                      status="ok", measured_steps=30, samples_per_s=32 / step, tokens_per_s=32 * 128 / step,
                      step_time_s={"mean": step, "p50": step, "p90": step, "min": step, "max": step, "std": 0.0},
                      data_wait_fraction=0.0, params=1, flops_per_sample=1, achieved_flops=1.0,
                      peak_memory_bytes=1, loss={"first": 10.0, "last": 9.0, "curve": [[1, 10.0], [2, 9.0]]},
                      eval=None, duration_s=1.0)
        assert validate_record(record) == []
        write_record(record, path)
    return path


def test_report_against_a_baseline_fails_on_a_regression_only(tmp_path):
    from bench import report

    before = _folder(tmp_path / "before", [100, 102, 98], 0)
    rerun = _folder(tmp_path / "rerun", [99, 103, 100], 10)
    slower = _folder(tmp_path / "slower", [70, 72, 69], 20)
    assert report.main(["--results", str(rerun), "--baseline", str(before), "--fail-on-regression", "5"]) == 0
    assert report.main(["--results", str(slower), "--baseline", str(before), "--fail-on-regression", "5"]) == 1
    markdown = (slower / "report.md").read_text()
    assert "## Against the baseline" in markdown and "| slower |" in markdown
    assert "## Repeated rows: medians and 95% intervals" in markdown
    assert (slower / "plots" / "mlm-baseline-loss.png").is_file() and (slower / "plots" / "mlm-repeats.png").is_file()
    # 30% slower is within a 40% allowance: reported as slower, not failed.
    assert report.main(["--results", str(slower), "--baseline", str(before), "--fail-on-regression", "40"]) == 0
    assert "| slower |" in (slower / "report.md").read_text()


def test_rows_rank_by_speed_and_only_beyond_the_noise():
    fast = [_record(2, s, i) for i, s in enumerate((200, 204, 197))]
    close = [_record(2, s, 5 + i, "tf_mirrored") for i, s in enumerate((199, 203, 196))]
    slow = [_record(2, s, 9 + i, "mindspore_auto") for i, s in enumerate((120, 121, 119))]
    other = [_record(1, 50, 20, "mindspore_auto")]
    table = ranked(interval_frame(fast + close + slow + other))
    assert table[["devices", "backend"]].values.tolist() == [[1, "mindspore_auto"], [2, "torch_ddp"],
                                                             [2, "tf_mirrored"], [2, "mindspore_auto"]]
    speeds = table.samples_per_s.tolist()
    assert table.vs_fastest.tolist() == ["fastest", "fastest", "no difference", f"{speeds[3] / speeds[1]:.2f}x"]
    assert table.vs_fastest.iloc[3] == "0.60x" and list(table.columns)[-1] == "vs_fastest"


def test_a_row_is_its_configuration_and_only_ok_measured_runs_count():
    base = _record(2, 150, 1)
    key, devices = row_key(base)
    assert devices == 2 and key == config_key(base)
    assert (key.workload, key.backend, key.device_kind, key.scaling, key.precision, key.model_size, key.data) == \
        ("mlm", "torch_ddp", "cpu", "weak", "fp32", "tiny", "synthetic")
    # The data-parallel width is the device count, not the configuration: a record without a layout is plain dp.
    assert row_key({**base, "layout": None}) == row_key(base)
    assert row_key({**base, "config": {**base["config"], "model_size": "mini"}})[0] != key
    frame = interval_frame([base, {**base, "status": "failed"}, {**base, "step_times_s": []},
                            {**base, "global_batch": 0}, {**base, "load": {"loadavg_1m_before": 9.0}}])
    [line] = frame.to_dict("records")
    assert (line["runs"], line["busy_runs"]) == (2, 1)
    assert line["efficiency"] is None and line["efficiency_low"] is None and line["efficiency_high"] is None
    assert line["samples_per_s"] == pytest.approx(150, rel=0.05)
    assert list(frame.columns) == [*ROW_KEYS, "key", "runs", "sweeps", "busy_runs", "samples_per_s",
                                   "samples_per_s_low", "samples_per_s_high", "efficiency", "efficiency_low",
                                   "efficiency_high"]


def test_scaling_is_held_against_one_device_of_the_right_batch():
    one, two = _record(1, 100, 1), _record(2, 150, 2)
    weak = interval_frame([one, two]).set_index("devices")
    assert weak.loc[2, "efficiency"] == pytest.approx(weak.loc[2, "samples_per_s"] / (2 * weak.loc[1,
                                                                                                "samples_per_s"]))
    # strong scaling: the 1-device row of the same global batch (64), not of 32
    strong_one = {**_record(1, 100, 3), "scaling": "strong", "global_batch": 64}
    strong_two = {**two, "scaling": "strong"}
    assert pd.isna(interval_frame([{**one, "scaling": "strong"}, strong_two]).set_index("devices").loc[2,
                                                                                                      "efficiency"])
    strong = interval_frame([strong_one, strong_two]).set_index("devices")
    assert strong.loc[2, "efficiency"] == pytest.approx(strong.loc[2, "samples_per_s"] /
                                                        (2 * strong.loc[1, "samples_per_s"]))
    # a record without a layout is plain data parallel: its 1-device row is the reference of dp2 ...
    plain = interval_frame([{**one, "layout": None}, two]).set_index("devices")
    assert plain.loc[2, "efficiency"] == pytest.approx(plain.loc[2, "samples_per_s"] / (2 * plain.loc[1,
                                                                                                  "samples_per_s"]))
    # ... and a 1-device run of another configuration (another model size) is no reference at all
    mini = {**one, "config": {**one["config"], "model_size": "mini"}}
    assert pd.isna(interval_frame([mini, two]).set_index("devices").loc[2, "efficiency"])


def test_a_baseline_row_by_the_numbers():
    before = [_record(1, s, i) for i, s in enumerate((100, 102, 98))]
    after = [_record(1, s, 30 + i) for i, s in enumerate((95, 95, 95))]
    [line] = baseline_frame(after, before + [_record(2, 150, 40)]).to_dict("records")
    assert (line["runs"], line["baseline_runs"], line["devices"]) == (3, 3, 1)
    assert line["ratio"] == pytest.approx(line["samples_per_s"] / line["baseline_samples_per_s"])
    assert line["samples_per_s"] == pytest.approx(95, rel=0.02) and line["ratio_low"] < line["ratio"] < \
        line["ratio_high"]
    assert line["verdict"] == "slower" and baseline_frame(after, before, threshold=0.1).verdict.tolist() == \
        ["no difference"]


def test_busy_at_its_thresholds():
    assert not busy(_record(1, 100, 0, load=3.0))  # 1.5 per core on 2 cores: not beyond
    assert busy({"load": {"loadavg_1m_before": 1.6}})  # no core count: one
    assert not busy({"load": {"cpu_steal_share": 0.05}}) and busy({"load": {"cpu_steal_share": 0.051}})
    assert not busy({}) and not busy({"load": {"loadavg_1m_before": None, "cpu_steal_share": None}})


def test_empty_tables_keep_their_columns_and_rows_sort_whatever_their_keys_hold():
    assert list(ranked(interval_frame([])).columns) == [*interval_frame([]).columns, "vs_fastest"]
    empty = baseline_frame([_record(2, 150, 40)], [_record(1, 100, 0)])
    assert empty.empty and list(empty.columns) == [*ROW_KEYS, "key", "runs", "baseline_runs", "samples_per_s",
                                                   "baseline_samples_per_s", "ratio", "ratio_low", "ratio_high",
                                                   "verdict"]
    # a record that says nothing of its precision has the default of its time (fp32): the same row as one that says
    # fp32; another model size is another row, and rows sort whatever their keys hold
    said, unsaid = _record(1, 100, 1), {**_record(1, 100, 2), "config": {"model_size": "tiny"}}
    assert len(baseline_frame([said, unsaid], [said, unsaid])) == 1
    mini = {**_record(1, 100, 3), "config": {"model_size": "mini"}}
    assert len(baseline_frame([said, mini], [said, mini])) == 2


def test_a_row_names_its_configuration_in_its_own_columns():
    # A reader sees these columns (report tables, baseline.csv): each must carry its own field of the record.
    runs = [{**_record(2, 150, i), "strategy": "ddp-gloo", "sweep_id": sweep} for i, sweep in enumerate("aab")]
    [line] = interval_frame(runs).to_dict("records")
    named = {"workload": "mlm", "backend": "torch_ddp", "strategy": "ddp-gloo", "layout": "dp2", "devices": 2,
             "device_kind": "cpu", "scaling": "weak", "global_batch": 64, "precision": "fp32", "model_size": "tiny",
             "data": "synthetic"}
    assert {k: line[k] for k in ROW_KEYS} == named
    assert line["key"] == config_key(runs[0]) and (line["runs"], line["sweeps"]) == (3, 2)
    # without a layout section the layout column is blank
    assert interval_frame([{**runs[0], "layout": None}]).layout.tolist() == [""]


def test_a_baseline_from_another_host_of_the_same_kind_is_compared():
    # A baseline folder may come from another machine: its rows match on the key less the host, on both sides.
    mine = [{**_record(1, 100, i), "host": {"cores": 2, "name": "vm-a"}} for i in range(3)]
    theirs = [{**_record(1, 100, 10 + i), "host": {"cores": 2, "name": "vm-b"}} for i in range(3)]
    [line] = baseline_frame(mine, theirs).to_dict("records")
    assert line["key"] == config_key(mine[0]).without("host") and line["key"].host is None
    assert (line["backend"], line["devices"], line["runs"], line["baseline_runs"]) == ("torch_ddp", 1, 3, 3)
    assert line["verdict"] == "no difference"
