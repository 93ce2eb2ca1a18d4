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
