"""The report's calibration and step-breakdown tables (bench.reporting.calibration), every cell worked by hand from
records written here."""
from __future__ import annotations

from bench.reporting.calibration import breakdown_blocks, calibration_blocks
from bench.reporting.document import Heading, Table, Text


def _calibrated(backend: str, ratio: float, started: str | None, devices: int = 2, workload: str = "cnn",
                spread: float | None = 0.125, status: str = "ok") -> dict:
    record = {"status": status, "workload": workload, "backend": backend, "devices": devices,
              "samples_per_s": 1234.5, "calibration": {"ratio": ratio, "bare_samples_per_s": 2000.0,
                                                       "spread": spread, "repeats": 3, "idiom": f"{backend} loop"}}
    return record if started is None else {**record, "started_at": started}


def test_each_backend_s_newest_calibration_is_a_row_and_the_harness_bound_are_named():
    records = [_calibrated("torch_ddp", 0.99, "2026-01-02T00:00:00Z"),
               _calibrated("torch_ddp", 0.5, "2026-01-01T00:00:00Z"),      # older, listed after: not shown
               _calibrated("tf_mirrored", 0.9, None, spread=None),
               _calibrated("tf_mirrored", 0.97, "2026-01-01T00:00:00Z"),   # any stamp is newer than none
               _calibrated("torch_ddp", 0.95, "2026-01-01T00:00:00Z", devices=1),
               _calibrated("torch_ddp", 0.2, "2026-01-03T00:00:00Z", status="failed"),
               {**_calibrated("jax_pmap", 0.5, "2026-01-04T00:00:00Z"), "calibration": {"ratio": None}},
               {"status": "ok", "workload": "cnn", "backend": "x", "devices": 1}]
    blocks = calibration_blocks(records)
    assert blocks[0] == Heading("Calibration: the suite against each framework's bare loop", 2)
    assert blocks[1] == Text(
        "ratio = median suite samples/s / median bare-loop samples/s over alternated repeats; spread = (max - min) "
        "of the per-repeat ratios / ratio. Below 0.95 the harness, not the framework, sets the pace "
        "(harness-bound).")
    assert blocks[2] == Table(
        ["workload", "backend", "N", "suite samples/s", "bare samples/s", "ratio", "spread", "repeats", "verdict",
         "bare idiom"],
        [["cnn", "tf_mirrored", "2", "1,234.5", "2,000.0", "0.97", "0.12", "3", "ok", "tf_mirrored loop"],
         ["cnn", "torch_ddp", "1", "1,234.5", "2,000.0", "0.95", "0.12", "3", "ok", "torch_ddp loop"],
         ["cnn", "torch_ddp", "2", "1,234.5", "2,000.0", "0.99", "0.12", "3", "ok", "torch_ddp loop"]])
    assert blocks[3:] == []  # 0.95 is on the line, not below it


def test_a_harness_bound_ratio_is_flagged_in_its_row_and_below_the_table():
    blocks = calibration_blocks([_calibrated("tf_mirrored", 0.9, None, spread=None),
                                 _calibrated("torch_ddp", 0.5, "2026", workload="mlm", devices=4)])
    assert blocks[2].rows == [
        ["cnn", "tf_mirrored", "2", "1,234.5", "2,000.0", "0.90", "", "3", "harness-bound (0.90)", "tf_mirrored loop"],
        ["mlm", "torch_ddp", "4", "1,234.5", "2,000.0", "0.50", "0.12", "3", "harness-bound (0.50)",
         "torch_ddp loop"]]
    assert blocks[3:] == [Text("Harness-bound: tf_mirrored cnn N=2: 0.90; torch_ddp mlm N=4: 0.50.")]


def test_no_calibrated_record_no_section():
    assert calibration_blocks([_calibrated("torch_ddp", 0.9, "2026", status="failed")]) == []
    assert breakdown_blocks([{"status": "ok", "workload": "cnn", "backend": "x", "devices": 1}]) == []


def _probed(backend: str, step_s, started: str, comm: dict | None = None, devices: int = 2) -> dict:
    metrics = {"breakdown": {"forward_backward_s": 0.06, "grad_comm_s": 0.02, "optimizer_s": 0.01, "data_s": 0.005,
                             "other_s": 0.005, "probe_step_s": 0.11, "step_s": step_s, "source": "probes",
                             "probe_steps": 5}}
    if comm is not None:
        metrics["grad_comm"] = comm
    return {"status": "ok", "workload": "mlm", "backend": backend, "devices": devices, "started_at": started,
            "backend_metrics": metrics}


def test_each_phase_is_in_ms_with_its_share_of_the_step_and_the_communication_against_the_link():
    comm = {"bytes_per_step": 3 * 2**20, "time_s": 0.02, "busbw_GBps": 1.5, "link_GBps": None, "ring_bound_s": 0.0125,
            "ranks": 2}
    records = [_probed("torch_ddp", 0.1, "2026-01-02", comm),
               _probed("torch_ddp", 0.2, "2026-01-01"),                      # older: not shown
               _probed("tf_mirrored", None, "2026-01-01"),                   # no measured step: the probe's
               _probed("jax_pmap", 0.0, "2026-01-01", {**comm, "busbw_GBps": None, "ring_bound_s": None}, 1)]
    records[-1]["backend_metrics"]["breakdown"]["probe_step_s"] = 0.0
    blocks = breakdown_blocks(records)
    assert blocks[:2] == [Heading("Where a step's time goes", 2), Text(
        "Phases in ms per step (share of the measured median step), timed in probe steps after the measured window "
        "with the device synchronised between phases; 'probe step' is their own total. Gradient communication: MiB "
        "all-reduced per step, achieved bus bandwidth 2(N-1)/N x bytes / time against the link's (a plain "
        "all-reduce on the same collective, measured at run time), and the ring bound.")]
    assert blocks[2].columns == ["workload", "backend", "N", "fwd+bwd ms", "grad comm ms", "optimizer ms", "data ms",
                                 "other ms", "step ms", "probe step ms", "grad MiB", "busbw / link GB/s",
                                 "ring bound ms", "timed by"]
    assert blocks[2].rows == [
        # neither step timed: no shares, the phases alone
        ["mlm", "jax_pmap", "1", "60.00", "20.00", "10.00", "5.00", "5.00", "0.00", "0.00", "3.0", "", "",
         "probes"],
        ["mlm", "tf_mirrored", "2", "60.00 (55%)", "20.00 (18%)", "10.00 (9%)", "5.00 (5%)", "5.00 (5%)", "",
         "110.00", "0.0", "", "", "probes"],
        ["mlm", "torch_ddp", "2", "60.00 (60%)", "20.00 (20%)", "10.00 (10%)", "5.00 (5%)", "5.00 (5%)", "100.00",
         "110.00", "3.0", "1.50 / 0.00", "12.50", "probes"]]
    assert blocks[3:] == []
    linked = breakdown_blocks([_probed("torch_ddp", 0.1, "2026", {**comm, "link_GBps": 2.25})])
    assert linked[2].rows[0][11] == "1.50 / 2.25"
