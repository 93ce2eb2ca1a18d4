"""common.predict.validation: which records a run is predicted from, and predicted against measured on runs whose
answer is known by hand (a 1-device run that is all forward+backward, on an H100 node where nothing else is
modelled), so that every figure of validation.json is held to a number, not only to being finite."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from bench.reporting import validation as validation_report
from common.layout import Layout
from common.predict import hardware as hardware_files
from common.predict.basis import UNPROBED, co_run_slowdown, from_records
from common.predict.memory import state_bytes
from common.predict.validation import (
    basis_of,
    compiled_collectives,
    execution,
    hardware_for,
    probed_links,
    references,
    relative,
    repeats_of,
    validate,
)
from common.spec import BERT_SIZES

TINY = BERT_SIZES["tiny"]
TINY_PARAMS = 4_723_586   # common.spec's count of the tiny MLM
H100 = hardware_files.load("h100-sxm-8")
LINK_GBPS = 2.0           # the folder's link probe (busbw)
PEAK, TRAINING = 3e9, 1e9  # the 1-device run's process peak and training growth (bytes)
FLAT = 4 * TINY_PARAMS     # torch_3d's flat float32 copy of the gradients for its dp all-reduce (dp > 1 only)


def _record(run_id, devices, batch, accumulation=1, backend="torch_3d", started="2026-01-01T00:00:00", link=None):
    metrics = {"grad_comm": {"bytes_per_step": 1, "time_s": 1.0, "busbw_GBps": None, "link_GBps": link,
                             "ring_bound_s": None, "ranks": devices}} if link else {}
    return {"run_id": run_id, "status": "ok", "devices": devices, "global_batch": batch, "backend": backend,
            "workload": "mlm", "device_kind": "cpu", "threads_per_device": 1, "host": {"name": "h"},
            "config": {"model_size": "tiny", "precision": "fp32", "grad_accum": accumulation},
            "layout": {"dp": devices}, "step_time_s": {"p50": 1.0}, "started_at": started,
            "backend_metrics": metrics}


def test_a_run_is_predicted_from_the_one_device_run_of_its_batch_and_micro_batches():
    one, four = _record("one", 1, 32), _record("four", 1, 32, accumulation=4)
    other_backend, other_batch = _record("ddp", 1, 32, backend="torch_ddp"), _record("b64", 1, 64)
    pipeline = {**_record("pp", 2, 32), "layout": {"dp": 1, "pp": 2, "micro_batches": 4}}
    records = [one, four, other_backend, other_batch, pipeline]
    # The same accumulation first; the other micro-batch count of that batch gives the per-micro-batch cost.
    assert [r["run_id"] for r in references(pipeline, records)] == ["four", "one"]
    assert [r["run_id"] for r in references(_record("dp2", 2, 32), records)] == ["one", "four"]
    assert references(_record("dp2", 2, 32, backend="keras_jax"), records) == []
    probes = [_record("a", 2, 32, link=1.0), _record("b", 2, 32, link=3.0), _record("c", 4, 32, link=0.5)]
    assert probed_links(probes) == {2: {"all_reduce": 2.0}, 4: {"all_reduce": 0.5}}
    assert probed_links([{**probes[0], "status": "failed"}, _record("one", 1, 32, link=9.0)]) == {}


def test_references_are_alike_in_everything_that_changes_the_compute():
    run = _record("run", 2, 64)
    newer = _record("newer", 1, 64, started="2026-01-02T00:00:00")
    older = _record("older", 1, 64)
    other_batch = _record("b32", 1, 32, started="2026-01-03T00:00:00")
    assert [r["run_id"] for r in references(run, [older, other_batch, newer])] == ["newer"]  # same batch, latest
    assert [r["run_id"] for r in references(run, [other_batch])] == ["b32"]                  # else any batch
    same_sweep = {**older, "sweep_id": "s"}
    assert [r["run_id"] for r in references({**run, "sweep_id": "s"}, [newer, same_sweep])] == ["older"]
    recompute = {**_record("rc", 1, 64, started="2026-01-04T00:00:00"), "layout": {"dp": 1, "recompute": True}}
    assert references(run, [recompute, older])[0]["run_id"] == "older"      # executed alike first
    assert references({**run, "layout": {"dp": 2, "recompute": True}}, [older, recompute])[0]["run_id"] == "rc"
    assert execution(recompute) == (True, "") and execution({**older, "config": {"compile": "default"}}) == \
        (False, "default")
    unlike = [{**older, "status": "failed"}, {**older, "step_time_s": {}}, {**older, "host": {"name": "other"}},
              {**older, "threads_per_device": 2}, {**older, "config": {**older["config"], "precision": "amp"}},
              {**older, "config": {**older["config"], "model_size": "mini"}}, {**older, "workload": "cnn"}]
    assert all(references(run, [r]) == [] for r in unlike)
    assert references({**run, "config": {}}, [{**older, "config": {}}]) != []  # no size said: tiny for both


def test_the_link_is_the_probe_at_the_nearest_rank_count():
    assert hardware_for(_record("r", 4, 64), H100, {}) == (H100, "link: h100-sxm-8's description (no link probe "
                                                                "in the folder)")
    for devices, probe in ((2, 2), (3, 2), (4, 4), (8, 4)):
        hw, note = hardware_for(_record("r", devices, 64), H100, {2: {"all_reduce": 1.5}, 4: {"all_reduce": 3.0}})
        node = hw.link(False)
        assert node.busbw_GBps == {2: 1.5, 4: 3.0}[probe] and node.latency_s == H100.link(False).latency_s
        assert note == f"link: probe at {probe} ranks, {node.busbw_GBps:.3g} GB/s busbw"
        assert hw.link(True) == H100.link(True)  # across nodes: the description's
    # kinds probed apart: the medians at the chosen rank count, each kind at its own rate, the rest at the link's
    kinds = [{**_record(n, 2, 64, link=1.5), "backend_metrics": {"grad_comm": {
        **_record(n, 2, 64, link=1.5)["backend_metrics"]["grad_comm"], "link_GBps_by_kind": {"all_gather": g}}}}
        for n, g in (("a", 0.5), ("b", 0.7), ("c", 0.9))]
    assert probed_links(kinds) == {2: {"all_reduce": 1.5, "all_gather": 0.7}}
    assert probed_links([_record("d", 2, 64, link=1.5)]) == {2: {"all_reduce": 1.5}}
    hw, note = hardware_for(_record("r", 2, 64), H100, probed_links(kinds))
    assert hw.link(False).busbw("all_gather") == 0.7 and hw.link(False).busbw("all_reduce") == 1.5
    assert note == "link: probe at 2 ranks, 1.5 GB/s busbw, all_gather 0.7"


def test_relative_error_and_what_is_not_measured():
    assert relative(1.2, 1.0) == pytest.approx(0.2) and relative(0.5, 1.0) == -0.5
    assert relative(None, 1.0) is None and relative(1.0, None) is None and relative(1.0, 0.0) is None


def test_a_compiler_placed_run_is_costed_with_the_collectives_it_compiled():
    comm = [{"all_reduce": {"bytes": 800, "calls": 4, "time_s": None}, "all_gather": {"bytes": 0, "calls": 0,
                                                                                     "time_s": None}}, None]
    run = {**_record("r", 2, 64, backend="keras_jax"), "backend_metrics": {"comm_per_step": comm}}
    [c] = compiled_collectives(run, Layout(dp=2))
    assert (c.kind, c.dim, c.nbytes, c.calls, c.ranks) == ("all_reduce", "all", 200, 4, 2)
    assert compiled_collectives({**run, "backend": "torch_3d"}, Layout(dp=2)) is None
    assert compiled_collectives(_record("r", 2, 64, backend="keras_jax"), Layout(dp=2)) is None
    assert compiled_collectives({**run, "backend_metrics": {"comm_per_step": [None]}}, Layout(dp=2)) is None


def _by_hand(ranks: int) -> float:
    """The step of a data-parallel run on the H100 node: the 1-device run's 1 s of forward+backward (32 per rank),
    then the float32 gradients' ring all-reduce: 2(n-1)/n of the bytes through each link, 2(n-1) latency steps."""
    return 1.0 + 2 * (ranks - 1) / ranks * 4 * TINY_PARAMS / (LINK_GBPS * 1e9) + 2 * (ranks - 1) * \
        H100.link(False).latency_s


