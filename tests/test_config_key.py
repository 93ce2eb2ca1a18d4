"""The configuration key: efficiency only against a 1-device run of the same configuration in the same sweep,
tables that show what tells their rows apart, and a folder of several sweeps indexed and reported one at a time.
The reference sweep (results/reference/h100x1: 13 real 1-device runs of different configurations on one H100) is
the case that read 7.12 and 0.15 as 'scaling efficiencies' of 1-device runs before the key existed."""
from __future__ import annotations

import re
import shlex

import pytest

from bench import report
from bench.compare import build_parser as compare_parser
from bench.compare import sweep_plan
from bench.reporting.layouts import in_layout_table
from bench.reporting.plots import PLOTTERS
from bench.reporting.series import build_series
from bench.reporting.tables import workload_table
from common.config_key import (
    NO_REFERENCE,
    ConfigKey,
    config_key,
    describe,
    latest_within_sweep,
    layout_label,
    reference_key,
    reference_throughputs,
    started,
)
from common.layout import Layout
from common.record import skeleton
from common.results import load_records, summary_frame, validate_record, write_record
from common.spec import BERT_SIZES
from tests.conftest import REPO, TORCH_SWEEP

REFERENCE = REPO / "results" / "reference" / "h100x1"
KEY_COLUMNS = ("model", "precision", "batch", "micro-batches", "layout")


def _tables(markdown: str) -> dict[str, list[dict]]:
    """Per workload, the rows of its run table as {column: cell} (the first table after its heading)."""
    tables = {}
    for section in re.split(r"^## Workload `", markdown, flags=re.M)[1:]:
        workload, body = section.split("`", 1)
        first = next(block for block in body.split("\n\n") if block.startswith("|"))
        split = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in first.splitlines()]
        tables[workload] = [dict(zip(split[0], row)) for row in split[2:]]
    return tables


def _table(records: list[dict], workload: str) -> tuple[str, list[dict]]:
    """The sentence above a workload's table, and its rows as {column: cell}, as the report writes them."""
    above, columns, rows = workload_table(summary_frame(records), {r["run_id"]: r for r in records}, workload)
    return above, [dict(zip(columns, row)) for row in rows]


@pytest.fixture(scope="module")
def reference() -> list[dict]:
    return load_records(REFERENCE)


def test_the_reference_sweep_has_no_efficiency_against_another_configuration(reference):
    records = reference
    assert len(records) == 13 and {r["devices"] for r in records} == {1}
    # Every run is its own configuration's only 1-device run: its efficiency is 1 (against itself), and
    # summary.csv says the same.
    assert summary_frame(records).scaling_efficiency.tolist() == [1.0] * 13
    _, rows = _table(records, "mlm")
    assert len(rows) == 12 and all(row["scaling efficiency"] == "1.00" for row in rows)


def test_the_reference_sweep_table_names_what_tells_its_rows_apart(reference):
    records = reference
    above, rows = _table(records, "mlm")
    assert set(KEY_COLUMNS) <= set(rows[0])
    told_apart = {(row["backend"], *(row[c] for c in KEY_COLUMNS), row["scaling"]) for row in rows}
    assert len(told_apart) == len(rows)  # no two rows read alike
    # What every row shares is said once, above the table; the rows hold the record's own values.
    assert above.startswith("Same in every row: host vm, compile eager")
    by_throughput = {f"{r['tokens_per_s']:,.1f}": r for r in records if r["workload"] == "mlm"}
    for row in rows:
        record = by_throughput[row["tokens/s"]]
        assert row["model"] == record["config"]["model_size"] and row["precision"] == record["config"]["precision"]
        accumulated = record["config"]["grad_accum"] * record["layout"]["micro_batches"]
        assert row["micro-batches"] == str(accumulated)
        assert row["layout"] == ("dp-rc" if record["layout"]["recompute"] else "dp")


