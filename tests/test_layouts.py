"""The harness side of layouts: the names bench.compare/bench.parity --layouts take, the report's layout table
and figure from hand-made records, parity's layout checks on made-up curves, and one real layout sweep."""
from __future__ import annotations

import io
import json
import os
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from bench import parity_checks as pc
from bench.compare import build_parser as compare_parser
from bench.compare import check_layout_options, probed_runs, repeat_order, run_command, sweep_plan
from bench.layouts import parse_layout
from bench.reporting.compose import build_report
from bench.reporting.document import to_markdown
from bench.reporting.layouts import LAYOUT_SWEEP_PREFIX, layout_frame, layout_table
from common.layout import Layout
from common.record import skeleton
from common.results import load_records, validate_record, write_record
from tests.conftest import run_cli, run_in_process

GOOD = [
    # name, (dp, fsdp, tp, pp, micro-batches, schedule, recompute, vocab_split), canonical, bench.run flags
    ("dp2", (2, 1, 1, 1, 1, "gpipe", "none", False), "dp2", []),
    ("tp2", (1, 1, 2, 1, 1, "gpipe", "none", False), "tp2", ["--model-parallel", "2"]),
    ("pp2", (1, 1, 1, 2, 4, "gpipe", "none", False), "pp2-nmb4", ["--pipeline-stages", "2", "--micro-batches", "4"]),
    ("fsdp2", (1, 2, 1, 1, 1, "gpipe", "none", False), "fsdp2", ["--fsdp", "2"]),
    ("dp2xtp2", (2, 1, 2, 1, 1, "gpipe", "none", False), "dp2xtp2", ["--model-parallel", "2"]),
    ("tp2xdp2", (2, 1, 2, 1, 1, "gpipe", "none", False), "dp2xtp2", ["--model-parallel", "2"]),
    ("pp2-nmb4-1f1b", (1, 1, 1, 2, 4, "1f1b", "none", False), "pp2-nmb4-1f1b",
     ["--pipeline-stages", "2", "--micro-batches", "4", "--pipeline-schedule", "1f1b"]),
    ("pp4-gpipe-nmb8", (1, 1, 1, 4, 8, "gpipe", "none", False), "pp4-nmb8",
     ["--pipeline-stages", "4", "--micro-batches", "8"]),
    ("tp2-vocab-rc", (1, 1, 2, 1, 1, "gpipe", "full", True), "tp2-rc-vocab",
     ["--model-parallel", "2", "--recompute", "full", "--vocab-split"]),
    ("fsdp2xtp2xpp2-nmb2", (1, 2, 2, 2, 2, "gpipe", "none", False), "fsdp2xtp2xpp2-nmb2",
     ["--fsdp", "2", "--model-parallel", "2", "--pipeline-stages", "2", "--micro-batches", "2"]),
    ("dp2xfsdp2xtp2-sel-sp", (2, 2, 2, 1, 1, "gpipe", "selective", False), "dp2xfsdp2xtp2-sel-sp",
     ["--fsdp", "2", "--model-parallel", "2", "--recompute", "selective", "--sequence-parallel"]),
    ("tp2xpp2xcp2-vp2-mbs1-zero1-tpo", (1, 1, 2, 2, 1, "interleaved", "none", False), "tp2xpp2xcp2-mbs1-vp2-zero1-tpo",
     ["--model-parallel", "2", "--pipeline-stages", "2", "--context-parallel", "2", "--micro-batch-size", "1",
      "--pipeline-schedule", "interleaved", "--virtual-stages", "2", "--zero1", "--tp-overlap"]),
]
BAD = [
    ("dp1", "dp size must be an integer >= 2"),
    ("tp0", "tp size must be an integer >= 2"),
    ("pp02", "without leading zeros"),
    ("dp2xdp2", "the dp dimension is given twice"),
    ("fsdp2xfsdp4", "the fsdp dimension is given twice"),
    ("dp", "a bare dp takes the devices the others leave: it needs a device count"),
    ("DP2", "'DP2' is not dp<N>"),
    ("dp2+tp2", "'dp2+tp2' is not dp<N>"),
    ("tp2-1f1b", "'1f1b' needs a pipeline"),
    ("dp2-1f1b", "'1f1b' needs a pipeline"),
    ("dp2-vp2", "'vp2' needs a pipeline"),
    ("pp2-nmb0", "nmb must be an integer >= 1"),
    ("pp2-vp1", "vp must be an integer >= 2"),
    ("pp2-mb", "unknown option 'mb'"),
    ("pp2-mb4", "unknown option 'mb4'"),
    ("pp2-nmb4-mbs2", "give the number of micro-batches (nmb<K>) or their size (mbs<B>), not both"),
    ("pp2-1f1b-gpipe", "'gpipe' repeats an option"),
    ("pp2-gpipe-vp2", "vp<V> is interleaved 1F1B; it cannot be combined with gpipe"),
    ("tp2-rc-rc", "'rc' repeats an option"),
    ("tp2-rc-sel", "'sel' repeats an option"),
    ("dp2-vocab", "'vocab' needs tensor parallelism"),
    ("dp2-sp", "'sp' needs tensor parallelism"),
    ("tp2-", "unknown option ''"),
    ("tp2-zero3", "unknown option 'zero3'"),
    ("tp2-fp8", "fp8 is the software's, not the layout's"),
]


@pytest.mark.parametrize("entry,fields,canonical,flags", GOOD)
def test_good_names_parse_to_their_layout_and_flags(entry, fields, canonical, flags):
    layout = parse_layout(entry)
    assert (layout.dp, layout.fsdp, layout.tp, layout.pp, layout.micro_batches, layout.schedule, layout.recompute,
            layout.vocab_split) == fields
    assert layout.devices == fields[0] * fields[1] * fields[2] * fields[3] * layout.cp
    assert layout.name == canonical and parse_layout(canonical) == layout
    assert layout.run_flags() == flags


@pytest.mark.parametrize("entry,reason", BAD)
def test_bad_names_say_why(entry, reason):
    with pytest.raises(ValueError, match=re.escape(reason)):
        parse_layout(entry)


@pytest.mark.parametrize("argv,reason", [
    (["--layouts", "dp2,tp1"], "'tp1': tp size must be an integer >= 2"),
    (["--layouts", "dp2,,tp2"], "empty entry"),
    (["--layouts", "dp2xtp2,tp2xdp2"], "'tp2xdp2' is the same layout as 'dp2xtp2'"),
    (["--layouts", "dp2", "--gpus", "1,2"], "drop --gpus"),
    (["--layouts", "tp2", "--model-parallel", "2"], "drop --model-parallel"),
    (["--layouts", "dp2", "--scaling", "weak"], "drop --scaling weak"),
])
def test_compare_refuses_a_bad_layout_list_with_one_line_and_writes_nothing(tmp_path, argv, reason):
    """bench.compare's main() in this process (bench.parity's refusal below is held as a process)."""
    out = tmp_path / "results"
    code, _, stderr = run_in_process("bench.compare", *argv, "--backends", "torch_ddp", "--out", str(out))
    assert code == 2, stderr
    assert stderr.startswith("bench.compare: error: ") and stderr.count("\n") == 1, stderr
    assert reason in stderr
    assert not out.exists()