def _known_folder() -> list[dict]:
    """A 1-device run (no breakdown probe: all forward+backward) and dp2, dp4 runs of 32 per rank on cuda."""
    one = {**_record("one", 1, 32), "device_kind": "cuda",
           "memory": {"process_peak_per_rank": [PEAK], "training_per_rank": [TRAINING]}}
    dp2 = {**_record("dp2", 2, 64, link=LINK_GBPS), "device_kind": "cuda"}
    dp4 = {**_record("dp4", 4, 128), "device_kind": "cuda", "layout": {"dp": 4}}
    # dp2 took 25% longer than by hand, dp4 exactly that; each rank of dp2 holds the whole model as one device
    dp2["step_time_s"], dp4["step_time_s"] = {"p50": 1.25 * _by_hand(2)}, {"p50": _by_hand(4)}
    dp2["memory"] = {"process_peak_per_rank": [PEAK, 1.25 * PEAK], "training_per_rank": [TRAINING + FLAT] * 2}
    whole = asdict(state_bytes(TINY, Layout(), 0))
    dp2["backend_metrics"]["state_bytes_per_rank"] = [whole, whole]
    dp2["backend_metrics"]["comm_per_step"] = [{"all_reduce": {"bytes": FLAT, "calls": 1, "time_s": 0.1},
                                                "send_recv": {"bytes": 8, "calls": 2, "time_s": 0.0}}, None]
    dp4["backend_metrics"] = {"state_bytes_per_rank": [whole] * 3 + [{**whole, "grads": 0}]}
    return [dp4, one, dp2]


