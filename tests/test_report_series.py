"""Which runs share a line of a figure and how each line is named, coloured and drawn (bench.reporting.series),
worked by hand from records written here."""
from __future__ import annotations

from bench.reporting import series as s
from common.results import summary_frame
from tests.conftest import summary_record


def _series(records):
    return s.build_series(records, summary_frame(records))


def test_each_configuration_in_each_sweep_is_a_line_of_its_latest_ok_runs():
    records = [summary_record("old", 1, 50.0, "2026-01-01T00"), summary_record("one", 1, 100.0, "2026-01-01T01"),
               summary_record("two", 2, 160.0, "2026-01-01T02", virtual=True),
               summary_record("broken", 4, None, "2026-01-01T03", status="failed"),
               summary_record("eval-only", 8, None, "2026-01-01T04"),
               summary_record("amp", 1, 90.0, "2026-01-01T05", precision="amp"),
               summary_record("tf", 1, 80.0, "2026-01-01T06", backend="tf_mirrored"),
               summary_record("far", 1, 70.0, "2026-01-01T07", host="h2"),
               summary_record("again", 1, 95.0, "2026-01-01T08", sweep="sweep-b"),
               summary_record("cnn", 1, 10.0, "2026-01-01T09", workload="cnn")]
    out = _series(records)
    assert list(out) == ["mlm", "cnn"]
    mlm = out["mlm"]
    assert [(x.label, x.sweep, {n: r["run_id"] for n, r in x.runs.items()}) for x in mlm] == [
        ("tf_mirrored · h1 · fp32 · sweep a", "sweep-a", {1: "tf"}),
        ("torch_ddp · h1 · amp · sweep a", "sweep-a", {1: "amp"}),
        ("torch_ddp · h1 · fp32 · sweep a", "sweep-a", {1: "one", 2: "two"}),
        ("torch_ddp · h1 · fp32 · sweep b", "sweep-b", {1: "again"}),
        ("torch_ddp · h2 · fp32 · sweep a", "sweep-a", {1: "far"})]
    # a colour per configuration (machines aside), a marker, line style and hatch per machine, a panel per machine
    assert [(x.color, x.marker, x.linestyle, x.hatch, x.panel) for x in mlm] == [
        ("#1f77b4", "o", "-", "", "h1 · cpu"), ("#d62728", "o", "-", "", "h1 · cpu"),
        ("#2ca02c", "o", "-", "", "h1 · cpu"), ("#2ca02c", "o", "-", "", "h1 · cpu"),
        ("#2ca02c", "s", "--", "//", "h2 · cpu")]
    line = mlm[2]
    assert line.devices == [1, 2] and line.efficiency == {1: 1.0, 2: 0.8} and line.virtual_devices == [2]
    assert (line.throughput(1), line.throughput(2)) == (12800.0, 20480.0)  # tokens/s for a token workload
    assert line.machine == "h1 · cpu" and line.cells["precision"] == "fp32"
    (cnn,) = out["cnn"]
    assert cnn.label == "torch_ddp" and cnn.throughput(1) == 10.0 and cnn.panel == "h1 · cpu"


def test_a_panel_title_says_which_of_its_devices_were_virtual():
    whole = _series([summary_record("a", 1, 1.0, "1", virtual=True), summary_record("b", 2, 1.0, "2", virtual=True)])
    part = _series([summary_record("a", 1, 1.0, "1"), summary_record("b", 2, 1.0, "2", virtual=True)])
    assert s.panel_title("m", whole["mlm"]) == "m (virtual)"
    assert s.panel_title("m", part["mlm"]) == "m (hollow markers: virtual devices)"
    assert s.panel_title("m", _series([summary_record("a", 1, 1.0, "1")])["mlm"]) == "m"


def test_model_sizes_get_panels_of_their_own_and_styles_and_colours_wrap_around():
    sized = _series([summary_record("t", 1, 1.0, "1"), summary_record("b", 1, 1.0, "2", size="base")])["mlm"]
    assert [(x.label, x.panel) for x in sized] == [("torch_ddp · base", "h1 · cpu · model base"),
                                                   ("torch_ddp · tiny", "h1 · cpu · model tiny")]
    hosts = _series([summary_record(f"h{i}", 1, 1.0, str(i), host=f"h{i}") for i in range(7)])["mlm"]
    assert [x.marker for x in hosts] == ["o", "s", "^", "D", "v", "P", "o"]
    assert [x.color for x in hosts] == ["#1f77b4"] * 7
    batches = _series([summary_record(f"b{i}", 1, 1.0, str(i), batch=10 + i) for i in range(17)])["mlm"]
    assert [x.color for x in batches] == [*s.COLORS, s.COLORS[0]]


def test_a_line_s_label_and_what_its_figure_says_once():
    cells = {"backend": "torch_ddp", "micro_batches": "4", "precision": "amp"}
    assert s.series_label(cells, ["precision", "micro_batches"]) == "torch_ddp · amp · 4 micro-batches"
    assert s.series_label(cells, []) == "torch_ddp"
    lines = _series([summary_record("a", 1, 1.0, "1"), summary_record("b", 1, 1.0, "2", precision="amp"),
                     summary_record("c", 1, 1.0, "3", backend="tf_mirrored")])["mlm"]
    assert s.describe_lines(lines) == (
        "Same in every line: host h1, device cpu, model tiny, batch 32 per device, micro-batches 1, layout dp, "
        "compile eager, threads/device 1, scaling weak, sweep a. tf_mirrored: strategy/mode tf_mirrored. "
        "torch_ddp: strategy/mode torch_ddp.")
    assert [s.throughput_unit(w) for w in ("mlm", "lm", "cnn")] == ["tokens/s", "tokens/s", "samples/s"]