def test_the_reference_sweep_figures_never_put_two_model_sizes_on_one_axis(reference):
    lines = [r for r in reference if not in_layout_table(r)]
    series = build_series(lines, summary_frame(lines))["mlm"]
    plots = [plotter("mlm", series, "") for plotter in PLOTTERS]
    for plot in plots:
        for ax in plot.figure.axes:
            names = [t.get_text() for t in ax.get_yticklabels()] + [ln.get_label() for ln in ax.get_lines()]
            sizes = {size for name in names for size in ("tiny", "base") if f" {size} " in f" {name} "}
            assert len(sizes) <= 1, (plot.slug, ax.get_title(), sizes)
    # Nothing scaled: no efficiency figure of ones.
    assert [p.slug for p in plots if p.data] == ["mlm-throughput", "mlm-step-time", "mlm-loss", "mlm-time-to-accuracy"]


def _run(run_id: str, devices: int, sps: float | None, sweep: str = "sweep-a", precision: str = "amp",
         started: str = "2026-11-24T10:00:00+00:00", grad_accum: int = 1, status: str = "ok",
         tp: int = 1, command: str = "") -> dict:
    """A torch_3d MLM run at global batch 32 (strong scaling) on host h, with the fields the key reads."""
    layout = Layout(dp=devices // tp, tp=tp).as_record(BERT_SIZES["tiny"], 32)
    record = skeleton(run_id, "torch_3d", "mlm", devices, started, sweep_id=sweep, sweep_command=command,
                      data="real", scaling="strong", strategy=f"torch_3d dp{devices // tp} x tp{tp} x pp1",
                      mode="DeviceMesh", framework="torch", framework_version="2.11", device_kind="cuda",
                      virtual=False, threads_per_device=0, host={"name": "h", "cores": 16}, layout=layout,
                      global_batch=32, per_device_batch=32 * tp // (devices * grad_accum),
                      config={"model_size": "base", "precision": precision, "grad_accum": grad_accum, "compile": ""})
    if status != "ok":
        record.update(status=status, error="out of memory", duration_s=1.0)
    else:
        step = 32 / sps
        record.update(status="ok", measured_steps=10, samples_per_s=sps, tokens_per_s=sps * 128, params=1,
                      flops_per_sample=1, step_time_s=dict.fromkeys(("mean", "p50", "p90", "min", "max"), step)
                      | {"std": 0.0}, step_times_s=[step * f for f in (0.98, 1.0, 1.02)],
                      loss={"first": 10.0, "last": 9.0, "curve": [[1, 10.0], [2, 9.0]]}, duration_s=10.0)
    assert validate_record(record) == [], run_id
    return record


def test_efficiency_divides_only_by_the_same_configuration_in_the_same_sweep():
    records = [
        _run("a1", 1, 100.0), _run("a2", 2, 180.0),                    # amp at 1 and 2 devices
        _run("f2", 2, 90.0, precision="fp32"),                          # fp32 at 2 only: no reference
        _run("m1", 1, 70.0, grad_accum=2), _run("m2", 2, 120.0, grad_accum=2),  # 2 micro-batches: its own
        _run("t2", 2, 150.0, tp=2),                                      # tp2: the plain 1-device run of batch 32
        _run("b2", 2, 170.0, sweep="sweep-b"),                          # another sweep: not a's 1-device run
    ]
    frame = summary_frame(records).set_index("run_id").scaling_efficiency
    assert frame["a2"] == pytest.approx(180 / (2 * 100)) and frame["m2"] == pytest.approx(120 / (2 * 70))
    assert frame["t2"] == pytest.approx(150 / (2 * 100))
    assert frame[["f2", "b2"]].isna().all()
    assert reference_key(config_key(records[5])) == config_key(records[0])
    cells = {(row["precision"], row["micro-batches"], row["layout"], row["sweep"], row["N"]): row["scaling efficiency"]
             for row in _table(records, "mlm")[1]}
    assert cells["fp32", "1", "dp", "a", "2"] == NO_REFERENCE
    assert cells["amp", "1", "dp", "b", "2"] == f"{NO_REFERENCE} in its sweep"  # a has one; b is not held to it
    assert cells["amp", "1", "dp", "a", "2"] == "0.90" and cells["amp", "2", "dp", "a", "2"] == f"{120 / 140:.2f}"
    assert cells["amp", "1", "dp x tp2", "a", "2"] == "0.75"


def test_an_old_record_keys_with_the_defaults_of_its_time():
    old = skeleton("x", "torch_3d", "mlm", 2, "2026-01-01T00:00:00", strategy="torch_3d dp2 x tp1 x pp1",
                   scaling="weak", per_device_batch=32)
    one = skeleton("y", "torch_3d", "mlm", 1, "2026-01-01T00:00:00", strategy="torch_3d dp1 x tp1 x pp1",
                   scaling="weak", per_device_batch=32)
    key = config_key(old)
    assert (key.model_size, key.precision, key.compile, key.micro_batches) == ("tiny", "fp32", "", 1)
    assert key == config_key(one)  # the dp count in an old strategy name does not make another configuration


def test_a_layout_sweep_measures_a_recomputing_reference_for_a_recomputing_layout():
    args = compare_parser().parse_args(["--layouts", "dp2,tp2-rc", "--backends", "torch_3d", "--workloads", "mlm",
                                        "--batch-size", "8"])
    args.scaling = "strong"
    plan = sweep_plan(args)
    assert [(n, lay.name) for _, _, n, lay, _ in plan] == [(1, "1 device"), (1, "1 device-rc"), (2, "dp2"),
                                                           (2, "tp2-rc")]


def _folder(path):
    runs = [
        _run("s1-a", 1, 100.0, started="2026-11-24T10:00:00+00:00", command="python -m bench.compare --gpus 1,2"),
        _run("s1-b", 1, 104.0, started="2026-11-24T10:01:00+00:00", command="python -m bench.compare --gpus 1,2"),
        _run("s1-c", 2, 180.0, started="2026-11-24T10:02:00+00:00", command="python -m bench.compare --gpus 1,2"),
        _run("s2-a", 1, 96.0, sweep="sweep-20261125T090000Z-abcdef", started="2026-11-25T09:00:00+00:00",
             command="python -m bench.compare --gpus 1"),
        _run("s2-b", 2, None, sweep="sweep-20261125T090000Z-abcdef", started="2026-11-25T09:01:00+00:00",
             status="failed", command="python -m bench.compare --gpus 1"),
        _run("solo", 1, 50.0, sweep="", precision="fp32", started="2026-11-26T09:00:00+00:00"),
    ]
    for record in runs:
        write_record(record, path)
    return path


def test_a_folder_of_several_sweeps_is_indexed_and_each_is_reported_alone(tmp_path):
    folder = _folder(tmp_path / "results")
    assert report.main(["--results", str(folder)]) == 0
    markdown = (folder / "report.md").read_text()
    index = markdown.split("## Sweeps")[1].split("## Hardware")[0]
    assert "| a | 2026-11-24 10:00:00 to 2026-11-24 10:02:00 | python -m bench.compare --gpus 1,2 | torch_3d | mlm | " \
           "3 ok |" in index
    assert "| 20261125T090000Z-abcdef | 2026-11-25 09:00:00 to 2026-11-25 09:01:00 | python -m bench.compare " \
           "--gpus 1 | torch_3d | mlm | 1 ok, 1 failed |" in index
    assert "| no sweep (--sweep none) | 2026-11-26 09:00:00 | bench.run, a command per run |" in index
    rows = _tables(markdown)["mlm"]
    # The latest run of a configuration wins within its sweep only: sweep a's two 1-device runs are one row,
    # sweep 2's is another, each sweep's 2-device run its own (the failed one with its reason).
    assert sorted((r["sweep"], r["N"], r["status"]) for r in rows) == [
        ("20261125T090000Z-abcdef", "1", "ok"), ("20261125T090000Z-abcdef", "2", "failed"), ("a", "1", "ok"),
        ("a", "2", "ok"), ("no sweep", "1", "ok")]
    [one] = [r for r in rows if (r["sweep"], r["N"]) == ("a", "1")]
    assert one["tokens/s"] == f"{104 * 128:,.1f}" and "the latest of 2 runs" in one["reason / notes"]
    assert "measured in 2 sweeps" in one["reason / notes"]
    [two] = [r for r in rows if (r["sweep"], r["N"]) == ("a", "2")]
    assert two["scaling efficiency"] == f"{180 / (2 * 104):.2f}"
    # Its spread over the sweeps: 3 runs in 2 sweeps.
    repeats = markdown.split("## Repeated rows")[1]
    assert re.search(r"\| mlm \| torch_3d · amp N=1 \| 3 \| 2 \|", repeats), repeats


    # --sweep: its id as the index shows it, as recorded, or none; the index still lists every sweep.
    parser = report.build_parser()
    for wanted, runs in (("20261125T090000Z-abcdef", {"s2-a", "s2-b"}), ("sweep-a", {"s1-a", "s1-b", "s1-c"}),
                         ("none", {"solo"})):
        selected, _, everything = report._records(parser, folder, parser.parse_args(["--sweep", wanted]))
        assert {r["run_id"] for r in selected} == runs, wanted
        assert len(everything) == 6


def test_an_unknown_sweep_is_one_line_of_bad_input(tmp_path, capsys):
    folder = _folder(tmp_path / "results")
    with pytest.raises(SystemExit) as exc:
        report.main(["--results", str(folder), "--sweep", "nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no sweep nope" in err and "20261125T090000Z-abcdef" in err
    assert not (folder / "report.md").exists()


@pytest.mark.e2e
def test_a_sweep_records_its_command_and_each_run_its_mode(torch_sweep):
    proc, out = torch_sweep  # conftest.TORCH_SWEEP, shared with test_torch_dp and test_torch_ddp
    records = load_records(out)
    assert {r["sweep_command"] for r in records} == {shlex.join(["python", "-m", "bench.compare", *TORCH_SWEEP,
                                                                 "--out", str(out)])}
    modes = {r["backend"]: r["mode"] for r in records if r["status"] == "ok"}
    assert modes.get("torch_ddp") == "DistributedDataParallel"


# ----------------------------------------------------------------------------- a key, field by field

def _keyed(**fields) -> dict:
    record = {"workload": "mlm", "backend": "torch_3d", "mode": "ddp", "scaling": "weak", "global_batch": 64,
              "per_device_batch": 8, "data": "synthetic", "device_kind": "H100", "host": {"name": "node1"},
              "threads_per_device": 4, "devices": 4,
              "config": {"model_size": "mini", "precision": "bf16", "grad_accum": 2, "compile": "max-autotune"},
              "layout": {"dp": 2, "tp": 2, "micro_batches": 2}}
    return record | fields


def test_a_record_s_key_holds_each_of_its_fields():
    # Weak scaling keys on the per-device batch; micro-batches are --grad-accum 2 x the layout's 2.
    assert config_key(_keyed()) == ConfigKey(
        workload="mlm", backend="torch_3d", mode="ddp", model_size="mini", precision="bf16", scaling="weak", batch=8,
        micro_batches=4, layout=Layout(tp=2, micro_batches=2), compile="max-autotune", data="synthetic",
        device_kind="H100", host="node1", threads_per_device=4)
    assert config_key(_keyed(scaling="strong")).batch == 64
    assert config_key(_keyed(scaling=None)).batch == 8


def test_a_record_without_a_mode_keys_on_its_strategy_without_dp_counts():
    assert config_key(_keyed(mode=None, strategy="dp2 x tp2")).mode == "dp x tp2"
    assert config_key(_keyed(mode=None, strategy="fsdp8 hybrid")).mode == "fsdp hybrid"
    assert config_key(_keyed(mode=None)).mode == ""
    assert config_key(_keyed(mode=None, strategy=None)).mode == ""


def test_the_key_s_layout_drops_the_devices_count_and_options_without_their_dimension():
    def keyed(**layout):
        return config_key(_keyed(layout=layout)).layout
    assert keyed(dp=4, schedule="1f1b", virtual_stages=2) == Layout()  # no pipeline: a schedule means nothing
    assert keyed(pp=2, schedule="1f1b", micro_batches=4) == Layout(pp=2, schedule="1f1b", micro_batches=4)
    assert keyed(tp=2, sp=True) == Layout(tp=2, sp=True) and keyed(sp=True) == Layout()
    # FSDP over every device: 2 stands for any count; HSDP keeps its group size.
    assert keyed(fsdp=4) == keyed(fsdp=8) == Layout(fsdp=2)
    assert keyed(dp=2, fsdp=4) == Layout(fsdp=4)


@pytest.mark.parametrize("layout, label", [
    (Layout(dp=4), "dp"),
    (Layout(fsdp=4), "fsdp"),
    (Layout(dp=2, fsdp=4), "dp x fsdp4"),
    (Layout(tp=2, vocab_split=True), "dp x tp2-vocab"),
    (Layout(tp=2, pp=2, micro_batches=4, schedule="1f1b"), "dp x tp2 x pp2-nmb4-1f1b"),
    (Layout(cp=2), "dp x cp2"),
    (Layout(recompute="full"), "dp-rc"),
])
def test_a_layout_label_is_its_name_without_the_dp_count(layout, label):
    assert layout_label(layout) == label


def test_a_key_field_reads_as_a_table_cell():
    key = config_key(_keyed(config={"compile": ""}, data="", host=None, threads_per_device=None))
    assert describe(key, "batch") == "8 per device"
    assert describe(config_key(_keyed(scaling="strong")), "batch") == "64 global"
    assert describe(config_key(_keyed(per_device_batch=None)), "batch") == "?"
    assert describe(key, "compile") == "eager" and describe(config_key(_keyed()), "compile") == "max-autotune"
    assert [describe(key, f) for f in ("data", "host", "threads_per_device", "model_size")] == ["?", "?", "?", "tiny"]
    assert [describe(config_key(_keyed()), f) for f in ("threads_per_device", "micro_batches", "layout")] == [
        "4", "4", "dp x tp2-nmb2"]


def test_without_blanks_the_named_fields_only():
    key = config_key(_keyed())
    assert key.without("host", "device_kind") == ConfigKey(**{**key.__dict__, "host": None, "device_kind": None})


def test_latest_is_by_start_time_then_run_id_and_a_record_without_either_comes_first():
    assert started({}) == ("", "") and started({"started_at": "2026-11-24", "run_id": "r1"}) == ("2026-11-24", "r1")
    late = _keyed(run_id="b", started_at="2026-11-24T10:00:00")
    early = _keyed(run_id="a", started_at="2026-11-24T10:00:00")
    unstarted = _keyed(run_id="c", started_at=None)
    # Two runs started together: the run id breaks the tie; one with no start time is the earliest.
    assert latest_within_sweep([late, early, unstarted]) == [late]
    assert [r["run_id"] for r in sorted([late, early, unstarted], key=started)] == ["c", "a", "b"]
    assert latest_within_sweep([unstarted, _keyed(started_at="2026")]) == [_keyed(started_at="2026")]


def test_a_failed_one_device_run_is_no_reference_even_with_a_throughput():
    one = _keyed(run_id="r1", devices=1, status="failed", samples_per_s=100.0, layout={}, config={})
    two = _keyed(run_id="r2", devices=2, status="ok", samples_per_s=150.0, layout={"dp": 2}, config={})
    assert reference_throughputs([one, two]) == {}
    assert reference_throughputs([{**one, "status": "ok"}, two]) == {"r1": 100.0, "r2": 100.0}
    assert reference_throughputs([{**one, "status": "ok", "samples_per_s": None}, two]) == {}