def _repeat(record: dict, sweep: str, started: str, step_s: float) -> dict:
    return {**record, "run_id": f"{record['run_id']}-{started}", "sweep_id": sweep, "started_at": started,
            "step_time_s": {"p50": step_s}}


def test_repeats_are_predicted_from_the_median_reference_and_held_as_one_configuration():
    """A sweep of 3 repeats: the 1-device runs took 1.0, 1.6 and 0.8 s (the median, 1.0 s, is by hand's basis;
    an older sweep's faster run is not a repeat of these); dp2 measured 1x, 1.25x and 2x by hand: run by run
    errors 0, -0.2, -0.5, as a configuration the median 1.25x, -0.2. dp4 ran once in another sweep."""
    one, dp2 = _known_folder()[1], _known_folder()[2]
    ones = [_repeat(one, "s", t, step) for t, step in (("1", 1.0), ("2", 1.6), ("3", 0.8))]
    older = _repeat(one, "old", "0", 0.9)
    runs = [_repeat(dp2, "s", t, factor * _by_hand(2)) for t, factor in (("4", 1.0), ("5", 1.25), ("6", 2.0))]
    dp4 = _repeat(_known_folder()[0], "t", "7", _by_hand(4))
    assert [r["run_id"] for r in references(runs[0], [older, *ones])] == ["one-1"]
    assert [r["run_id"] for r in references(runs[0], [older, *ones[1:]])] == ["one-3"]  # of two, the faster
    # a run of a third sweep: the latest sweep's repeats, not a median over sweeps
    assert [r["run_id"] for r in references({**runs[0], "sweep_id": "x"}, [older, *ones])] == ["one-1"]
    # the sweep probed its first 1-device run side by side (1.6 s alone), not the median one: the probe still
    # reaches the basis, as its median (2.05 s) over the repeats' median alone (1.0 s), not over its one run
    probe = {"processes": 2, "step_s_p50": [2.0, 2.1], "slowdown": 1.3, "run_ids": ["c0", "c1"]}
    probed = [{**ones[1], "co_run": probe}, ones[0], ones[2], {**older, "co_run": {**probe, "slowdown": 9.0}}]
    refs = references(runs[0], probed)
    assert [r["run_id"] for r in refs] == ["one-1"] and basis_of(TINY, refs, probed).co_run == pytest.approx(2.05)
    assert repeats_of(ones[0], probed) == probed[:3]
    assert basis_of(TINY, [probed[0]], probed[:1]).co_run == 1.3  # no repeats: the probe's own figure
    # each repeat probed (--repeats with --co-run-probe): every probe's copies pooled, 2.0, 2.4, 1.0, 1.2, 1.6, 3.0,
    # their median 1.8 over the repeats' median alone, 1.0 s (the first probe's alone: 2.2; the median of the
    # probes' medians: 2.2); without repeats, the probes' median slowdown, 1.2 (the first's: 1.3)
    probes = [{**ones[i], "co_run": {**probe, "step_s_p50": copies, "slowdown": slow}}
              for i, copies, slow in ((1, [2.0, 2.4], 1.3), (0, [1.0, 1.2], 1.1), (2, [1.6, 3.0], 1.2))]
    assert basis_of(TINY, refs, probes).co_run == pytest.approx(1.8)
    assert "co-run probes of one-2, one-1, one-3" in basis_of(TINY, refs, probes).label
    assert co_run_slowdown(probes) == (1.2, "one-2, one-1, one-3")
    # a reference of another micro-batch count probed after its own, faster run (copies 0.5 s, x1.25 of it): its
    # copies are not pooled over the main one's steps (they would make 1.4); with the main one's repeats
    # unprobed, its own x1.25 (not 0.5 over the main one's 1.0 s)
    four = {**ones[0], "run_id": "four", "config": {**ones[0]["config"], "grad_accum": 4},
            "co_run": {**probe, "step_s_p50": [0.5, 0.5], "slowdown": 1.25}}
    assert basis_of(TINY, [refs[0], four], probes).co_run == pytest.approx(1.8)
    assert basis_of(TINY, [refs[0], four], ones).co_run == 1.25
    result = validate([older, *ones, *runs, dp4, {**ones[0], "run_id": "t-one", "sweep_id": "t"}], H100)
    assert [r["step_s"]["error"] for r in result["runs"]] == pytest.approx([0.0, -0.2, -0.5, 0.0], abs=1e-12)
    configs = {c["layout"]: c for c in result["configurations"]}
    assert configs["dp2"]["runs"] == [r["run_id"] for r in runs] and configs["dp4"]["runs"] == ["dp4-7"]
    assert configs["dp2"]["sweep_id"] == "s" and configs["dp2"]["devices"] == 2
    assert configs["dp2"]["step_s"] == {"predicted": pytest.approx(_by_hand(2), rel=1e-12),
                                        "measured": pytest.approx(1.25 * _by_hand(2)),
                                        "error": pytest.approx(-0.2), "measured_range": [
                                            pytest.approx(_by_hand(2)), pytest.approx(2 * _by_hand(2))]}
    summary = result["summary"]
    assert summary["all"]["step_s"]["max_abs_error"] == pytest.approx(0.5)
    assert summary["configurations"]["all"] == {"step_s": {"runs": 2, "median_abs_error": pytest.approx(0.1),
                                                           "max_abs_error": pytest.approx(0.2)}, "most_repeats": 3}
    line = validation_report.summary_line(result, "v.json")
    assert "median |error| 10.0%, largest 20.0% over 2 configurations" in line and "largest 50.0% over 4 runs" in line
    assert validation_report.config_rows(result)[0][3:] == ["3", f"{_by_hand(2) * 1e3:,.0f}",
                                                           f"{1.25 * _by_hand(2) * 1e3:,.0f}",
                                                           f"{_by_hand(2) * 1e3:,.0f}-{2 * _by_hand(2) * 1e3:,.0f}",
                                                           "-20.0%"]
    # one run per configuration: the run-by-run figures are the headline, as before repeats existed
    single = validate(_known_folder(), H100)
    assert not validation_report.repeated(single) and "over 2 runs" in validation_report.summary_line(single, "v")


