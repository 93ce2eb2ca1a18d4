"""Parity across backends: shared initial weights, measured sample-id digests, and bench.parity end to end.

The end-to-end test is the point: CI runs `bench.parity` on synthetic data with every backend, so
a change that makes one framework run a different experiment fails here.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from bench import parity_checks as pc
from bench.parity_checks import cross_backend_checks, data_parallel_checks
from common.data.batches import TrainBatches
from common.data.datasets import SplitData
from common.initial_weights import initial_weights, layout, trainable_count
from common.loop import SampleDigests, _merge_digests
from common.spec import BERT_SIZES, CNN
from tests.conftest import run_cli

TINY = BERT_SIZES["tiny"]


@pytest.mark.parametrize("spec", [CNN, *BERT_SIZES.values()], ids=lambda s: getattr(s, "name", "cnn"))
def test_initial_weights_layout_counts_the_spec_parameters(spec):
    assert trainable_count(spec) == spec.param_count()


def test_initial_weights_depend_on_the_seed_only():
    a, b, c = initial_weights(CNN, 0), initial_weights(CNN, 0), initial_weights(CNN, 1)
    assert [t.name for t in layout(CNN)] == list(a)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["conv0.weight"], c["conv0.weight"])
    bound = (9 * 16) ** -0.5  # conv1: torch's U(+-1/sqrt(fan_in)), fan_in = 16 channels x 3 x 3
    assert np.abs(a["conv1.weight"]).max() <= bound and a["conv1.weight"].std() == pytest.approx(bound / 3**0.5, 0.05)
    token = initial_weights(TINY, 0)["embeddings.token"]
    assert token.dtype == np.float32 and np.abs(token).max() <= 2 * TINY.init_stddev
    assert token.std() == pytest.approx(0.88 * TINY.init_stddev, rel=0.02)  # a normal cut at 2 std


def test_a_perturbation_moves_trainable_tensors_by_its_relative_size_only():
    base = initial_weights(CNN, 0)
    one, again, other = (initial_weights(CNN, 0, 1e-3, k) for k in (1, 1, 2))
    assert all(np.array_equal(one[k], again[k]) for k in one)
    ratio = one["fc0.weight"] / base["fc0.weight"] - 1
    assert abs(ratio.mean()) < 1e-5 and ratio.std() == pytest.approx(1e-3, rel=0.01)
    assert not np.array_equal(one["fc0.weight"], other["fc0.weight"])
    # BatchNorm's running statistics are state, not weights: never perturbed.
    assert np.array_equal(one["bn0.moving_var"], base["bn0.moving_var"])
    assert all(np.array_equal(initial_weights(CNN, 0, 0.0, 5)[k], base[k]) for k in base)


def test_torch_loader_takes_every_tensor_and_rejects_gaps():
    from backends.torch_common import weights as torch_weights
    from backends.torch_common.models import build_model
    weights = initial_weights(TINY, 0)
    model = torch_weights.initialised_model("mlm", TINY, weights)
    np.testing.assert_array_equal(model.layers[1].attention.key.weight.detach().numpy(),
                                  weights["layers.1.attention.key.weight"])
    with pytest.raises(RuntimeError, match="unassigned"):
        torch_weights.load_initial_weights(build_model("mlm", TINY), {k: v for k, v in weights.items()
                                                                      if k != "head.bias"})
    with pytest.raises(RuntimeError, match="shape"):
        torch_weights.load_initial_weights(build_model("mlm", TINY), {**weights, "head.bias": weights["head.bias"][:9]})


def _small_split() -> SplitData:
    rng = np.random.default_rng(0)
    return SplitData("cnn", "train", True, {"image": rng.integers(0, 255, (96, 28, 28), np.uint8),
                                            "label": rng.integers(0, 10, 96).astype(np.uint8)})


def test_loop_digests_are_the_ids_each_device_trained_on():
    """Two ranks, and one process driving two devices, hash the same ids per device as the dealt
    epoch order; one device sees the same samples in another grouping, so its digest differs."""
    data = _small_split()
    ranks = [TrainBatches(data, CNN, 0, 4, 2, r, micro_batches=2) for r in range(2)]
    local = TrainBatches(data, CNN, 0, 8, 1, 0, micro_batches=2, local_devices=2)
    one = TrainBatches(data, CNN, 0, 8, 1, 0, micro_batches=2)
    measured = []
    for source in (ranks[0], ranks[1], local, one):
        digests = SampleDigests()
        for step in range(source.steps_per_epoch * 2):
            digests.add(source.get(step))
        measured.append({"sample_digests": digests.hex()})
    two_ranks = _merge_digests(measured[:2])
    assert two_ranks == _merge_digests([measured[2]])
    assert two_ranks["1"] == [ranks[0].epoch_digest(1), ranks[1].epoch_digest(1)]
    assert two_ranks["0"] != two_ranks["1"]
    assert measured[3]["sample_digests"]["0"] == [one.epoch_digest(0)]


def _record(loss_curve, params=100, digest="d"):
    return {"status": "ok", "params": params, "flops_per_sample": 6, "sample_digests": {"0": [digest]},
            "loss": {"curve": [[i + 1, v] for i, v in enumerate(loss_curve)]}}


def test_checks_catch_a_backend_that_differs():
    same = {"a": _record([2.0, 1.5]), "b": _record([2.0, 1.5 * (1 + 1e-7)])}
    assert {c.status for c in cross_backend_checks("cnn", 100, 6, same, {})} == {"pass", "skip"}
    off = {"a": _record([2.0, 1.5]), "b": _record([2.001, 1.5], params=99, digest="e")}
    failed = {c.name for c in cross_backend_checks("cnn", 100, 6, off, {}) if c.status == "fail"}
    assert failed == {"parameter count", "sample ids per device, N=1", "loss at step 0", "loss over 2 steps"}
    unsupported = {"status": "unsupported", "error": "no CUDA"}
    dp = data_parallel_checks("cnn", same, {"a": _record([2.0, 1.5]), "b": unsupported})
    assert [c.status for c in dp] == ["pass", "skip"] and "no CUDA" in dp[1].detail


def test_curve_tolerance_is_the_references_own_sensitivity():
    reference = [2.0, 1.8, 1.6, 1.4]
    # Probes that stay at rounding keep the tolerance at ROUNDING_RTOL: a steady 4e-5 drift fails.
    calm = pc.sensitivity(reference, [[2.0, 1.8 * (1 + 2e-6), 1.6, 1.4], [2.0, 1.8, 1.6 * (1 - 3e-6), 1.4]])
    assert calm == [0.0, pytest.approx(2e-6), pytest.approx(3e-6), pytest.approx(3e-6)]
    assert pc.tolerances(calm) == [pc.ROUNDING_RTOL] * 4
    drift = {"ref": _record(reference), "b": _record([2.0, 1.8 * (1 + 4e-5), 1.6 * (1 + 4e-5), 1.4])}
    curve = [c for c in cross_backend_checks("cnn", 100, 6, drift, {}, "ref", calm) if c.name == "loss over 4 steps"]
    assert curve[0].status == "fail" and "b 4.0e-05 at step 1" in curve[0].detail
    # A probe that flipped at step 2 widens the tolerance from step 2 on, to twice its deviation, not before.
    flipped = pc.sensitivity(reference, [[2.0, 1.8, 1.6 * 1.01, 1.4 * 0.99]])
    assert pc.tolerances(flipped) == [pc.ROUNDING_RTOL, pc.ROUNDING_RTOL, pytest.approx(0.02), pytest.approx(0.02)]
    late = {"ref": _record(reference), "b": _record([2.0, 1.8, 1.6 * 1.015, 1.4 * 1.019])}
    early = {"ref": _record(reference), "b": _record([2.0, 1.8 * 1.001, 1.6, 1.4])}
    status = {name: [c.status for c in cross_backend_checks("cnn", 100, 6, runs, {}, "ref", flipped)
                     if c.name == "loss over 4 steps"][0] for name, runs in (("late", late), ("early", early))}
    assert status == {"late": "pass", "early": "fail"}


def test_a_probe_that_did_not_run_fails_parity():
    assert pc.probe_check("cnn", "ref", [{"status": "ok", "loss": {"curve": [[1, 2.0]]}}]).status == "pass"
    broken = pc.probe_check("cnn", "ref", [{"run_id": "p1", "status": "failed", "error": "boom"}])
    assert broken.status == "fail" and "boom" in broken.detail
    assert pc.probe_check("cnn", None, []).status == "skip"


def test_auto_probes_run_only_where_a_check_needs_more_than_rounding(monkeypatch):
    """--probes auto: curves within ROUNDING_RTOL hold whatever the probes would measure (a tolerance is never
    below it), so the perturbed runs are made only when a curve is further off, and then held to."""
    from argparse import Namespace

    from bench import parity
    made = []

    def probes(args, backend, workload, stamp, console, grad_accum=None):
        made.append(backend)
        return [_record([2.0, 1.5, 1.2 * (1 + k * 3e-5)]) for k in (1, 2)]  # the reference's own drift: 6e-5
    monkeypatch.setattr(parity, "_probes", probes)
    unsupported = {"status": "unsupported", "error": "no CUDA"}

    def parity_of(b_curve, mode="auto", queued=()):
        one = {"a": _record([2.0, 1.5, 1.2]), "b": _record(b_curve)}
        two = {"a": unsupported, "b": _record(b_curve)}
        return parity.data_parallel_parity(Namespace(probes=mode, backends=["a", "b"]), "cnn", one, two,
                                           list(queued), "stamp", None)

    def status(checks, name):
        return next(c for c in checks if c.name == name).status

    checks, used = parity_of([2.0, 1.5 * (1 + 4e-6), 1.2])
    assert made == [] and used == [] and status(checks, "loss over 3 steps") == "pass"
    sensitivity = next(c for c in checks if c.name == "reference's own sensitivity")
    assert sensitivity.status == "skip" and "within rounding (1e-05) of a's" in sensitivity.detail
    # 4e-5 at the last step: past rounding, within twice the probes' 6e-5
    checks, used = parity_of([2.0, 1.5, 1.2 * (1 + 4e-5)])
    assert made == ["a"] and len(used) == 2 and status(checks, "loss over 3 steps") == "pass"
    assert status(checks, "reference's own sensitivity") == "pass"
    # ... and 2e-4 is past that too: measured, and still a failure
    checks, _ = parity_of([2.0, 1.5, 1.2 * (1 + 2e-4)])
    assert made == ["a", "a"] and status(checks, "loss over 3 steps") == "fail"
    # always: the probes queued beside the runs are the ones used, whatever the curves
    queued = [_record([2.0, 1.5, 1.2])]
    checks, used = parity_of([2.0, 1.5, 1.2], "always", queued)
    assert made == ["a", "a"] and used == queued and status(checks, "reference's own sensitivity") == "pass"


def test_a_failure_no_tolerance_can_pass_asks_for_no_probe():
    checks = [pc.Check("cnn", "parameter count", "fail", "differ"), pc.Check("cnn", "loss at step 0", "fail", "x")]
    assert not pc.needs_sensitivity(checks)
    held = [pc.Check("cnn", "loss over 3 steps", "pass", "", {"tolerance_per_step": [1e-5] * 3})]
    assert not pc.needs_sensitivity(held)
    assert pc.needs_sensitivity([pc.Check("cnn", "x: final parameters = 1 device", "fail", "", {"tolerance": 1e-5})])


# 20 bench.run processes (5 backends x 2 workloads x N = 1, 2; the reference's 6 perturbed runs per workload only
# where a curve is off by more than rounding): ~3 min on a 2-core machine (--jobs 2), ~15 min on one shared four
# ways; the limit is for the second.
@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_bench_parity_holds_on_synthetic_data(tmp_path, data_dir):
    out = tmp_path / "parity"
    # --jobs 2: parity compares numbers, not speed, so two runs may share the two cores.
    proc = run_cli("bench.parity", "--data", "synthetic", "--steps", "6", "--jobs", "2", "--out", str(out),
                   timeout=1750)
    report = json.loads((out / "parity.json").read_text())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == report["summary"] and "PARITY HOLDS" in report["summary"]
    checks = {(c["workload"], c["name"]): c for c in report["checks"]}
    for workload in ("cnn", "mlm"):
        assert checks[(workload, "loss at step 0")]["status"] == "pass"
        curves = checks[(workload, "loss over 6 steps")]["values"]["curves"]
        assert checks[(workload, "loss over 6 steps")]["values"]["reference"] == "torch_dp"
        worst = max([abs(a - b) / abs(b) for curve in curves.values() for a, b in zip(curve, curves["torch_dp"])] +
                    [d for c in report["checks"] if c["workload"] == workload
                     for d in c["values"].get("relative", [])])
        sensitivity = checks[(workload, "reference's own sensitivity")]
        if worst <= pc.ROUNDING_RTOL:  # as measured on this machine: every backend within 3.5e-6 of torch_dp
            assert sensitivity["status"] == "skip" and report["runs"][workload]["probes"] == []
        else:  # the reference's perturbed runs made and held to
            assert sensitivity["status"] == "pass"
            probes = [json.loads((out / "runs" / f"{run_id}.json").read_text())
                      for run_id in report["runs"][workload]["probes"]]
            assert [(p["backend"], p["config"]["init_perturbation"], p["config"]["init_perturbation_seed"])
                    for p in probes] == [("torch_dp", pc.PROBE_PERTURBATION, k) for k in pc.PROBE_SEEDS]
        assert checks[(workload, "sample ids per device, N=2")]["status"] == "pass"
        assert set(checks[(workload, "loss at step 0")]["values"]["losses"]) == {
            "torch_dp", "torch_ddp", "tf_mirrored", "mindspore_auto", "keras_jax"}
        assert checks[(workload, "torch_ddp: 2 devices = 1 device x 2 micro-batches")]["status"] == "pass"
        assert checks[(workload, "tf_mirrored: 2 devices = 1 device x 2 micro-batches")]["status"] == "pass"
        assert checks[(workload, "mindspore_auto: 2 devices = 1 device x 2 micro-batches")]["status"] == "pass"
        assert checks[(workload, "keras_jax: 2 devices = 1 device x 2 micro-batches")]["status"] == "pass"
        # DataParallel needs CUDA for 2 devices: reported as skipped with the reason, never as passed.
        dp = checks[(workload, "torch_dp: 2 devices = 1 device x 2 micro-batches")]
        assert dp["status"] == "skip" and "CUDA" in dp["detail"]


# ----------------------------------------------------------------------------- every field of every check
# The checks are what bench.parity prints and writes to parity.json: each one's name, status, detail and values
# are held whole here, on curves whose deviations are worked by hand (losses below 1, so a deviation relative to
# the loss is not the absolute difference).

def _rows(checks: list[pc.Check]) -> list[tuple]:
    return [(c.workload, c.name, c.status, c.detail, c.values) for c in checks]


UNSUPPORTED = {"status": "unsupported", "error": "no CUDA"}


def test_a_check_is_written_as_its_five_fields():
    assert pc.Check("mlm", "loss at step 0", "pass", "spread 0", {"spread": 0.0}).as_dict() == {
        "workload": "mlm", "name": "loss at step 0", "status": "pass", "detail": "spread 0", "values": {"spread": 0.0}}


def test_the_summary_line_holds_only_with_a_pass_and_no_failure():
    def line(*statuses):
        return pc.summary_line([pc.Check("cnn", "x", s, "") for s in statuses])
    assert line("pass", "skip", "pass") == "bench.parity: PARITY HOLDS: 2 passed, 0 failed, 1 skipped"
    assert line("pass", "fail", "skip", "skip") == "bench.parity: PARITY FAILS: 1 passed, 1 failed, 2 skipped"
    # Nothing passed is no parity, however little failed.
    assert line("skip", "skip") == "bench.parity: PARITY FAILS: 0 passed, 0 failed, 2 skipped"
    assert line() == "bench.parity: PARITY FAILS: 0 passed, 0 failed, 0 skipped"


def test_cross_backend_checks_of_two_backends_that_agree():
    # b: step 0 off by 2e-6 absolute (4e-6 of 0.5), step 1 by 8e-6 of 0.25; a's 2-device run is unsupported.
    one = {"a": _record([0.5, 0.25]), "b": _record([0.500002, 0.25 * (1 + 8e-6)])}
    two = {"a": UNSUPPORTED, "b": _record([0.5, 0.25]), "c": {}}
    checks = cross_backend_checks("cnn", 100, 6, one, two)
    digest = {"0": ["d"]}
    assert _rows(checks[:4]) == [
        ("cnn", "parameter count", "pass", "spec 100: equal across a, b", {"a": 100, "b": 100}),
        ("cnn", "FLOPs per sample", "pass", "analytical 6: equal across a, b", {"a": 6, "b": 6}),
        ("cnn", "sample ids per device, N=1", "pass",
         "SHA-256 per epoch and device of the ids each device trained on: equal across a, b",
         {"a": digest, "b": digest}),
        ("cnn", "sample ids per device, N=2", "skip",
         "fewer than two backends ran (b) (not run: a unsupported: no CUDA)", {"b": digest})]
    step0, curve = checks[4:]
    assert (step0.workload, step0.name, step0.status, step0.detail) == (
        "cnn", "loss at step 0", "pass", "spread 4.0e-06 (tolerance 1e-04 relative)")
    assert step0.values == {"losses": {"a": 0.5, "b": 0.500002}, "spread": pytest.approx(2e-6 / 0.500001)}
    assert (curve.workload, curve.name, curve.status, curve.detail) == (
        "cnn", "loss over 2 steps", "pass", "largest deviation from a: b 8.0e-06 at step 1 (tolerance there 1.0e-05)")
    assert curve.values == {"reference": "a", "curves": {"a": [0.5, 0.25], "b": [0.500002, 0.25 * (1 + 8e-6)]},
                            "tolerance_per_step": [1e-5, 1e-5], "sensitivity_per_step": None}


def test_cross_backend_curves_are_held_to_the_named_reference_and_the_envelope_of_its_steps():
    # Reference b (not the first); the envelope is longer than the curves: only its first 2 steps are used.
    one = {"a": _record([0.5, 0.25 * (1 + 3e-5)]), "b": _record([0.5, 0.25]), "c": _record([0.5, 0.25, 0.2])}
    [curve] = [c for c in cross_backend_checks("cnn", 100, 6, one, {}, "b", [0.0, 2e-5, 1.0]) if "over" in c.name]
    assert (curve.name, curve.status) == ("loss over 2 steps", "fail")  # c ran 3 steps, b 2
    assert curve.detail == ("largest deviation from b: a 3.0e-05 at step 1 (tolerance there 4.0e-05); "
                            "c 0.0e+00 at step 0 (tolerance there 1.0e-05)")
    assert curve.values["reference"] == "b" and curve.values["sensitivity_per_step"] == [0.0, 2e-5]
    assert curve.values["tolerance_per_step"] == [1e-5, 4e-5]
    # A reference that did not run falls back to the first backend that did.
    assert [c for c in cross_backend_checks("cnn", 100, 6, one, {}, "z") if "over" in c.name][0].values[
        "reference"] == "a"


def test_cross_backend_step0_tolerance_is_inclusive():
    # (10000.5 - 9999.5) / 10000 is exactly 1e-4: at the tolerance, not past it.
    one = {"a": _record([9999.5]), "b": _record([10000.5])}
    [step0] = [c for c in cross_backend_checks("cnn", 100, 6, one, {}) if c.name == "loss at step 0"]
    assert step0.status == "pass" and step0.detail == "spread 1.0e-04 (tolerance 1e-04 relative)"


def test_cross_backend_parameter_counts_that_agree_with_each_other_but_not_the_spec():
    one = {"a": _record([2.0], params=99), "b": _record([2.0], params=99)}
    assert _rows(cross_backend_checks("cnn", 100, 6, one, {})[:1]) == [
        ("cnn", "parameter count", "fail", "backends agree on 99, spec says 100", {"a": 99, "b": 99})]
    differ = {"a": _record([2.0], params=99), "b": _record([2.0], params=100)}
    assert _rows(cross_backend_checks("cnn", 100, 6, differ, {})[:1]) == [
        ("cnn", "parameter count", "fail", "spec 100: differ across a, b", {"a": 99, "b": 100})]


def test_cross_backend_checks_with_one_backend_skip_and_name_what_did_not_run():
    failed = {"status": "failed", "error": "x" * 119 + "yz"}  # cut at 120 characters
    checks = cross_backend_checks("mlm", 100, 6, {"a": _record([2.0]), "b": failed}, {"c": {}})
    assert _rows(checks) == [
        ("mlm", "parameter count", "skip", "fewer than two backends ran (a)", {"a": 100}),
        ("mlm", "FLOPs per sample", "skip", "fewer than two backends ran (a)", {"a": 6}),
        ("mlm", "sample ids per device, N=1", "skip",
         "fewer than two backends ran (a) (not run: b failed: " + "x" * 119 + "y)", {"a": {"0": ["d"]}}),
        ("mlm", "sample ids per device, N=2", "skip", "fewer than two backends ran (none)", {}),
        ("mlm", "loss at step 0", "skip", "fewer than two backends ran", {}),
        ("mlm", "loss after step 0", "skip", "fewer than two backends ran", {})]
    # Two that did not run are both named, in order; one without an error says so with nothing after it.
    checks = cross_backend_checks("mlm", 100, 6, {}, {"a": failed, "b": {"status": "unsupported"}})
    assert checks[3].detail == ("fewer than two backends ran (none) (not run: a failed: " + "x" * 119 + "y; "
                                "b unsupported: )")


def test_data_parallel_checks_say_why_each_backend_passed_failed_or_was_skipped():
    name = "{}: 2 devices = 1 device x 2 micro-batches".format
    ok = _record([0.5, 0.25, 0.2])
    one = {"f": {"status": "failed", "error": "boom"}, "u": UNSUPPORTED, "m": ok, "n": ok, "e": ok, "p": ok}
    two = {"n": UNSUPPORTED, "e": {"status": "failed", "error": "oom"},
           "p": _record([0.5, 0.25 * (1 + 8e-6), 0.2])}
    checks = data_parallel_checks("cnn", one, two)
    assert _rows(checks[:5]) == [
        ("cnn", name("f"), "fail", "1-device run failed: boom", {}),
        ("cnn", name("u"), "skip", "1-device run unsupported: no CUDA", {}),
        ("cnn", name("m"), "skip", "2 devices unsupported here: None", {}),
        ("cnn", name("n"), "skip", "2 devices unsupported here: no CUDA", {}),
        ("cnn", name("e"), "fail", "2-device run failed: oom", {})]
    # The largest deviation is at step 1, not the last.
    assert _rows(checks[5:]) == [
        ("cnn", name("p"), "pass", "largest relative difference 8.0e-06 at step 1 (tolerance there 1.0e-05)",
         {"one": [0.5, 0.25, 0.2], "two": [0.5, 0.25 * (1 + 8e-6), 0.2], "relative": [0.0, pytest.approx(8e-6), 0.0],
          "tolerance_per_step": [1e-5, 1e-5, 1e-5]})]


def test_data_parallel_curves_are_held_to_the_envelope_and_to_their_length():
    one = {"a": _record([0.5, 0.25, 0.2])}
    wide = data_parallel_checks("cnn", one, {"a": _record([0.5, 0.25 * (1 + 1.5e-4), 0.2])}, [0.0, 1e-4, 1e-4])
    assert (wide[0].status, wide[0].detail) == (
        "pass", "largest relative difference 1.5e-04 at step 1 (tolerance there 2.0e-04)")
    assert wide[0].values["tolerance_per_step"] == [1e-5, 2e-4, 2e-4]
    # Within tolerance over the steps both ran, but one step short: a failure, and says so.
    short = data_parallel_checks("cnn", one, {"a": _record([0.5, 0.25 * (1 + 8e-6)])})
    assert (short[0].status, short[0].detail) == (
        "fail", "largest relative difference 8.0e-06 at step 1 (tolerance there 1.0e-05); 2 steps at N=2, 3 at N=1")
    assert short[0].values["relative"] == [0.0, pytest.approx(8e-6)]
    # The first step past its tolerance is the one reported, though a later one is further off.
    past = data_parallel_checks("cnn", one, {"a": _record([0.5, 0.25 * (1 + 3e-5), 0.2 * (1 + 1e-4)])})
    assert (past[0].status, past[0].detail) == (
        "fail", "largest relative difference 3.0e-05 at step 1 (tolerance there 1.0e-05)")


def test_a_deviation_at_its_tolerance_is_within_it():
    assert pc._worst([0.0, 1e-5, 0.0], [1e-5] * 3) == (1, 1e-5, True)
    assert pc._worst([0.0, 2e-5, 3e-5], [1e-5] * 3) == (1, 2e-5, False)
    # (100001 - 100000) / 100000 is exactly 1e-5, the rounding tolerance.
    [check] = data_parallel_checks("cnn", {"a": _record([100000.0])}, {"a": _record([100001.0])})
    assert check.status == "pass"


def test_run_status_checks_fail_a_failure_and_skip_the_rest():
    one = {"a": _record([2.0]), "b": {"status": "failed", "error": "boom"}, "c": UNSUPPORTED, "d": {}}
    assert _rows(pc.run_status_checks("mlm", one)) == [
        ("mlm", "b: runs at 1 device", "fail", "failed: boom", {}),
        ("mlm", "c: runs at 1 device", "skip", "unsupported: no CUDA", {}),
        ("mlm", "d: runs at 1 device", "skip", "None: None", {})]


def test_probe_check_says_what_was_measured_or_why_not():
    title = "reference's own sensitivity"
    assert _rows([pc.probe_check("cnn", None, [])]) == [("cnn", title, "skip", "no backend ran: nothing to probe", {})]
    assert _rows([pc.probe_check("cnn", "a", [], needed=False)]) == [
        ("cnn", title, "skip", "not measured: every curve and weight is within rounding (1e-05) of a's, a tolerance "
         "no measured sensitivity would tighten (bench.parity --probes always measures it)", {})]
    assert _rows([pc.probe_check("cnn", "a", [])]) == [
        ("cnn", title, "fail", "a with perturbed initial weights did not run: no probe; curves held to 1e-05 instead",
         {})]
    bad = [_record([2.0]), {"run_id": "p2", "status": "failed", "error": "boom"}, {"status": "unsupported"}]
    assert _rows([pc.probe_check("cnn", "a", bad)]) == [
        ("cnn", title, "fail", "a with perturbed initial weights did not run: p2 failed: boom; ? unsupported: ; "
         "curves held to 1e-05 instead", {})]
    assert _rows([pc.probe_check("mlm", "a", [_record([2.0, 1.0]), _record([2.5, 1.5])])]) == [
        ("mlm", title, "pass", "a again with initial weights x (1 + 3e-06 x N(0, 1)), 2 draws",
         {"probes": [[2.0, 1.0], [2.5, 1.5]]})]


def test_sensitivity_reads_a_short_probe_only_as_far_as_it_ran():
    # The short probe's 1% at step 1 stays in the envelope after it ends.
    assert pc.sensitivity([0.5, 0.25, 0.2], [[0.5, 0.25 * 1.01], [0.5, 0.25, 0.2 * (1 + 1e-3)]]) == [
        0.0, pytest.approx(0.01), pytest.approx(0.01)]
    assert pc.sensitivity([0.5, 0.25], [[0.5, 0.25 * (1 + 4e-3)]]) == [0.0, pytest.approx(4e-3)]


# ----------------------------------------------------------------------------- layouts, every field

def _layout_run(curve, status="ok", error=None, final=None):
    record = {"status": status, "error": error, "loss": {"curve": [[s, v] for s, v in enumerate(curve)]}}
    return record | ({"backend_metrics": {pc.FINAL_PARAMS: final}} if final else {})


# Two compared weights and one that only rounding moves (norm below common.final_params.NOISE_NORM).
WEIGHTS = {"w": {"norm": 2.0, "sum": 1.0, "size": 4}, "v": {"norm": 1.0, "sum": 0.0, "size": 1},
           "bias": {"norm": 1e-4, "sum": 0.0, "size": 4}}


def test_layout_checks_of_a_run_that_matches_its_one_device_run():
    one = [0.5, 0.25, 0.2]
    near = [0.500002, 0.25 * (1 + 8e-6), 0.2]
    # w's norm 1e5 -> 1e5 + 1: exactly 1e-5, the curve's last tolerance, so within it; v stays, and the bias (below
    # the noise norm in the reference) is not compared however far it moved.
    final = {**WEIGHTS, "w": {"norm": 100000.0, "sum": 0.0, "size": 1}}
    moved = {**final, "w": {"norm": 100001.0, "sum": 0.0, "size": 1}, "bias": {"norm": 1.0, "sum": 0, "size": 4}}
    checks = pc.layout_checks("mlm", "t tp2", _layout_run(one, final=final), _layout_run(near, final=moved))
    assert [c.workload for c in checks] == ["mlm"] * 3
    assert [(c.name, c.status, c.detail) for c in checks] == [
        ("t tp2: loss at step 0 = 1 device", "pass", "relative difference 4.0e-06 (tolerance 1e-04)"),
        ("t tp2: loss over 3 steps = 1 device", "pass",
         "largest relative difference 8.0e-06 at step 1 (tolerance there 1.0e-05)"),
        ("t tp2: final parameters = 1 device", "pass",
         "largest relative difference 1.0e-05 (w; tolerance 1.0e-05: the loss curve's at its last step, or twice the "
         "probes' weights if larger); 1 weight(s) that only rounding moves not compared")]
    assert checks[0].values == {"layout": [0.500002], "one": [0.5]}
    assert checks[1].values == {"one": one, "layout": near, "tolerance_per_step": [1e-5] * 3}
    assert checks[2].values == {"parameter": "w", "relative": 1e-5, "tolerance": 1e-5}


def test_layout_checks_against_another_framework_with_a_measured_envelope_and_weights():
    one = [0.5, 0.25, 0.2]
    run = [0.5, 0.25, 0.2 * (1 + 1.5e-4)]
    every = {k: {**v, "norm": 1.0} for k, v in WEIGHTS.items()}  # all three compared: nothing left out
    off = {**every, "v": {"norm": 1.0003, "sum": 0.0, "size": 1}}
    checks = pc.layout_checks("mlm", "k dp2", _layout_run(one, final=every), _layout_run(run, final=off),
                              [0.0, 0.0, 1e-4], against="t dp2", weights=2e-4)
    assert [(c.name, c.status, c.detail) for c in checks] == [
        ("k dp2: loss at step 0 = t dp2", "pass", "relative difference 0.0e+00 (tolerance 1e-04)"),
        ("k dp2: loss over 3 steps = t dp2", "pass",
         "largest relative difference 1.5e-04 at step 2 (tolerance there 2.0e-04)"),
        ("k dp2: final parameters = t dp2", "pass",
         "largest relative difference 3.0e-04 (v; tolerance 4.0e-04: the loss curve's at its last step, or twice the "
         "probes' weights if larger)")]
    # Twice the probes' weights below the curve's last tolerance: the curve's is kept.
    kept = pc.layout_checks("mlm", "k dp2", _layout_run(one, final=every), _layout_run(run, final=off),
                            [0.0, 0.0, 1e-4], against="t dp2", weights=1e-5)
    assert (kept[2].status, kept[2].values["tolerance"]) == ("fail", 2e-4)


def test_layout_checks_fail_a_short_curve_a_step0_jump_and_other_parameters():
    one = [10000.0, 0.25, 0.2]
    # Step 0 off by exactly 1e-4 of 10000: at its tolerance; a step short.
    checks = pc.layout_checks("mlm", "t pp2", _layout_run(one, final={"w": WEIGHTS["w"]}),
                              _layout_run([10001.0, 0.25], final={"w": WEIGHTS["w"], "u": WEIGHTS["v"]}))
    assert [(c.name, c.status, c.detail) for c in checks] == [
        ("t pp2: loss at step 0 = 1 device", "pass", "relative difference 1.0e-04 (tolerance 1e-04)"),
        ("t pp2: loss over 2 steps = 1 device", "fail",
         "largest relative difference 1.0e-04 at step 0 (tolerance there 1.0e-05); "
         "2 steps in the layout run, 3 in the 1 device run"),
        ("t pp2: final parameters = 1 device", "fail", "different parameters: u")]
    jump = pc.layout_checks("mlm", "t pp2", _layout_run(one), _layout_run([10001.5, 0.25, 0.2]))
    assert (jump[0].status, jump[0].detail) == ("fail", "relative difference 1.5e-04 (tolerance 1e-04)")
    # Names on either side only are listed, sorted, the first four.
    many = {n: WEIGHTS["v"] for n in "abcdef"}
    [*_, diff] = pc.layout_checks("mlm", "t pp2", _layout_run(one, final={"a": WEIGHTS["v"], "z": WEIGHTS["v"]}),
                                  _layout_run(one, final=many))
    assert _rows([diff]) == [("mlm", "t pp2: final parameters = 1 device", "fail", "different parameters: b, c, d, e",
                              {})]
    # Without the probes' weights the final parameters are held to the curve's tolerance at its last step.
    off = {**WEIGHTS, "v": {"norm": 1.00015, "sum": 0.0, "size": 1}}
    [*_, last] = pc.layout_checks("mlm", "t pp2", _layout_run(one, final=WEIGHTS), _layout_run(one, final=off),
                                  [0.0, 0.0, 1e-4])
    assert (last.status, last.values["tolerance"]) == ("pass", 2e-4)


def test_layout_checks_say_which_run_carries_no_final_parameters():
    one = [0.5, 0.25]
    skip = "carr{} no `backend_metrics.final_params` (per-parameter norm and sum of the unsharded weights): " \
           "nothing to compare".format

    def final_check(reference, run, against="1 device"):
        return pc.layout_checks("lm", "t dp2", _layout_run(one, final=reference), _layout_run(one, final=run),
                                against=against)[2]
    assert _rows([final_check(None, None)]) == [
        ("lm", "t dp2: final parameters = 1 device", "skip", "the layout run and the 1 device run " + skip("y"), {})]
    assert final_check(WEIGHTS, None).detail == "the layout run " + skip("ies")
    assert final_check(None, WEIGHTS, "t tp2").detail == "the t tp2 run " + skip("ies")


def test_layout_checks_of_a_run_that_did_not_run_or_has_no_curve():
    one = _layout_run([0.5])
    assert _rows(pc.layout_checks("lm", "t tp2", {"status": "failed", "error": "died"}, one)) == [
        ("lm", "t tp2: runs", "fail", "1 device run failed: died", {})]
    assert _rows(pc.layout_checks("lm", "t tp2", {"status": "unsupported", "error": "no"}, one, against="k")) == [
        ("lm", "t tp2: runs", "skip", "k run unsupported: no", {})]
    assert _rows(pc.layout_checks("lm", "t tp2", one, {"status": "failed", "error": "rank 3"})) == [
        ("lm", "t tp2: runs", "fail", "failed: rank 3", {})]
    assert _rows(pc.layout_checks("lm", "t tp2", one, {"status": "unsupported", "error": "no split"})) == [
        ("lm", "t tp2: runs", "skip", "unsupported: no split", {})]
    assert _rows(pc.layout_checks("lm", "t tp2", one, _layout_run([]))) == [
        ("lm", "t tp2: runs", "fail", "no loss curve in the layout run", {})]
    assert _rows(pc.layout_checks("lm", "t tp2", _layout_run([]), one, against="k")) == [
        ("lm", "t tp2: runs", "fail", "no loss curve in the k run", {})]


def test_weights_sensitivity_is_the_largest_probe_deviation_over_compared_weights():
    ref = _layout_run([0.5], final=WEIGHTS)
    # w's norm 2 -> 2.002 (1e-3) in one probe, v's 1 -> 1.0005 in the other; the bias (not compared) moves by 10x.
    first = {**WEIGHTS, "w": {"norm": 2.002, "sum": 1.0, "size": 4}, "bias": {"norm": 1e-3, "sum": 0.0, "size": 4}}
    second = {"w": WEIGHTS["w"], "v": {"norm": 1.0005, "sum": 0.0, "size": 1}}  # lacks the bias: not read
    assert pc.weights_sensitivity(ref, [_layout_run([0.5], final=first), _layout_run([0.5], final=second)]) == \
        pytest.approx(1e-3)
    # A weight a probe lacks is not compared; no probes, or a reference without weights, measure nothing.
    assert pc.weights_sensitivity(ref, [_layout_run([0.5], final={"v": {"norm": 1.0005, "sum": 0.0, "size": 1}})]) \
        == pytest.approx(5e-4)
    assert pc.weights_sensitivity(ref, []) is None
    assert pc.weights_sensitivity(_layout_run([0.5]), [_layout_run([0.5], final=WEIGHTS)]) is None
