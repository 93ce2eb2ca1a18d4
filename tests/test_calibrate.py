"""bench.calibrate and the step-time breakdown: every backend held against its bare loop, and the phases of a
probe step adding up to the measured step."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.reporting.calibration import calibration_blocks
from bench.reporting.document import Table, Text
from common.breakdown import (
    PHASES,
    breakdown_total,
    bus_bandwidth_gbps,
    communication_note,
    grad_comm_summary,
    kinds_gbps_from_probe,
    link_gbps_from_probe,
    ring_bound_s,
    ring_factor,
    summarize_breakdown,
)
from common.calibration import bare_result, calibration_entry
from tests.conftest import run_cli

# One thread per device: the suite's other pytest worker holds the second core, and torch's two OpenMP threads
# beside it spin at every barrier (calibrate of torch_ddp on 1 device: 20.8 CPU-s at 2 threads, 11.6 s at 1).
TINY = ("--steps", "4", "--warmup-steps", "1", "--skip-eval", "--data", "synthetic", "--threads-per-device", "1")


def _records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]


def test_bus_bandwidth_and_ring_bound_follow_nccl_tests():
    # 2(N-1)/N x bytes / time: 1 for two ranks, 1.5 for four, nothing for one.
    assert bus_bandwidth_gbps(1e9, 1.0, 2) == pytest.approx(1.0)
    assert bus_bandwidth_gbps(1e9, 1.0, 4) == pytest.approx(1.5)
    assert bus_bandwidth_gbps(1e9, 1.0, 1) is None
    assert ring_bound_s(1e9, 4, 3.0) == pytest.approx(0.5)
    comm = grad_comm_summary(2e9, 4.0, 2, 1.0, "test")
    assert comm["busbw_GBps"] == pytest.approx(0.5) and comm["ring_bound_s"] == pytest.approx(2.0)


def test_breakdown_is_the_median_probe_step():
    probes = [{"forward_backward_s": fb, "grad_comm_s": 0.1, "optimizer_s": 0.05, "data_s": 0.01, "step_s": fb + 0.2}
              for fb in (3.0, 1.0, 2.0)]
    b = summarize_breakdown(probes, 2.2, "test")
    assert b["forward_backward_s"] == 2.0 and b["other_s"] == pytest.approx(0.04)
    assert breakdown_total(b) == pytest.approx(2.2) and b["probe_steps"] == 3
    # One step's forward is long, another's communication: the median step's own phases add up to it (each
    # phase's median would give forward 2 + communication 2 + other 0.5 = 4.5 against a 5.2 s median step).
    probes = [{"forward_backward_s": fb, "grad_comm_s": comm, "step_s": step}
              for fb, comm, step in ((1.0, 3.0, 4.5), (4.0, 1.0, 5.2), (2.0, 2.0, 6.0))]
    b = summarize_breakdown(probes, None, "test")
    assert (b["forward_backward_s"], b["grad_comm_s"]) == (4.0, 1.0) and b["other_s"] == pytest.approx(0.2)
    assert breakdown_total(b) == pytest.approx(b["probe_step_s"]) == pytest.approx(5.2)


def test_communication_note_quotes_the_records_own_figures():
    probes = [{"forward_backward_s": 0.2, "grad_comm_s": 0.1, "optimizer_s": 0.05, "data_s": 0.001, "step_s": 0.36}]
    metrics = {"breakdown": summarize_breakdown(probes, 0.4, "test"),
               "grad_comm": grad_comm_summary(2**23, 0.1, 2, 0.5, "test")}
    note = communication_note({"backend_metrics": metrics}, "mccl")
    assert "(mccl) 100 ms of the 400 ms step (25%)" in note and "8.0 MiB at bus bandwidth 0.08 GB/s" in note
    assert "against 0.50 GB/s" in note and "forward+backward 200 ms" in note and "add up to 360 ms" in note
    assert communication_note({"backend_metrics": {"breakdown": metrics["breakdown"]}}, "mccl") is None


def test_breakdown_arithmetic_at_its_edges():
    """What is not measured stays None; a probe missing a phase counts it as 0; the rest is never negative."""
    assert bus_bandwidth_gbps(0, 1.0, 2) is None and bus_bandwidth_gbps(1e9, 0.0, 2) is None
    assert bus_bandwidth_gbps(1e9, -1.0, 2) is None and bus_bandwidth_gbps(3e9, 2.0, 3) == pytest.approx(2.0)
    assert ring_bound_s(1e9, 1, 3.0) is None and ring_bound_s(1e9, 2, None) is None
    assert ring_bound_s(1e9, 2, 2.0) == pytest.approx(0.5)
    assert link_gbps_from_probe(1e9, [2.0, 0.5, 1.0], 2) == pytest.approx(2.0) and \
        link_gbps_from_probe(1e9, [], 2) is None
    # other kinds at their own nccl-tests factor: (n-1)/n of the whole buffer over the fastest call
    assert kinds_gbps_from_probe(1e9, {"reduce_scatter": [0.5, 0.25], "all_gather": []}, 4) == \
        {"reduce_scatter": pytest.approx(3.0)}
    assert kinds_gbps_from_probe(1e9, {}, 2) is None and kinds_gbps_from_probe(0, {"all_gather": [1.0]}, 1) is None
    assert grad_comm_summary(1e9, 2.0, 2, None, "src") == {"bytes_per_step": 1_000_000_000, "time_s": 2.0,
                                                           "busbw_GBps": pytest.approx(0.5), "link_GBps": None,
                                                           "ring_bound_s": None, "ranks": 2, "source": "src"}
    probes = [{"forward_backward_s": 0.5, "step_s": 0.4}, {"forward_backward_s": 0.3, "optimizer_s": None,
                                                           "step_s": 0.6}]
    b = summarize_breakdown(probes, None, "src")
    assert b == {"forward_backward_s": 0.4, "grad_comm_s": 0.0, "optimizer_s": 0.0, "data_s": 0.0,
                 "other_s": pytest.approx(0.15), "probe_step_s": 0.5, "step_s": None, "source": "src",
                 "probe_steps": 2}  # two probes, both in the middle: other 0 (never -0.1) and 0.3, averaged
    assert breakdown_total(b) == pytest.approx(0.55)


def test_the_note_leaves_out_what_was_not_measured():
    probes = [{"forward_backward_s": 0.2, "grad_comm_s": 0.1, "optimizer_s": 0.05, "data_s": 0.001, "step_s": 0.36}]
    breakdown = summarize_breakdown(probes, 0.4, "test")
    note = communication_note({"backend_metrics": {"breakdown": breakdown, "grad_comm": grad_comm_summary(
        2**23, 0.1, 2, None, "test")}}, "gloo")
    assert "against unmeasured for one plain all-reduce;" in note and "ring bound" not in note
    assert "optimizer 50 ms" in note and "data feed 1.0 ms" in note
    for metrics in ({"breakdown": {**breakdown, "step_s": None}}, {"breakdown": {**breakdown, "grad_comm_s": 0.0}},
                    {"breakdown": breakdown, "grad_comm": grad_comm_summary(2**23, 0.1, 1, None, "test")}):
        assert communication_note({"backend_metrics": {"grad_comm": grad_comm_summary(2**23, 0.1, 2, 1.0, "t"),
                                                       **metrics}}, "gloo") is None
    assert communication_note({}, "gloo") is None


def test_the_note_gives_seconds_long_phases_in_whole_milliseconds():
    # A slow link: phases of seconds, where a wrong unit factor shows in the printed milliseconds.
    probes = [{"forward_backward_s": 3.0, "grad_comm_s": 2.2, "optimizer_s": 1.5, "data_s": 0.001, "step_s": 6.8}]
    metrics = {"breakdown": summarize_breakdown(probes, 7.0, "test"),
               "grad_comm": grad_comm_summary(2**30, 2.2, 2, 0.5, "test")}
    note = communication_note({"backend_metrics": metrics}, "gloo")
    # ring bound: 2 x (2 - 1) / 2 x 2**30 bytes at 0.5 GB/s = 2.147483648 s
    assert "for one plain all-reduce, ring bound 2147 ms;" in note
    assert "(gloo) 2200 ms of the 7000 ms step (31%)" in note and "optimizer 1500 ms (every rank" in note


def test_calibration_entry_pairs_repeats():
    entry = calibration_entry([90.0, 110.0], [100.0, 100.0], "idiom")
    assert entry["ratio"] == pytest.approx(1.0) and entry["spread"] == pytest.approx(0.2)
    assert entry["repeats"] == 2 and not entry["harness_bound"]
    assert calibration_entry([80.0], [100.0], "idiom")["harness_bound"]
    both = bare_result([{"measured_steps": 3, "window_s": 1.0}, {"measured_steps": 3, "window_s": 2.0}], 10, "x")
    assert both["samples_per_s"] == pytest.approx(15.0)  # the slowest rank's window


def test_report_shows_every_ratio_and_flags_the_harness_bound():
    def record(backend: str, suite: float, bare: float) -> dict:
        return {"status": "ok", "workload": "cnn", "backend": backend, "devices": 2, "samples_per_s": suite,
                "started_at": "2026-01-01T00:00:00Z", "calibration": calibration_entry([suite], [bare], backend)}
    blocks = calibration_blocks([record("tf_mirrored", 90.0, 100.0), record("torch_ddp", 99.0, 100.0)])
    [table] = [b for b in blocks if isinstance(b, Table)]
    rows = {row[1]: dict(zip(table.columns, row)) for row in table.rows}
    assert rows["tf_mirrored"]["ratio"] == "0.90" and rows["tf_mirrored"]["verdict"] == "harness-bound (0.90)"
    assert rows["torch_ddp"]["ratio"] == "0.99" and rows["torch_ddp"]["verdict"] == "ok"
    assert any(isinstance(b, Text) and "tf_mirrored cnn N=2: 0.90" in b.text for b in blocks)


# Each calibration takes 30-70 s in the suite beside the other worker: `nox -s calibrate-idioms` runs these
# (by_hand). CI runs torch's calibrations through bench.gpu_check on a CPU (tests/test_gpu_check.py: torch_dp's and
# torch_ddp's among them, held to these assertions) and TensorFlow's and MindSpore's bare loops alone (below).
@pytest.mark.e2e
@pytest.mark.by_hand
@pytest.mark.parametrize("backend", ["torch_dp", "torch_ddp", "tf_mirrored", "mindspore_auto"])
def test_calibrate_writes_a_positive_ratio_and_the_idiom(tmp_path, backend):
    # torch's bare loop follows --precision as the suite does (bf16 autocast runs on CPU too)
    precision = ["--precision", "amp"] if backend == "torch_dp" else []
    proc = run_cli("bench.calibrate", "--gpus", "1", "--backends", backend, "--workloads", "cnn", "--repeats", "1",
                   "--breakdown-steps", "2", "--out", str(tmp_path), *TINY, *precision)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [record] = _records(tmp_path)
    assert record["status"] == "ok", record["error"]
    cal = record["calibration"]
    assert cal["ratio"] > 0 and cal["bare_samples_per_s"] > 0 and cal["repeats"] == 1
    assert backend.split("_")[0] in cal["idiom"].lower() or "keras" in cal["idiom"].lower()
    assert len(list((tmp_path / "bare").glob("*.json"))) == 1
    breakdown = record["backend_metrics"]["breakdown"]
    assert breakdown["probe_steps"] == 2 and breakdown["forward_backward_s"] > 0
    assert record["measured_steps"] == 3  # the probe steps stay out of the measured window


# TensorFlow's and MindSpore's bare loops in CI, cheaper than their calibration above: the bare half alone, started
# as bench.calibrate starts it (bench.run --bare), its steps trained and timed as the suite's would be.
@pytest.mark.e2e
@pytest.mark.parametrize("backend, idiom", [("tf_mirrored", "model.fit"), ("mindspore_auto", "Model.train")])
def test_a_framework_s_bare_loop_trains_and_times_the_suite_s_steps(tmp_path, backend, idiom):
    proc = run_cli("bench.run", "--backend", backend, "--workload", "cnn", "--devices", "1", "--batch-size", "8",
                   "--run-id", "bare-check", "--bare", "--out", str(tmp_path), *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "bare" / "bare-check.json").read_text())
    assert idiom in result["idiom"] and result["measured_steps"] == 3    # 4 steps, the first a warm-up
    assert result["samples_per_s"] == pytest.approx(8 * 3 / result["window_s"]) and result["window_s"] > 0
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("*.json"))  # no run record


@pytest.mark.parametrize("backend, workload, layout, grad_bytes", [
    # DDP's all-reduce: every float32 gradient, once per step, counted in DDP's comm hook only.
    ("torch_ddp", "cnn", [], lambda record: 4 * record["params"]),
    # FSDP2: each rank reduce-scatters every gradient and all-gathers every parameter (forward and backward).
    ("torch_3d", "mlm", ["--fsdp", "2", "--model-size", "tiny"], None),
])
@pytest.mark.e2e
@pytest.mark.quiet  # the probe step against the measured one: a second test beside either skews it
def test_breakdown_of_a_step_sums_to_the_measured_step(tmp_path, backend, workload, layout, grad_bytes):
    """Two ranks, where every phase is there: compute, the gradient communication, AdamW, data; one way of
    measuring the communication (torch_common.comm.CommCounter) for every torch backend."""
    proc = run_cli("bench.run", "--backend", backend, "--workload", workload, "--devices", "2", "--steps", "10",
                   "--warmup-steps", "2", "--skip-eval", "--data", "synthetic", "--breakdown-steps", "8",
                   "--batch-size", "16", *layout, "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    [record] = _records(tmp_path)
    metrics = record["backend_metrics"]
    b, comm = metrics["breakdown"], metrics["grad_comm"]
    assert b["step_s"] == record["step_time_s"]["p50"]
    # Each phase is timed on its own; the probe step around them by the loop's clock. The timed phases make up
    # the probe step (other_s, what is left, is small: a phase not timed would land there).
    timed = sum(b[k] for k in PHASES)
    assert b["other_s"] <= 0.1 * b["probe_step_s"] and timed == pytest.approx(b["probe_step_s"], rel=0.1), b
    # The probe step does the measured step's work and waits for each collective, so the communication a step
    # overlaps with compute (DDP's buckets during the backward, FSDP's all-gathers) stands apart: the probe is
    # no shorter than the measured step and longer by at most the communication it timed (what could have been
    # hidden). A margin of 25% either way for two loaded cores (DDP's CNN has measured +29% to +61% over its
    # step, its communication 87% of its compute).
    assert 0.75 * b["step_s"] <= timed <= 1.25 * (b["step_s"] + b["grad_comm_s"]), b
    # The communication phase against the link, measured apart (a plain all-reduce of the same bytes after the
    # probe steps): no faster than the ring allows at the link's speed; all-gathers and reduce-scatters move half
    # an all-reduce's bytes per rank, so FSDP's bound (computed as all-reduces) is twice too high.
    assert comm["time_s"] == b["grad_comm_s"] and comm["time_s"] >= 0.5 * comm["ring_bound_s"], (b, comm)
    if grad_bytes:
        assert comm["bytes_per_step"] == grad_bytes(record)
    else:  # reduce-scatter of the gradients (the whole of them) + all-gathers of the parameters, more than once
        assert comm["bytes_per_step"] > 2 * 4 * record["params"]
    assert comm["busbw_GBps"] > 0 and comm["link_GBps"] > 0 and comm["ring_bound_s"] > 0
    # FSDP's kinds timed apart after it, at their own bus bandwidth (Gloo runs them as no ring: bench.predict
    # costs each at its probed rate)
    assert set(comm["link_GBps_by_kind"]) == {"reduce_scatter", "all_gather"}, comm
    assert all(gbps > 0 for gbps in comm["link_GBps_by_kind"].values())


@pytest.mark.e2e
def test_a_bare_loop_that_trains_float32_only_refuses_another_precision(tmp_path):
    """Held against a bf16 suite run, a float32 Keras loop would measure the precision, not the harness."""
    proc = run_cli("bench.run", "--backend", "tf_mirrored", "--workload", "cnn", "--devices", "1", "--bare",
                   "--precision", "amp", "--out", str(tmp_path), *TINY)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "--precision amp: tf_mirrored's bare loop trains float32" in proc.stderr
    assert not (tmp_path / "runs").exists() and not list(tmp_path.glob("bare/*.json"))


@pytest.mark.e2e
def test_a_refused_configuration_leaves_one_record(tmp_path):
    """torch_dp over two CPU devices is refused; the bare half must not write a second record."""
    proc = run_cli("bench.calibrate", "--gpus", "2", "--backends", "torch_dp", "--workloads", "cnn", "--repeats", "1",
                   "--out", str(tmp_path), *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [record] = _records(tmp_path)
    assert record["status"] == "unsupported" and "calibration" not in record


def test_the_note_by_the_numbers():
    """Figures whose milliseconds a wrong unit would show: every number of the note, by hand."""
    probes = [{"forward_backward_s": 2.0, "grad_comm_s": 1.0, "optimizer_s": 0.5, "data_s": 0.2, "step_s": 3.9}]
    metrics = {"breakdown": summarize_breakdown(probes, 4.0, "test"),
               "grad_comm": grad_comm_summary(3 * 2**20, 1.0, 2, 0.5, "test")}
    assert communication_note({"backend_metrics": metrics}, "gloo") == (
        "measured breakdown (1 probe steps): gradient all-reduce (gloo) 1000 ms of the 4000 ms step (25%), 3.0 MiB "
        "at bus bandwidth 0.00 GB/s against 0.50 GB/s for one plain all-reduce, ring bound 6 ms; forward+backward "
        "2000 ms, optimizer 500 ms (every rank updates every parameter), data feed 200.0 ms; the phases timed apart "
        "add up to 3900 ms")
    assert ring_factor(1) == ring_factor(0) == 0.0 and ring_factor(3) == pytest.approx(4 / 3)