def test_validation_of_runs_whose_answer_is_known_by_hand():
    """dp2 took 25% longer than by hand, dp4 exactly that: step errors -0.2 and 0, whatever else the model holds.
    Each rank of a dp run at 32 per rank holds what the 1-device run held: its process peak is the predicted one
    (errors 0 and -0.2 on dp2's two ranks: the worst is kept), its training growth too, plus the flat gradient
    copy the dp all-reduce takes."""
    result = validate(_known_folder(), H100)
    runs = {r["run_id"]: r for r in result["runs"]}
    assert list(runs) == ["dp2", "dp4"] and result["skipped"] == []
    for run_id, ranks, error in (("dp2", 2, -0.2), ("dp4", 4, 0.0)):
        row = runs[run_id]
        assert row["step_s"] == {"predicted": pytest.approx(_by_hand(ranks), rel=1e-12),
                                 "measured": row["step_s"]["measured"], "error": pytest.approx(error, abs=1e-12),
                                 "error_ignoring_load": pytest.approx(error, abs=1e-12)}
        assert (row["layout"], row["devices"], row["global_batch"]) == (run_id, ranks, 32 * ranks)
        assert row["references"] == ["one"] and row["backend"] == "torch_3d" and row["oversubscribed"] is False
        assert row["step_parts_s"]["compute"] == pytest.approx(1.0, rel=1e-12)
        assert row["load"] == {"background_run": 0.0, "background_reference": 0.0, "accounted": True}
        assert row["idle_per_stage"] is None
    # rank 0's counted collectives against the formulas' (one all-reduce of the gradients; no sends predicted)
    assert runs["dp2"]["comm_per_step"] == {"all_reduce": {"predicted": {"bytes": FLAT, "calls": 1},
                                                           "measured": {"bytes": FLAT, "calls": 1}},
                                            "send_recv": {"predicted": None, "measured": {"bytes": 8, "calls": 2}}}
    assert runs["dp4"]["comm_per_step"] is None
    assert "probe at 2 ranks" in runs["dp2"]["link"] and "probe at 2 ranks" in runs["dp4"]["link"]
    memory = runs["dp2"]["memory_per_rank"]
    assert memory["predicted"] == pytest.approx([PEAK, PEAK]) and memory["measured"] == [PEAK, 1.25 * PEAK]
    assert memory["error"] == pytest.approx(-0.2) and memory["what"] == "process peak (RSS on CPU)"
    training = runs["dp2"]["training_memory_per_rank"]
    assert training["predicted"] == pytest.approx([TRAINING + FLAT] * 2) and training["error"] == pytest.approx(0.0)
    assert runs["dp4"]["memory_per_rank"]["error"] is None and runs["dp4"]["training_memory_per_rank"] is None
    assert runs["dp4"]["memory_per_rank"]["predicted"] == pytest.approx([PEAK] * 4)  # per device: none measured
    assert runs["dp2"]["state_bytes_per_rank"]["exact"] is True and runs["dp4"]["state_bytes_per_rank"]["exact"] \
        is False
    # what each rank counted comes back beside the prediction, field by field
    whole = asdict(state_bytes(TINY, Layout(), 0))
    assert runs["dp2"]["state_bytes_per_rank"]["measured"] == [whole, whole]
    assert runs["dp4"]["state_bytes_per_rank"]["measured"] == [whole] * 3 + [{**whole, "grads": 0}]
    assert result["links_probed_GBps"] == {"2": LINK_GBPS} and result["hardware"] == "h100-sxm-8"
    summary = result["summary"]
    assert summary["all"]["step_s"] == {"runs": 2, "median_abs_error": pytest.approx(0.1),
                                        "max_abs_error": pytest.approx(0.2)}
    assert summary["all"]["memory_per_rank"] == {"runs": 1, "median_abs_error": pytest.approx(0.2),
                                                 "max_abs_error": pytest.approx(0.2)}
    assert summary["all"]["training_memory_per_rank"]["runs"] == 1
    assert (summary["all"]["state_bytes_exact"], summary["all"]["state_bytes_compared"]) == (1, 2)
    # the 1-device run has no breakdown probe: both runs rest on the guess that its whole step is forward+backward
    assert runs["dp2"]["basis_guesses"] == runs["dp4"]["basis_guesses"] == [UNPROBED.format(run_id="one")]
    assert summary["all"]["resting_on_a_guess"] == 2
    assert summary["not_oversubscribed"] == summary["all"]
    assert (summary["oversubscribed_runs"], summary["skipped_runs"]) == (0, 0)