def test_a_layout_sweep_runs_each_layout_after_its_one_device_references():
    args = compare_parser().parse_args(["--layouts", "dp2,pp2-nmb4-1f1b,tp2", "--backends", "torch_ddp",
                                        "--workloads", "mlm", "--batch-size", "8"])
    args.scaling = "strong"  # main() sets it for --layouts
    plan = sweep_plan(args)
    assert [(n, lay.name, accum) for _, _, n, lay, accum in plan] == [
        (1, "1 device", 1), (1, "1 device", 4), (2, "dp2", 1), (2, "pp2-nmb4-1f1b", 1), (2, "tp2", 1)]
    cmd = run_command(args, "torch_ddp", "mlm", 2, "rid", "layouts-x", plan[3][3], plan[3][4])
    tail = cmd[cmd.index("--sweep-id") + 2:]
    # The layout's own flags, once each; the sweep's batch is the global batch of every run.
    assert tail[-8:] == ["--grad-accum", "1", "--pipeline-stages", "2", "--micro-batches", "4",
                         "--pipeline-schedule", "1f1b"]
    for flag in ("--model-parallel", "--micro-batches", "--grad-accum", "--pipeline-stages"):
        assert cmd.count(flag) <= 1, flag
    assert cmd[cmd.index("--scaling") + 1] == "strong" and cmd[cmd.index("--batch-size") + 1] == "8"
    ref = run_command(args, "torch_ddp", "mlm", 1, "rid", "layouts-x", plan[1][3], plan[1][4])
    assert ref[ref.index("--grad-accum") + 1] == "4" and "--pipeline-stages" not in ref


def test_every_repeat_probes_the_same_one_device_run_side_by_side():
    """--co-run-probe with --repeats 3: bench.predict pools a run's probes over its own repeats, so each repeat
    probes the same row, the plan's first 1-device one, although the second repeat runs the rows in reverse
    (where the accumulating 1-device run comes first); one row per backend and workload."""
    args = compare_parser().parse_args(["--layouts", "dp2,pp2-nmb4", "--backends", "torch_3d,torch_ddp",
                                        "--workloads", "mlm", "--batch-size", "8"])
    args.scaling = "strong"
    plan = sweep_plan(args)
    order = repeat_order(len(plan), 3)
    assert [(b, n, accum) for _, b, n, _, accum in plan[:4]] == [
        ("torch_3d", 1, 1), ("torch_3d", 1, 4), ("torch_3d", 2, 1), ("torch_3d", 2, 1)]
    assert order[len(plan)] == (1, len(plan) - 1)  # the second repeat starts from the last row
    assert probed_runs(plan, order) == {(repeat, row) for repeat in range(3) for row in (0, 4)}


# ----------------------------------------------------------------------------- report

SWEEP = f"{LAYOUT_SWEEP_PREFIX}20261123T070000Z-abcdef"
MIB = 2**20


@pytest.mark.parametrize("registered", ["torch_3d", "keras_jax", None])
def test_layouts_run_the_backend_the_registry_says_runs_every_layout(monkeypatch, registered):
    """bench.compare and bench.parity ask the registry which backend --layouts runs without --backends."""
    import backends
    from bench import parity

    monkeypatch.setitem(backends.__dict__, "BACKENDS", {name: replace(entry, every_layout=name == registered)
                                                        for name, entry in backends.BACKENDS.items()})
    compare_args = compare_parser().parse_args(["--layouts", "dp2,tp2"])
    parity_args = parity.build_parser().parse_args(["--layouts", "dp2,tp2"])
    if registered is None:  # none runs every layout: bad input, one line, not a silent torch_3d
        with pytest.raises(SystemExit):
            check_layout_options(compare_parser(), compare_args)
        with pytest.raises(SystemExit):
            parity.default_backends(parity.build_parser(), parity_args)
        return
    check_layout_options(compare_parser(), compare_args)
    assert compare_args.backends == [registered]
    assert parity.default_backends(parity.build_parser(), parity_args) == [registered]
    data_parallel = parity.default_backends(parity.build_parser(), parity.build_parser().parse_args([]))
    assert registered not in data_parallel and len(data_parallel) == len(backends.BACKENDS) - 1


def _comm(all_reduce: int, send_recv: int) -> dict:
    return {"all_reduce": {"bytes": all_reduce, "calls": 1, "time_s": 0.01},
            "reduce_scatter": {"bytes": 0, "calls": 0, "time_s": None},
            "all_gather": {"bytes": 0, "calls": 0, "time_s": None},
            "send_recv": {"bytes": send_recv, "calls": 8, "time_s": None}}