def test_one_process_driving_several_devices_is_predicted_as_one():
    """tf_mirrored and keras_jax in one process: one peak for both devices, the framework's overhead once."""
    one, dp2 = _known_folder()[1:]
    dp2 = {**dp2, "memory": {"process_peak_per_rank": [2 * PEAK], "training_per_rank": [2 * (TRAINING + FLAT)]}}
    basis = from_records(TINY, [one])
    counted, counted_training = PEAK - basis.memory_overhead, TRAINING - basis.training_overhead
    [row] = validate([one, dp2], H100)["runs"]
    assert row["memory_per_rank"]["predicted"] == pytest.approx([basis.memory_overhead + 2 * counted])
    assert row["training_memory_per_rank"]["predicted"] == \
        pytest.approx([basis.training_overhead + 2 * (counted_training + FLAT)])
    # a 1-device run without memory figures: nothing to predict memory from, one peak or several
    bare = {**one, "memory": None}
    [row] = validate([bare, dp2], H100)["runs"]
    assert row["memory_per_rank"] == {"predicted": None, "measured": [2 * PEAK], "error": None,
                                      "what": "process peak (RSS on CPU)"}


def test_runs_that_cannot_be_predicted_are_skipped_with_the_reason():
    one, dp2 = _known_folder()[1:]
    oversubscribed = {**dp2, "run_id": "over", "oversubscribed": True}
    result = validate([one, dp2, oversubscribed, {**dp2, "run_id": "failed", "status": "failed"},
                       {**dp2, "run_id": "lone", "backend": "torch_ddp"},
                       {**dp2, "run_id": "bad", "layout": {"dp": 1, "pp": 2, "stage_split": [2, 2]}}], H100)
    assert [r["run_id"] for r in result["runs"]] == ["dp2", "over"]
    assert result["runs"][0]["notes"] == [] and result["runs"][0]["oversubscribed"] is False
    skipped = {s["run_id"]: s["why"] for s in result["skipped"]}
    assert skipped["lone"].startswith("no ok 1-device run of its backend") and "does not cut" in skipped["bad"]
    summary = result["summary"]
    assert summary["all"]["step_s"]["runs"] == 2 and summary["not_oversubscribed"]["step_s"]["runs"] == 1
    assert (summary["oversubscribed_runs"], summary["skipped_runs"]) == (1, 2)


def test_a_pipeline_s_idle_share_beside_the_measured_bubble():
    one, dp2 = _known_folder()[1:]
    pp2 = {**dp2, "run_id": "pp2", "global_batch": 32, "layout": {"dp": 1, "pp": 2, "micro_batches": 4},
           "backend_metrics": {"bubble": {"analytic": 0.2, "measured_per_stage": [0.25, 0.1]}}}
    [row] = validate([one, pp2], H100)["runs"]
    idle = row["idle_per_stage"]
    assert (idle["measured"], idle["analytic"]) == ([0.25, 0.1], 0.2) and row["layout"] == "pp2-nmb4"
    # stage 0 holds a layer, stage 1 a layer and the MLM head: the lighter first stage idles longer
    assert len(idle["predicted"]) == 2 and idle["predicted"][0] > idle["predicted"][1] > 0


def test_the_edges_a_first_pass_of_mutation_testing_found():
    """Each a mutant the known answers above let through."""
    # references: a dated run before an undated one; the same batch at another accumulation before another batch
    # at the same; the others only of the main run's batch, one per accumulation
    run = _record("run", 2, 64)
    undated = {**_record("undated", 1, 64), "started_at": None}
    assert references(run, [undated, _record("dated", 1, 64)])[0]["run_id"] == "dated"
    assert references(run, [_record("b32", 1, 32), _record("k2", 1, 64, accumulation=2)])[0]["run_id"] == "k2"
    refs = references(run, [_record("k1", 1, 64), _record("b32k4", 1, 32, accumulation=4),
                            _record("k4", 1, 64, accumulation=4), _record("k4b", 1, 64, accumulation=4)])
    assert [r["run_id"] for r in refs] == ["k1", "k4"]
    hw, _ = hardware_for(_record("r", 2, 64), H100, {2: {"all_reduce": 1.5}})
    assert hw.link(False).source == "median link probe at 2 ranks" and len(hw.links) == len(H100.links)
    comm = [{"all_reduce": {"bytes": 800, "calls": 4, "time_s": None}}]
    [c] = compiled_collectives({**_record("r", 2, 64, backend="keras_jax"), "backend_metrics": {
        "comm_per_step": comm}}, Layout(dp=2))
    assert (c.exposed, c.what) == (True, "as compiled")


def test_runs_of_every_shape_a_folder_holds():
    """No layout key (an older record), a CNN, an accumulating run, a compiler-placed run, runs without a start
    time, a run whose 1-device reference is missing before the others, load on a CPU host."""
    one, dp2 = _known_folder()[1:]
    bare = {k: v for k, v in dp2.items() if k != "layout"}
    keras_one = {**one, "run_id": "k-one", "backend": "keras_jax"}
    keras = {**dp2, "run_id": "k-dp2", "backend": "keras_jax", "backend_metrics": {"comm_per_step": [
        {"all_reduce": {"bytes": FLAT, "calls": 1, "time_s": None}}, None]}}
    lone = {**dp2, "run_id": "lone", "backend": "a_backend"}
    late = {**dp2, "run_id": "late", "started_at": "2026-01-05T00:00:00", "backend_metrics": {
        "state_bytes_per_rank": [asdict(state_bytes(TINY, Layout(), 0))]}}
    undated = {**dp2, "run_id": "undated", "started_at": None, "backend_metrics": {}}
    result = validate([late, undated, bare, keras_one, keras, lone, one], H100)
    runs = {r["run_id"]: r for r in result["runs"]}
    assert [r["run_id"] for r in result["runs"]] == ["k-dp2", "undated", "dp2", "late"]
    assert result["skipped"] == [{"run_id": "lone", "why": "no ok 1-device run of its backend, workload, size, "
                                                          "host and threads per device"}]
    assert runs["dp2"]["layout"] == "dp2" and runs["dp2"]["step_s"]["error"] == pytest.approx(-0.2)
    assert runs["k-dp2"]["notes"] == ["collectives as XLA compiled them (the run's comm_per_step), not predicted"]
    assert runs["k-dp2"]["comm_per_step"] is None and "comm_per_step" in runs["k-dp2"]
    assert runs["k-dp2"]["step_s"]["error_ignoring_load"] == runs["k-dp2"]["step_s"]["error"]
    assert runs["k-dp2"]["step_s"]["predicted"] == pytest.approx(_by_hand(2), rel=1e-12)  # the same all-reduce
    assert runs["undated"]["state_bytes_per_rank"] == {"predicted": [asdict(state_bytes(TINY, Layout(dp=2), r))
                                                                     for r in range(2)],
                                                       "measured": None, "exact": None}
    assert runs["late"]["state_bytes_per_rank"]["exact"] is False  # one rank counted of two
    assert runs["late"]["training_memory_per_rank"] == {"predicted": pytest.approx([TRAINING + FLAT] * 2),
                                                        "measured": [TRAINING + FLAT] * 2, "error": pytest.approx(0)}
    # an accumulating dp2 run (2 micro-batches a step), predicted from 1-device runs at 1 and 2: 0.2 s a
    # micro-batch fitted, 0.8 s of multiply-adds
    k1, k2 = {**one, "step_time_s": {"p50": 1.0}}, {**_record("k2", 1, 32, accumulation=2), "device_kind": "cuda",
                                                    "step_time_s": {"p50": 1.2}}
    accumulating = {**_record("acc", 2, 64, accumulation=2), "device_kind": "cuda", "step_time_s": {"p50": 2.0}}
    [row] = validate([k1, k2, accumulating], H100)["runs"]
    assert row["references"] == ["one", "k2"] and row["step_parts_s"]["compute"] == pytest.approx(1.2)
    # a CNN: its own model (2.3M parameters all-reduced)
    cnn_one = {**one, "workload": "cnn", "memory": None}
    cnn = {**_record("cnn2", 2, 64), "workload": "cnn", "device_kind": "cuda", "step_time_s": {"p50": 1.0}}
    [row] = validate([cnn_one, cnn], H100)["runs"]
    node = H100.link(False)  # no link probe in that folder: the description's
    assert row["step_s"]["predicted"] == pytest.approx(1.0 + 4 * 2_328_298 / (node.busbw_GBps * 1e9) +
                                                       2 * node.latency_s)
    assert result["summary"]["all"]["memory_per_rank"]["runs"] >= 1
    empty = validate([cnn_one, cnn], H100)["summary"]["all"]["memory_per_rank"]
    assert empty == {"runs": 0, "median_abs_error": None, "max_abs_error": None}