def _record(index: int, layout: Layout, grad_accum: int, sps: float | None, status: str = "ok",
            peaks: list[int] | None = None, metrics: dict | None = None, error: str | None = None) -> dict:
    n = layout.devices
    lay = {k: getattr(layout, k) for k in Layout.__dataclass_fields__}
    lay["per_rank"] = [{"rank": r, "dp": 0, "tp": 0, "pp": r, "holds": "?"} for r in range(n)]
    record = skeleton(f"20261123T07{index:02d}00Z-torch_3d-mlm-n{n}-{index:06x}", "torch_3d", "mlm", n,
                      f"2026-11-23T07:{index:02d}:00+00:00", sweep_id=SWEEP, data="real", scaling="strong",
                      strategy="DeviceMesh layout", framework="torch", framework_version="2.13.0",
                      device_kind="cpu", virtual=True, threads_per_device=1, layout=lay,
                      config={"grad_accum": grad_accum}, global_batch=8)
    if status != "ok":
        record.update(status=status, error=error, duration_s=1.0)
    else:
        step = 8 / sps
        record.update(status="ok", measured_steps=2, per_device_batch=8 // layout.dp, samples_per_s=sps,
                      tokens_per_s=sps * 128, step_time_s=dict.fromkeys(("mean", "p50", "p90", "min", "max"), step)
                      | {"std": 0.0}, data_wait_fraction=0.01, params=4_578_573, flops_per_sample=10**9,
                      achieved_flops=sps * 10**9, peak_memory_bytes=max(peaks), peak_memory_per_rank=peaks,
                      memory={"process_peak_per_rank": peaks, "training_per_rank": [p // 4 for p in peaks],
                              "method": "growth of VmHWM", "processes_share": False},
                      mfu_achievable=sps * 10**9 / (n * 4e10),
                      loss={"first": 10.5, "last": 10.4, "curve": [[0, 10.5], [1, 10.45], [2, 10.4]]},
                      backend_metrics=metrics, duration_s=20.0)
    assert validate_record(record) == [], record["run_id"]
    return record


def layout_records() -> list[dict]:
    state = {"params": 18 * MIB, "grads": 18 * MIB, "optimizer": 36 * MIB}
    half = {k: v // 2 for k, v in state.items()}
    return [
        _record(0, Layout(), 1, 40.0, peaks=[300 * MIB], metrics={"state_bytes_per_rank": [state]}),
        _record(1, Layout(), 4, 32.0, peaks=[280 * MIB], metrics={"state_bytes_per_rank": [state]}),
        _record(2, parse_layout("dp2"), 1, 60.0, peaks=[310 * MIB, 312 * MIB],
                metrics={"state_bytes_per_rank": [state, state], "comm_per_step": [_comm(18 * MIB, 0)] * 2}),
        _record(3, parse_layout("pp2-nmb4-1f1b"), 1, 48.0, peaks=[200 * MIB, 180 * MIB],
                metrics={"state_bytes_per_rank": [half, half],
                         "bubble": {"analytic": 0.2, "measured_per_stage": [0.25, 0.3]},
                         "comm_per_step": [_comm(0, 3 * MIB), _comm(0, 3 * MIB)]}),
        _record(4, parse_layout("tp2-vocab"), 1, None, status="unsupported",
                error="--vocab-split: torch_3d does not split the embedding's vocabulary yet"),
        _record(5, parse_layout("dp2xtp2"), 1, None, status="failed", error="worker rank 3 exited with signal 9"),
    ]


def test_layout_table_holds_each_layout_with_its_reference_and_reason():
    records = layout_records()
    frame = layout_frame(records)
    columns, rows = layout_table(frame, {r["run_id"]: r for r in records}, "mlm")
    table = {row[0]: dict(zip(columns, row)) for row in rows}
    assert set(table) == {"1 device", "1 device, 4 micro-batches", "dp2", "pp2-nmb4-1f1b",
                          "tp2-vocab", "dp2xtp2"}
    # Efficiency against the 1-device run of the same global batch AND micro-batches.
    assert table["dp2"]["efficiency vs 1 device"] == f"{60 / (2 * 40):.2f}"
    assert table["pp2-nmb4-1f1b"]["efficiency vs 1 device"] == f"{48 / (2 * 32):.2f}"
    assert table["1 device, 4 micro-batches"]["efficiency vs 1 device"] == "1.00"
    assert table["dp2"]["samples/s"] == "60.0"
    assert {name: row["N"] for name, row in table.items()} == {
        "1 device": "1", "1 device, 4 micro-batches": "1", "dp2": "2", "pp2-nmb4-1f1b": "2", "tp2-vocab": "2",
        "dp2xtp2": "4"}
    assert table["dp2"]["peak memory max (MiB)"] == "312.0"
    assert table["pp2-nmb4-1f1b"]["peak memory per rank (MiB)"] == "200.0, 180.0"
    assert table["pp2-nmb4-1f1b"]["training memory per rank (MiB)"] == "50.0, 45.0"
    assert table["dp2"]["MFU (measured peak)"] == f"{60e9 / (2 * 4e10):.1%}"
    assert table["pp2-nmb4-1f1b"]["params+grads+optimizer per rank (MiB)"] == "9.0+9.0+18.0, 9.0+9.0+18.0"
    assert table["pp2-nmb4-1f1b"]["bubble analytic"] == "20.0%"
    assert table["pp2-nmb4-1f1b"]["bubble measured per stage"] == "25.0%, 30.0%"
    assert table["pp2-nmb4-1f1b"]["communication per step per rank (MiB)"] == "send_recv 3, 3"
    assert table["dp2"]["communication per step per rank (MiB)"] == "all_reduce 18, 18"
    assert table["dp2"]["bubble analytic"] == ""
    assert table["tp2-vocab"]["status"] == "unsupported" and "vocabulary yet" in table["tp2-vocab"]["reason / notes"]
    assert table["dp2xtp2"]["status"] == "failed" and table["dp2xtp2"]["reason / notes"].endswith("signal 9")
    assert table["dp2xtp2"]["samples/s"] == "" and table["dp2xtp2"]["efficiency vs 1 device"] == ""


def test_a_run_is_a_layout_run_in_a_layout_sweep_or_where_its_layout_splits_the_model():
    from bench.reporting.layouts import in_layout_table

    records = layout_records()
    dp2, pp2 = records[2]["layout"], records[3]["layout"]
    assert [in_layout_table({"sweep_id": "sweep-x", "layout": layout}) for layout in (None, {}, dp2, pp2)] == [
        False, False, False, True]
    assert [in_layout_table({"sweep_id": sweep, "layout": None}) for sweep in (None, SWEEP, "x-layouts-")] == [
        False, True, False]


def test_layout_frame_holds_each_layout_run_beside_its_reference_sorted_for_the_table():
    records = layout_records()
    plain = {**records[2], "run_id": "20261123T0800Z-plain-dp2", "sweep_id": "sweep-plain",
             "layout": {**records[2]["layout"]}}                  # plain data parallel, outside a layout sweep
    alone = {**records[3], "run_id": "20261123T0900Z-alone-pp2", "sweep_id": None, "host": None,
             "started_at": None, "data": None, "device_kind": None}      # splits the model: a layout run anyway
    frame = layout_frame([alone, plain, *records])
    assert list(frame.columns) == ["run_id", "layout", "sweep_id", "host", "backend", "workload", "data", "devices",
                                   "device_kind", "global_batch", "accumulation", "status", "samples_per_s",
                                   "started_at", "reference_samples_per_s", "efficiency"]
    rows = frame.drop(columns=["run_id"]).to_dict("records")
    # The sweep without an id first; in a sweep by devices, then layout.
    assert [(r["sweep_id"], r["layout"], r["devices"]) for r in rows] == [
        ("", "pp2-nmb4-1f1b", 2), (SWEEP, "1 device", 1), (SWEEP, "1 device, 4 micro-batches", 1),
        (SWEEP, "dp2", 2), (SWEEP, "pp2-nmb4-1f1b", 2), (SWEEP, "tp2-vocab", 2), (SWEEP, "dp2xtp2", 4)]
    assert list(frame.run_id)[0] == alone["run_id"] and plain["run_id"] not in set(frame.run_id)
    first, *_, dp2, pp2, _, failed = rows
    assert [pd.isna(first[k]) for k in ("host", "data", "device_kind")] == [True] * 3 and first["started_at"] == ""
    assert pd.isna(first["reference_samples_per_s"]) and pd.isna(first["efficiency"])    # no 1-device run: its sweep
    host = records[0]["host"]["name"]
    assert dp2 == {"layout": "dp2", "sweep_id": SWEEP, "host": host, "backend": "torch_3d", "workload": "mlm",
                   "data": "real", "devices": 2, "device_kind": "cpu", "global_batch": 8, "accumulation": 1,
                   "status": "ok", "samples_per_s": 60.0, "started_at": "2026-11-23T07:02:00+00:00",
                   "reference_samples_per_s": 40.0, "efficiency": 0.75}
    assert (pp2["accumulation"], pp2["reference_samples_per_s"], pp2["efficiency"]) == (4, 32.0, 0.75)
    assert failed["status"] == "failed" and pd.isna(failed["samples_per_s"])
    # Several backends at one layout: side by side, in backend order.
    other = [{**r, "run_id": r["run_id"] + "-jax", "backend": "keras_jax"} for r in records]
    both = layout_frame(other + records)
    assert list(zip(both.layout, both.backend))[:4] == [("1 device", "keras_jax"), ("1 device", "torch_3d"),
                                                        ("1 device, 4 micro-batches", "keras_jax"),
                                                        ("1 device, 4 micro-batches", "torch_3d")]


def test_layout_table_cells_for_what_a_record_leaves_out_or_adds():
    records = layout_records()
    state = {"params": 2 * MIB, "grads": 2 * MIB, "optimizer": 4 * MIB}
    odd = {**records[2], "run_id": "20261123T0710Z-odd", "sweep_id": f"{LAYOUT_SWEEP_PREFIX}other",
           "oversubscribed": True, "mfu_achievable": None, "peak_memory_per_rank": None,
           "peak_memory_bytes": 5 * MIB,
           "memory": {"process_peak_per_rank": [5 * MIB, 5 * MIB], "training_per_rank": [MIB, None],
                      "method": "growth of VmHWM", "processes_share": True},
           "backend_metrics": {"state_bytes_per_rank": [state, state], "compile_s": 12.345,
                               "comm_per_step": [_comm(0, 0) | {"broadcast": {"bytes": MIB, "calls": 1,
                                                                              "time_s": None}},
                                                 _comm(0, 0)]}}
    quiet = {**records[2], "run_id": "20261123T0711Z-quiet", "sweep_id": f"{LAYOUT_SWEEP_PREFIX}quiet",
             "backend_metrics": {"comm_per_step": [_comm(0, 0), _comm(0, 0)]}, "memory": None}
    failed = {**records[5], "error": None}
    by_id = {r["run_id"]: r for r in (odd, quiet, failed)}
    columns, rows = layout_table(layout_frame([odd, quiet, failed]), by_id, "mlm")
    table = {row[-1] if row[3] == "ok" else "failed": dict(zip(columns, row)) for row in rows}
    assert set(table) == {"failed", "oversubscribed: devices x threads > cores; no 1-device run of this "
                          "configuration (the same global batch and micro-batches) in its sweep",
                          "no 1-device run of this configuration (the same global batch and micro-batches) in "
                          "its sweep"}
    [odd_row] = [row for key, row in table.items() if key.startswith("oversubscribed")]
    assert odd_row["MFU (measured peak)"] == "" and odd_row["compile (s)"] == "12.3"
    assert (odd_row["peak memory max (MiB)"], odd_row["peak memory per rank (MiB)"]) == ("5.0", "5.0")
    assert odd_row["training memory per rank (MiB)"] == "1.0, ? (per process)"
    assert odd_row["params+grads+optimizer per rank (MiB)"] == "2.0+2.0+4.0, 2.0+2.0+4.0"
    # Kinds that moved no bytes are left out; one the list does not know comes last, its bytes on each rank.
    assert odd_row["communication per step per rank (MiB)"] == "broadcast 1, 0"
    [quiet_row] = [row for key, row in table.items() if key.startswith("no 1-device")]
    assert quiet_row["communication per step per rank (MiB)"] == "none"
    assert quiet_row["training memory per rank (MiB)"] == "" and quiet_row["compile (s)"] == ""
    assert table["failed"]["reason / notes"] == "" and table["failed"]["peak memory max (MiB)"] == ""
    assert table["failed"]["communication per step per rank (MiB)"] == ""


def test_report_draws_the_layout_figure_from_the_records(tmp_path):
    records = layout_records()
    for r in records:
        write_record(r, tmp_path)
    blocks, plots = build_report(load_records(tmp_path), str(tmp_path))
    markdown = to_markdown(blocks)
    assert "### Layouts of `mlm`" in markdown and "![mlm: layouts](plots/mlm-layouts.png)" in markdown
    [plot] = [p for p in plots["mlm"] if p.slug == "mlm-layouts"]
    ok = {"1 device": 40.0, "1 device, 4 micro-batches": 32.0, "dp2": 60.0, "pp2-nmb4-1f1b": 48.0}
    assert dict(plot.data["samples/s"]) == ok
    assert dict(plot.data["ideal samples/s"]) == {"1 device": 40.0, "1 device, 4 micro-batches": 32.0,
                                                  "dp2": 80.0, "pp2-nmb4-1f1b": 64.0}
    assert dict(plot.data["peak memory max (MiB)"]) == {"1 device": 300.0, "1 device, 4 micro-batches":
                                                        280.0, "dp2": 312.0, "pp2-nmb4-1f1b": 200.0}
    assert dict(plot.data["peak memory per rank (MiB)"])["pp2-nmb4-1f1b"] == [200.0, 180.0]
    assert dict(plot.data["params+grads+optimizer max (MiB)"])["pp2-nmb4-1f1b"] == 36.0
    speed, memory = plot.figure.axes[:2]
    assert [p.get_height() for p in speed.patches] == list(ok.values())
    assert [t.get_text() for t in speed.get_xticklabels()] == list(ok)
    assert plot.png()[:8] == b"\x89PNG\r\n\x1a\n"
    # Layout runs are not points of the device-count figures: several layouts share one N.
    assert [p.slug for p in plots["mlm"]] == ["mlm-layouts"]
    # The run table above gives the layout runs the same efficiency as the layout table.
    runs_table = markdown.split("## Workload `mlm`")[1].split("### Layouts")[0]
    header, _, *rows = [[c.strip() for c in line.split("|")[1:-1]] for line in runs_table.splitlines()
                        if line.startswith("|")]
    column = header.index("scaling efficiency")
    assert sorted(row[column] for row in rows) == ["", "", "0.75", "0.75", "1.00", "1.00"]
    assert "nothing to plot against devices" in markdown



def _figure_row(run_id: str, layout: str, devices: int, sps: float | None, reference: float, started: str,
                status: str = "ok", workload: str = "mlm", backend: str = "torch_3d", host: str | None = "h",
                global_batch: int = 8) -> dict:
    """One row of layout_frame, as layout_plot reads it."""
    return {"run_id": run_id, "layout": layout, "workload": workload, "status": status, "samples_per_s": sps,
            "devices": devices, "backend": backend, "host": host, "global_batch": global_batch,
            "started_at": started, "reference_samples_per_s": reference}


def _state(*mib_per_part) -> dict:
    return dict(zip(("params", "grads", "optimizer"), (v * MIB for v in mib_per_part)))


NAN = float("nan")
# Out of order on purpose: the figure sorts by devices then layout; the second dp2 run (07:03) replaces the first.
FIGURE_ROWS = [
    _figure_row("pp", "pp2", 2, 48.0, NAN, "07:04"),                     # no 1-device run: no ideal tick
    _figure_row("dp-old", "dp2", 2, 50.0, 40.0, "07:01"),
    _figure_row("one", "1 device", 1, 40.0, 40.0, "07:00"),
    _figure_row("tp", "tp2", 2, 30.0, 40.0, "07:05"),
    _figure_row("dp", "dp2", 2, 60.0, 40.0, "07:03"),
    _figure_row("failed", "fsdp2", 2, None, 40.0, "07:06", status="failed"),
    _figure_row("nan", "dp2xtp2", 4, None, 40.0, "07:07"),              # ok but measured nothing: no bar
    _figure_row("cnn", "dp2", 2, 500.0, 400.0, "07:08", workload="cnn"),
]
FIGURE_RECORDS = {
    "one": {"peak_memory_per_rank": [300 * MIB], "backend_metrics": {"state_bytes_per_rank": [_state(18, 18, 36)]}},
    "dp-old": {"peak_memory_per_rank": [1 * MIB, 1 * MIB]},
    "dp": {"peak_memory_per_rank": [310 * MIB, 312 * MIB], "peak_memory_bytes": 999 * MIB,
           "backend_metrics": {"state_bytes_per_rank": [_state(9, 9, 18), _state(18, 18, 36)]}},
    "pp": {"peak_memory_bytes": 200 * MIB},       # one number only: the process's
    "tp": {"peak_memory_per_rank": None, "peak_memory_bytes": None, "backend_metrics": {}},
}


def test_the_layout_figure_draws_the_latest_ok_run_of_each_layout():
    """layout_plot from hand-made rows, read back from matplotlib: samples/s bars with N x the 1-device run as a
    tick, then per layout the most loaded device's peak (a bar, each rank a dot) beside its state (a bar)."""
    import matplotlib
    from cycler import cycler
    from matplotlib.colors import to_rgba
    from matplotlib.markers import MarkerStyle

    from bench.reporting.layout_plot import layout_plot
    from tests.test_predict import matplotlib_small
    # under a matplotlibrc of its own colours (here: red first), the figure keeps its own
    with matplotlib.rc_context({"axes.prop_cycle": cycler(color=["#d62728", "#2ca02c"])}):
        plot = layout_plot("mlm", pd.DataFrame(FIGURE_ROWS), FIGURE_RECORDS, "the caption")
    assert (plot.slug, plot.title, plot.caption) == ("mlm-layouts", "mlm: layouts", "the caption")
    labels = ["1 device", "dp2", "pp2", "tp2"]
    assert plot.data == {
        "samples/s": [("1 device", 40.0), ("dp2", 60.0), ("pp2", 48.0), ("tp2", 30.0)],
        "ideal samples/s": [("1 device", 40.0), ("dp2", 80.0), ("tp2", 80.0)],
        "peak memory max (MiB)": [("1 device", 300.0), ("dp2", 312.0), ("pp2", 200.0), ("tp2", 0.0)],
        "peak memory per rank (MiB)": [("1 device", [300.0]), ("dp2", [310.0, 312.0]), ("pp2", [200.0]),
                                       ("tp2", [])],
        "params+grads+optimizer max (MiB)": [("1 device", 72.0), ("dp2", 72.0)]}
    fig = plot.figure
    assert tuple(fig.get_size_inches()) == (8.0, 5.2) and type(fig.get_layout_engine()).__name__ == \
        "ConstrainedLayoutEngine"
    assert fig.get_suptitle() == "mlm: throughput and memory per device by layout"
    speed, memory = fig.axes
    assert [ax.get_subplotspec().get_geometry() for ax in (speed, memory)] == [(1, 2, 0, 0), (1, 2, 1, 1)]
    blue, orange = to_rgba("#1f77b4"), to_rgba("#ff7f0e")

    bars = speed.patches
    assert [(b.get_x() + b.get_width() / 2, b.get_height()) for b in bars] == [(0, 40), (1, 60), (2, 48), (3, 30)]
    assert all(b.get_facecolor() == blue for b in bars)
    assert [c.get_label() for c in speed.containers] == ["samples/s, all devices"]
    [ideal] = speed.collections
    assert [tuple(p) for p in ideal.get_offsets()] == [(0, 40), (1, 80), (3, 80)]
    assert list(ideal.get_sizes()) == [900] and ideal.get_zorder() == 3 and ideal.get_label() == "N x 1-device run"
    assert tuple(ideal.get_facecolors()[0]) == to_rgba("grey")
    tick = MarkerStyle("_")      # a flat tick, as wide as a bar
    assert ideal.get_paths()[0].vertices.tolist() == tick.get_path().transformed(tick.get_transform()).vertices.tolist()
    assert speed.get_ylabel() == "samples/s, all devices"
    assert speed.yaxis.get_major_formatter()(12345.6, 0) == "12,346"

    peak_bars, state_bars = memory.patches[:4], memory.patches[4:]
    # Side by side: the peak left of each tick, the state right of it.
    assert [(b.get_x(), b.get_width(), b.get_height()) for b in peak_bars] == [
        (pytest.approx(i - 0.4), pytest.approx(0.4), h) for i, h in enumerate([300, 312, 200, 0])]
    assert [(b.get_x(), b.get_width(), b.get_height()) for b in state_bars] == [
        (pytest.approx(0, abs=1e-12), pytest.approx(0.4), 72), (pytest.approx(1), pytest.approx(0.4), 72)]
    assert all(b.get_facecolor() == blue for b in peak_bars) and all(b.get_facecolor() == orange for b in state_bars)
    assert [c.get_label() for c in memory.containers] == ["peak, most loaded device",
                                                          "params + grads + optimizer, most loaded rank"]
    dots = memory.collections
    assert [[tuple(p) for p in d.get_offsets()] for d in dots] == [
        [(-0.2, 300)], [(0.8, 310), (0.8, 312)], [(1.8, 200)], []]
    # One legend entry for the dots ("_child..": matplotlib's name for an artist left out of the legend).
    assert [d.get_label() for d in dots] == ["peak, each rank", "_child5", "_child6", "_child7"]
    assert all(list(d.get_sizes()) == [10] and d.get_zorder() == 3 for d in dots)
    assert all(tuple(d.get_facecolors()[0]) == to_rgba("black") for d in dots[:3])
    assert memory.get_ylabel() == "MiB per device"

    for ax in (speed, memory):
        ticks = ax.get_xticklabels()
        assert list(ax.get_xticks()) == [0, 1, 2, 3] and [t.get_text() for t in ticks] == labels
        assert all(t.get_rotation() == 30 and t.get_ha() == "right" for t in ticks)
        assert all(t.get_fontsize() == pytest.approx(matplotlib_small()) for t in ticks)
        assert ax.get_ylim()[0] == 0
        assert all(line.get_visible() and line.get_alpha() == 0.3 for line in ax.get_ygridlines())
        assert not any(line.get_visible() for line in ax.get_xgridlines())
    [legend] = fig.legends
    # Each panel's entries in matplotlib's order (collections before bars), the speed panel's first.
    assert [t.get_text() for t in legend.get_texts()] == [
        "N x 1-device run", "samples/s, all devices", "peak, each rank", "peak, most loaded device",
        "params + grads + optimizer, most loaded rank"]
    assert legend._ncols == 3 and legend._outside_loc == "lower" and legend._loc == 8  # below, centred
    assert all(t.get_fontsize() == pytest.approx(matplotlib_small()) for t in legend.get_texts())
    # each entry is the artist of its label: the grey dashes, the blue bars, the black dots, the orange bars
    keys = legend.legend_handles
    assert [tuple(keys[i].get_facecolors()[0]) for i in (0, 2)] == [to_rgba("grey"), to_rgba("black")]
    assert [k.get_facecolor() for k in (keys[1], keys[3], keys[4])] == [blue, blue, orange]


def test_the_layout_figure_names_what_tells_two_bars_apart_and_grows_with_them():
    from bench.reporting.layout_plot import layout_plot

    rows = [_figure_row("a", "dp2", 2, 60.0, NAN, "07:00"),
            _figure_row("b", "dp2", 2, 50.0, NAN, "07:01", backend="keras_jax"),
            _figure_row("c", "dp2", 2, 40.0, NAN, "07:02", host=None),
            _figure_row("d", "dp2", 2, 30.0, NAN, "07:03", global_batch=16)]
    records = {i: {"peak_memory_per_rank": [MIB]} for i in "abcd"}
    plot = layout_plot("mlm", pd.DataFrame(rows), records, "c")
    first, second, hostless, bigger = [label for label, _ in plot.data["samples/s"]]
    assert (first, second, bigger) == (
        "dp2 · torch_3d · h · batch 8", "dp2 · keras_jax · h · batch 8", "dp2 · torch_3d · h · batch 16")
    # A run without a host is told apart too, and says so (the frame holds no host as a missing value, not "nan").
    assert hostless == "dp2 · torch_3d · host unknown · batch 8"
    assert "ideal samples/s" not in plot.data and plot.data["params+grads+optimizer max (MiB)"] == []
    assert [c.get_label() for c in plot.figure.axes[0].collections] == []        # no tick without a reference
    assert tuple(plot.figure.get_size_inches()) == (8.0, 5.2)
    # Two runs of one host and backend: only the layout names a bar; past five bars the figure widens, to 16 in.
    six = [_figure_row(f"r{i}", f"pp{i}", 2, 10.0 * i, NAN, f"07:0{i}") for i in range(6)]
    plot = layout_plot("mlm", pd.DataFrame(six), {f"r{i}": {} for i in range(6)}, "c")
    assert [label for label, _ in plot.data["samples/s"]] == [f"pp{i}" for i in range(6)]
    assert tuple(plot.figure.get_size_inches()) == (pytest.approx(9.6), 5.2)
    assert plot.figure.axes[1].get_ylim()[0] == 0      # no memory measured: still from zero, not below
    # Runs of one bar started in the same second: of the latest second's, the one the frame lists last.
    same_second = [_figure_row(f"r{i:02d}", "dp2", 2, float(i), NAN, "07:00" if i % 2 else "07:01")
                   for i in range(40)]
    plot = layout_plot("mlm", pd.DataFrame(same_second), {f"r{i:02d}": {} for i in range(40)}, "c")
    assert plot.data["samples/s"] == [("dp2", 38.0)]
    eleven = [_figure_row(f"r{i}", f"pp{i:02d}", 2, 10.0, NAN, "07:00") for i in range(11)]
    plot = layout_plot("mlm", pd.DataFrame(eleven), {f"r{i}": {} for i in range(11)}, "c")
    assert tuple(plot.figure.get_size_inches()) == (16, 5.2)



LAYOUT_INTRO = (
    "Each layout trains the same global batch; efficiency is samples/s / (N x samples/s of the 1-device run of the "
    "same global batch and micro-batches). Memory per rank is each process's measured peak; params+grads+optimizer "
    "is counted from the shards each rank holds. The analytic bubble is (stages - 1) / (micro-batches + stages - 1), "
    "the measured one each stage's idle share of a step. Communication is bytes per step per rank of the collectives "
    "issued, by kind.")


def test_the_layout_section_is_its_table_and_a_figure_of_the_ok_runs():
    from bench.reporting.compose import layout_section
    from bench.reporting.document import Heading, Image, Table, Text

    records = layout_records()
    for r in records:
        r["host"] = {**r["host"], "name": "a-host"}
    records[2]["host"] = {**records[2]["host"], "name": "b-host"}
    records[3]["framework_version"] = "2.14.0"
    records[5]["host"] = {**records[5]["host"], "name": "failed-host"}     # a failed run: not in the figure
    by_id = {r["run_id"]: r for r in records}
    frame = layout_frame(records)
    blocks, plots = layout_section("mlm", frame, by_id)
    assert blocks[:3] == [Heading("Layouts of `mlm`", 3), Text(LAYOUT_INTRO),
                          Table(*layout_table(frame, by_id, "mlm"))]
    [image] = blocks[3:]
    caption = "Machines: a-host, b-host. Global batch: 8. Frameworks: torch 2.13.0, torch 2.14.0."
    assert (image.path, image.title, image.caption) == ("plots/mlm-layouts.png", "mlm: layouts", caption)
    assert isinstance(image, Image) and image.png[:8] == b"\x89PNG\r\n\x1a\n"
    [plot] = plots
    assert (plot.slug, plot.caption) == ("mlm-layouts", caption)
    assert [label for label, _ in plot.data["samples/s"]] == [  # two hosts: each bar names its own
        "1 device · a-host", "1 device, 4 micro-batches · a-host", "dp2 · b-host", "pp2-nmb4-1f1b · a-host"]
    # No layout run of the workload: no section; no ok run: the table alone.
    assert layout_section("cnn", frame, by_id) == ([], [])
    failed = [r for r in records if r["status"] != "ok"]
    blocks, plots = layout_section("mlm", layout_frame(failed), by_id)
    assert [type(b).__name__ for b in blocks] == ["Heading", "Text", "Table"] and plots == []
    assert [row[0] for row in blocks[2].rows] == ["tp2-vocab", "dp2xtp2"]


def test_a_workload_whose_runs_are_all_layouts_has_its_table_and_no_device_figures():
    from bench.reporting.compose import workload_section
    from bench.reporting.document import Heading, Table, Text
    from bench.reporting.tables import workload_table
    from common.results import summary_frame

    records = layout_records()
    by_id = {r["run_id"]: r for r in records}
    frame = summary_frame(records)
    above, columns, rows = workload_table(frame, by_id, "mlm")
    assert above.startswith("Same in every row: ")
    assert workload_section("mlm", frame, by_id, []) == ([
        Heading("Workload `mlm`", 2), Text(above), Table(columns, rows),
        Text("No ok run with measured steps (outside layout sweeps): nothing to plot against devices.")], [])


def test_a_workload_table_with_nothing_shared_by_its_rows_has_no_sentence_above_it(monkeypatch):
    from bench.reporting import compose
    from bench.reporting.document import Heading, Table, Text
    monkeypatch.setattr(compose, "workload_table", lambda frame, by_id, workload: ("", ["backend"], [["a"], ["b"]]))
    assert compose.workload_section("mlm", pd.DataFrame(), {}, [])[0] == [
        Heading("Workload `mlm`", 2), Table(["backend"], [["a"], ["b"]]),
        Text("No ok run with measured steps (outside layout sweeps): nothing to plot against devices.")]


def test_absent_backends_are_those_of_the_workload_with_no_ok_run_and_no_line():
    from types import SimpleNamespace

    from bench.reporting.compose import absent_backends

    frame = pd.DataFrame([("cnn", "torch_ddp", "ok"), ("cnn", "tf_mirrored", "failed"),
                          ("cnn", "tf_mirrored", "unsupported"), ("cnn", "tf_mirrored", "failed"),
                          ("cnn", "torch_3d", "ok"), ("cnn", "torch_3d", "failed"),     # drawn in the layout figure
                          ("cnn", "mindspore_auto", "invalid"), ("mlm", "keras_jax", "failed")],
                         columns=["workload", "backend", "status"])
    drawn = [SimpleNamespace(key=SimpleNamespace(backend="torch_ddp"))]
    assert absent_backends(frame, "cnn", drawn) == ["mindspore_auto (1 invalid)",
                                                    "tf_mirrored (2 failed, 1 unsupported)"]
    assert absent_backends(frame, "mlm", drawn) == ["keras_jax (1 failed)"]
    assert absent_backends(frame, "cnn", drawn + [SimpleNamespace(key=SimpleNamespace(backend="tf_mirrored")),
                                                  SimpleNamespace(key=SimpleNamespace(backend="mindspore_auto"))]) == []


# ----------------------------------------------------------------------------- parity

def _run(curve: list[float], status: str = "ok", error: str | None = None, final: dict | None = None) -> dict:
    record = {"status": status, "error": error, "loss": {"curve": [[s, v] for s, v in enumerate(curve)]}}
    return record | ({"backend_metrics": {pc.FINAL_PARAMS: final}} if final else {})


ONE = [10.5, 10.4, 10.2, 10.0]
FINAL = {"encoder.0.query.weight": {"norm": 12.5, "sum": -0.25, "size": 16384},
         "embeddings.word.weight": {"norm": 80.0, "sum": 3.0, "size": 3_906_816},
         "encoder.0.key.bias": {"norm": 3e-6, "sum": 1e-7, "size": 128}}


def _by_name(checks: list[pc.Check]) -> dict[str, pc.Check]:
    return {c.name.split(": ", 1)[1]: c for c in checks}


def test_parity_passes_a_layout_that_changes_nothing_but_rounding():
    near = [v * (1 + 3e-7) for v in ONE]
    final = {k: {**v, "norm": v["norm"] * (1 + 1e-6), "sum": v["sum"] * (1 - 2e-6)} for k, v in FINAL.items()}
    # Rounding alone: a near-cancelling sum moves by 1e-3 of itself, a bias only rounding moves by half its norm.
    final["encoder.0.query.weight"]["sum"] *= 1 + 1e-3
    final["encoder.0.key.bias"] = {"norm": 4.5e-6, "sum": -1e-7, "size": 128}
    checks = _by_name(pc.layout_checks("mlm", "torch_3d tp2", _run(ONE, final=FINAL), _run(near, final=final)))
    assert [c.status for c in checks.values()] == ["pass", "pass", "pass"]
    assert "relative difference 3.0e-07" in checks["loss at step 0 = 1 device"].detail
    assert "1 weight(s) that only rounding moves not compared" in checks["final parameters = 1 device"].detail


def test_parity_fails_a_layout_whose_curve_or_parameters_drift():
    drift = ONE[:2] + [ONE[2] * (1 + 1e-3), ONE[3]]
    checks = _by_name(pc.layout_checks("mlm", "torch_3d pp2-nmb4", _run(ONE), _run(drift)))
    assert checks["loss at step 0 = 1 device"].status == "pass"
    assert checks["loss over 4 steps = 1 device"].status == "fail"
    assert "at step 2" in checks["loss over 4 steps = 1 device"].detail
    # Without final parameters in the records the check says what is missing, and counts as neither.
    assert checks["final parameters = 1 device"].status == "skip"
    assert pc.FINAL_PARAMS in checks["final parameters = 1 device"].detail
    off = {**FINAL, "encoder.0.query.weight": {"norm": 12.5 * 1.01, "sum": -0.25, "size": 16384}}
    checks = _by_name(pc.layout_checks("mlm", "torch_3d dp2", _run(ONE, final=FINAL), _run(ONE, final=off)))
    assert checks["final parameters = 1 device"].status == "fail"
    assert "encoder.0.query.weight" in checks["final parameters = 1 device"].detail
    # A shard's worth of elements shifted by 1e-3 each moves the sum, not (measurably) the norm: still caught.
    shifted = {**FINAL, "embeddings.word.weight": {"norm": 80.0, "sum": 3.0 + 1e-3 * 3_906_816 / 2,
                                                   "size": 3_906_816}}
    checks = _by_name(pc.layout_checks("mlm", "torch_3d tp2", _run(ONE, final=FINAL), _run(ONE, final=shifted)))
    assert checks["final parameters = 1 device"].status == "fail"
    # The measured envelope widens the tolerance where the reference itself is sensitive.
    envelope = [0.0, 0.0, 6e-4, 6e-4]
    checks = _by_name(pc.layout_checks("mlm", "torch_3d pp2-nmb4", _run(ONE), _run(drift), envelope))
    assert checks["loss over 4 steps = 1 device"].status == "pass"


def test_parity_step0_and_status_of_a_layout():
    checks = _by_name(pc.layout_checks("mlm", "torch_3d dp2", _run(ONE), _run([10.6] + ONE[1:])))
    assert checks["loss at step 0 = 1 device"].status == "fail"
    [skip] = pc.layout_checks("mlm", "torch_3d tp2-vocab", _run(ONE), _run([], "unsupported", "no vocab split"))
    assert skip.status == "skip" and "no vocab split" in skip.detail
    [fail] = pc.layout_checks("mlm", "torch_3d dp2xtp2", _run(ONE), _run([], "failed", "rank 3 died"))
    assert fail.status == "fail"
    [ref] = pc.layout_checks("mlm", "torch_3d dp2", _run([], "failed", "reference died"), _run(ONE))
    assert ref.status == "fail" and "1 device run failed" in ref.detail


def test_final_parameters_are_held_to_the_probes_measured_drift_and_frameworks_to_each_other():
    """AdamW carries rounding further into small weights than into the loss: the final parameters may deviate
    by twice what the reference's perturbed runs show, and no more; another framework's run of a layout is held
    to the first framework's the same way."""
    drifted = {**FINAL, "encoder.0.query.weight": {"norm": 12.5 * (1 + 5e-5), "sum": -0.25, "size": 16384}}
    assert pc.weights_sensitivity(_run(ONE, final=FINAL), [_run(ONE, final=drifted)]) == pytest.approx(5e-5)
    assert pc.weights_sensitivity(_run(ONE, final=FINAL), [_run(ONE)]) is None  # a probe without weights
    off = {**FINAL, "encoder.0.query.weight": {"norm": 12.5 * (1 + 8e-5), "sum": -0.25, "size": 16384}}
    strict = _by_name(pc.layout_checks("mlm", "keras_jax tp2", _run(ONE, final=FINAL), _run(ONE, final=off)))
    assert strict["final parameters = 1 device"].status == "fail"
    measured = _by_name(pc.layout_checks("mlm", "keras_jax tp2", _run(ONE, final=FINAL), _run(ONE, final=off),
                                         against="torch_3d tp2", weights=5e-5))
    assert measured["final parameters = torch_3d tp2"].status == "pass"
    assert "1.0e-04" in measured["final parameters = torch_3d tp2"].detail
    far = {**FINAL, "encoder.0.query.weight": {"norm": 12.5 * (1 + 2e-4), "sum": -0.25, "size": 16384}}
    checks = _by_name(pc.layout_checks("mlm", "keras_jax tp2", _run(ONE, final=FINAL), _run(ONE, final=far),
                                       against="torch_3d tp2", weights=5e-5))
    assert checks["final parameters = torch_3d tp2"].status == "fail"


def test_layout_parity_probes_only_where_a_weight_or_curve_is_past_rounding(monkeypatch):
    """--probes auto in layout mode: the final weights are held to rounding unless probes widen it, and the probes
    are made (for every backend) only once some check would need them."""
    from argparse import Namespace

    from bench import parity
    from bench.layouts import layout_list
    made = []
    monkeypatch.setattr(parity, "_probes", lambda args, backend, *rest: made.append(backend) or [
        _run(ONE, final={**FINAL, "encoder.0.query.weight": {"norm": 12.5 * (1 + 2e-4), "sum": -0.25,
                                                              "size": 16384}})])

    def layout_parity(final: dict) -> dict[str, pc.Check]:
        monkeypatch.setattr(parity, "run_one", lambda args, backend, workload, devices, stamp, layout=None,
                            grad_accum=1: _run(ONE, final=FINAL if devices == 1 else final))
        args = Namespace(probes="auto", backends=["torch_3d"], layouts=layout_list("dp2"))
        checks, runs = parity.layout_parity(args, "mlm", "stamp", Console(file=io.StringIO()))
        assert runs["torch_3d"]["layouts"].keys() == {"dp2"}
        return {c.name: c for c in checks}

    checks = layout_parity(FINAL)
    assert made == [] and checks["reference's own sensitivity"].status == "skip"
    assert checks["torch_3d dp2: final parameters = 1 device"].status == "pass"
    off = {**FINAL, "encoder.0.query.weight": {"norm": 12.5 * (1 + 1e-4), "sum": -0.25, "size": 16384}}
    checks = layout_parity(off)  # 1e-4 is past rounding, within twice the probe's 2e-4
    assert made == ["torch_3d"] and checks["reference's own sensitivity"].status == "pass"
    assert checks["torch_3d dp2: final parameters = 1 device"].status == "pass"


@pytest.mark.e2e
def test_parity_refuses_a_bad_layout_list(tmp_path):
    proc = run_cli("bench.parity", "--layouts", "dp2,pp2-mb", "--backends", "torch_ddp", "--out", str(tmp_path / "p"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unknown option 'mb'" in proc.stderr
    assert not (tmp_path / "p").exists()


# ----------------------------------------------------------------------------- one real sweep

@pytest.mark.e2e
def test_a_layout_sweep_leaves_one_record_per_layout_and_reference(layout_sweep):
    proc, out = layout_sweep  # conftest.LAYOUT_SWEEP: --layouts dp2,tp2 on the tiny MLM, global batch 8
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = load_records(out)
    assert all(r["sweep_id"].startswith(LAYOUT_SWEEP_PREFIX) for r in records)
    by_name = {row.layout: row for row in layout_frame(records).itertuples()}
    assert set(by_name) == {"1 device", "dp2", "tp2"}, proc.stdout
    for name, row in by_name.items():
        record = next(r for r in records if r["run_id"] == row.run_id)
        assert record["status"] == "ok", (name, record["error"])
        assert record["backend"] == "torch_3d" and record["global_batch"] == 8
        assert len(record["layout"]["per_rank"]) == record["devices"] == (1 if name == "1 device" else 2)
        assert len(record["peak_memory_per_rank"]) == record["devices"]
        assert row.efficiency == row.efficiency  # every layout found its 1-device run
    assert by_name["tp2"].devices == 2 and next(r for r in records if r["run_id"] == by_name["tp2"].run_id)[
        "layout"]["tp"] == 2
    assert "dp2" in proc.stdout and "tp2" in proc.stdout
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:  # two ranks fit the cores side by side: rank 0 on its own, a lone rank left unpinned
        metrics = {name: next(r for r in records if r["run_id"] == row.run_id)["backend_metrics"]
                   for name, row in by_name.items()}
        assert metrics["dp2"]["cores"] == metrics["tp2"]["cores"] == [cores[0]]
        assert metrics["1 device"]["cores"] == cores
    summary = (out / "summary.csv").read_text()
    assert summary.count("\n") == 4
    assert json.loads((out / "runs" / f"{by_name['dp2'].run_id}.json").read_text())["layout"]["dp"] == 2
    assert Path(out / "logs").is_dir()


def test_parity_holds_each_framework_against_the_first_per_layout():
    from bench.parity import cross_framework_checks
    ran = {"torch_3d": {"1 device x1": _run(ONE), "dp2": _run(ONE), "pp2-nmb4": _run(ONE)},
           "keras_jax": {"1 device x1": _run(ONE), "dp2": _run([v * (1 + 2e-7) for v in ONE]),
                         "pp2-nmb4": _run([], "unsupported", "keras.distribution has no pipeline parallelism")}}
    checks = {c.name: c for c in cross_framework_checks("mlm", ran, {"torch_3d": (None, None),
                                                                     "keras_jax": (None, None)})}
    assert checks["keras_jax dp2: loss over 4 steps = torch_3d dp2"].status == "pass"
    assert checks["keras_jax 1 device x1: loss at step 0 = torch_3d 1 device x1"].status == "pass"
    assert checks["keras_jax pp2-nmb4: runs"].status == "skip"
    assert "no pipeline" in checks["keras_jax pp2-nmb4: runs"].detail


def test_the_layout_table_s_cells_of_what_a_run_lacks_or_holds_twice():
    """The cell helpers of the layout table, each on the case the whole-table test does not reach: a run without
    a layout or accumulation, empty sections, two kinds of collective (one the list does not know) with a rank
    that moved nothing, and the no-reference note on a multi-device run only, where its efficiency is missing."""
    from bench.reporting import layouts as cells
    from common.sections import Bubble, CommPerStep, StateBytesPerRank
    assert cells.layout_name({"devices": 1, "config": {}}) == "?"
    plain = {"devices": 1, "layout": {"dp": 1}, "config": {}}
    assert cells.accumulation(plain) == 1 and cells.layout_name(plain) == Layout().name
    assert (cells._state(None), cells._bubble(None), cells._per_rank([]), cells._comm(None)) == ("", ("", ""), "",
                                                                                                  "")
    assert cells._state(StateBytesPerRank([])) == "" and cells._bubble(Bubble(0.25)) == ("25.0%", "")
    comm = CommPerStep.from_value([{"all_reduce": {"bytes": MIB, "calls": 1, "time_s": 0.1},
                                    "gossip": {"bytes": 2 * MIB, "calls": 1, "time_s": None}}, None])
    assert cells._comm(comm) == "all_reduce 1, 0; gossip 2, 0"
    row = pd.Series({"efficiency": float("nan")})
    ok = {"status": "ok", "devices": 2}
    assert cells._remark(ok, row).startswith("no 1-device run of this configuration")
    assert cells._remark({**ok, "devices": 1}, row) == ""
    assert cells._remark(ok, pd.Series({"efficiency": 0.8})) == ""