def test_load_on_a_cpu_host_is_accounted_or_not_as_asked():
    cpu = hardware_files.load("cpu-loopback-2core")
    host = {"name": "h", "cores": 2}
    one = {**_record("one", 1, 32), "load": {"other_busy_cores": 0.0}, "host": host}
    dp2 = {**_record("dp2", 2, 64), "load": {"other_busy_cores": 1.0}, "host": host}
    [row] = validate([one, dp2], cpu)["runs"]
    assert row["step_s"]["error"] != row["step_s"]["error_ignoring_load"]
    assert row["load"] == {"background_run": 1.0, "background_reference": 0.0, "accounted": True}
    [plain] = validate([one, dp2], cpu, account_load=False)["runs"]
    assert plain["step_s"]["error"] == plain["step_s"]["error_ignoring_load"] == row["step_s"]["error_ignoring_load"]
    assert plain["load"]["accounted"] is False
    summary = validate([one, dp2], cpu)["summary"]["all"]
    assert summary["step_s_ignoring_load"]["runs"] == 1 and summary["step_s_ignoring_load"]["max_abs_error"] == \
        pytest.approx(abs(row["step_s"]["error_ignoring_load"]))


def test_rank_0_s_collectives_of_one_kind_add_up_and_a_rank_0_that_counted_none_is_no_check():
    one = {**_record("one", 1, 32), "device_kind": "cuda"}
    pipe = {**_record("pipe", 4, 32), "device_kind": "cuda", "layout": {"dp": 2, "pp": 2, "micro_batches": 2}}
    pipe["backend_metrics"] = {"comm_per_step": [{"all_reduce": {"bytes": 1, "calls": 2, "time_s": 0.1}}] + [None] * 3}
    silent = {**_record("silent", 2, 64), "device_kind": "cuda"}
    silent["backend_metrics"] = {"comm_per_step": [None, {"all_reduce": {"bytes": 1, "calls": 1, "time_s": 0.1}}]}
    runs = {r["run_id"]: r for r in validate([one, pipe, silent], H100)["runs"]}
    # Stage 0 of dp2 x pp2 all-reduces the tied embedding's float32 gradient (vocabulary x 128) with the last
    # stage, then its own float32 gradients with its dp peer: the embeddings (33,282 + 128 + 2 rows of 128, a
    # LayerNorm) and one encoder layer (198,272), 4,475,264 parameters. Micro-batches of 32 / (2 x 2) = 8: 8 x 128
    # x 128 float32 activations sent forward and their gradients received back, per micro-batch.
    assert runs["pipe"]["comm_per_step"] == {
        "all_reduce": {"predicted": {"bytes": 4 * TINY.vocab_size * 128 + 4 * 4_475_264, "calls": 2},
                       "measured": {"bytes": 1, "calls": 2}},
        "send_recv": {"predicted": {"bytes": 4 * 4 * 8 * 128 * 128, "calls": 4}, "measured": None}}
    assert TINY.vocab_size == 33_282 and runs["silent"]["comm_per_step"] is None


def test_a_compiled_step_s_own_collectives_and_the_stage_split_reach_both_predictions():
    """The prediction and the one ignoring load (step_s.error_ignoring_load) are of the same step: on a GPU host,
    where there is no load to account, the two agree."""
    one, dp2 = _known_folder()[1:]
    keras_one = {**one, "run_id": "k-one", "backend": "keras_jax"}
    # XLA compiled one all-reduce of twice the flat gradients (bytes over 2 GB/s, as the formula's FLAT in _by_hand)
    keras = {**dp2, "run_id": "k-dp2", "backend": "keras_jax", "backend_metrics": {
        **dp2["backend_metrics"], "comm_per_step": [{"all_reduce": {"bytes": 2 * FLAT, "calls": 1, "time_s": None}},
                                                    None]}}
    [row] = validate([keras_one, keras], H100)["runs"]
    assert row["step_s"]["predicted"] == pytest.approx(_by_hand(2) + FLAT / (LINK_GBPS * 1e9), rel=1e-12)
    assert row["step_s"]["error_ignoring_load"] == row["step_s"]["error"]
    # mini (4 layers) cut 3 + 1 by torch_3d's auto split, as its record says (layers_per_stage; the model itself
    # places only even and explicit splits): the last stage holds the MLM head (a projection onto 33,282 words),
    # so moving a layer off it shortens the slower stage: a shorter step than the even cut, with or without load
    mini_one = {**one, "config": {**one["config"], "model_size": "mini"}}
    cut = {**dp2, "run_id": "cut", "global_batch": 32, "config": {**dp2["config"], "model_size": "mini"},
           "layout": {"dp": 1, "pp": 2, "micro_batches": 4, "stage_split": "auto", "layers_per_stage": [3, 1]}}
    [row] = validate([mini_one, cut], H100)["runs"]
    [even] = validate([mini_one, {**cut, "layout": {"dp": 1, "pp": 2, "micro_batches": 4}}], H100)["runs"]
    assert row["step_s"]["predicted"] < even["step_s"]["predicted"]
    assert row["step_s"]["error_ignoring_load"] == row["step_s"]["error"]


def test_what_a_record_leaves_out_is_its_default():
    one, dp2 = _known_folder()[1:]
    [row] = validate([one, dp2], H100)["runs"]
    # no model size: the tiny model (the only one before --model-size); no grad_accum: one micro-batch a step
    unsized = [{**r, "config": {k: v for k, v in r["config"].items() if k not in ("model_size", "grad_accum")}}
               for r in (one, dp2)]
    [bare] = validate(unsized, H100)["runs"]
    assert (bare["step_s"], bare["memory_per_rank"], bare["training_memory_per_rank"]) == \
        (row["step_s"], row["memory_per_rank"], row["training_memory_per_rank"])
    # a run with --skip-eval holds no evaluation: 256 samples' logits at once are more than training's 32
    [skipped] = validate([one, {**dp2, "config": {**dp2["config"], "skip_eval": True}}], H100)["runs"]
    assert all(s < e for s, e in zip(skipped["memory_per_rank"]["predicted"], row["memory_per_rank"]["predicted"]))


def test_the_other_references_are_of_the_main_run_s_batch_and_execution():
    run = _record("run", 2, 64)
    # another batch at an accumulation not yet seen is no reference of the per-micro-batch cost
    assert [r["run_id"] for r in references(run, [_record("k1", 1, 64), _record("b32k2", 1, 32, accumulation=2)])] \
        == ["k1"]
    # nor is the same batch at another accumulation with --recompute (another execution)
    recomputed = {**_record("rc2", 1, 64, accumulation=2), "layout": {"dp": 1, "recompute": True}}
    assert [r["run_id"] for r in references(run, [_record("k1", 1, 64), recomputed])] == ["k1"]


def test_each_configuration_names_its_key_and_the_quiet_ones_are_summarised_apart():
    from common.config_key import config_key
    from common.predict.validation import _memory

    dp4, one, dp2 = _known_folder()
    result = validate([{**dp4, "oversubscribed": True}, one, dp2], H100)
    by_layout = {c["layout"]: c for c in result["configurations"]}
    assert by_layout["dp2"]["config_key"] == config_key(dp2).id and by_layout["dp4"]["oversubscribed"]
    # dp2 alone is quiet: its -0.2, once; dp4's 0 counts among all only
    assert result["summary"]["configurations"]["not_oversubscribed"] == {
        "step_s": {"runs": 1, "median_abs_error": pytest.approx(0.2), "max_abs_error": pytest.approx(0.2)},
        "most_repeats": 1}
    assert result["summary"]["configurations"]["all"]["step_s"]["runs"] == 2
    every = validate([{**dp4, "oversubscribed": True}, one, {**dp2, "oversubscribed": True}], H100)
    assert every["summary"]["configurations"]["not_oversubscribed"] == {
        "step_s": {"runs": 0, "median_abs_error": None, "max_abs_error": None}, "most_repeats": 0}
    # a 1-device run on another kind of device is no reference, however alike the rest
    assert references(dp2, [{**one, "device_kind": "cpu"}]) == []
    # kinds a probe timed apart, each named in the note
    links = {2: {"all_reduce": 1.5, "all_gather": 0.7, "reduce_scatter": 0.9}}
    assert hardware_for(dp2, H100, links)[1] == "link: probe at 2 ranks, 1.5 GB/s busbw, all_gather 0.7, " \
                                                "reduce_scatter 0.9"
    # one process a device: each rank's own prediction against its own measurement, not regathered
    assert _memory([12.0, 20.0], 2, [10.0, 25.0], [1.0, 1.0], 5.0) == {
        "predicted": [10.0, 25.0], "measured": [12.0, 20.0], "error": 0.25}
    assert _memory([12.0], 2, [10.0, 25.0], [1.0, 1.0], 5.0) == {
        "predicted": [7.0], "measured": [12.0], "error": pytest.approx(-5 / 12)}
