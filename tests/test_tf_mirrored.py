"""tf_mirrored: replica feeding, 2-replica == 1-replica steps, parameter counts, end-to-end records.

The in-process tests share one TensorFlow context with two virtual CPU devices, declared at import,
before anything initialises TensorFlow (its devices cannot change afterwards).
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from backends.tf_mirrored.devices import configure_devices  # noqa: E402
from backends.tf_mirrored.matmul import time_matmul  # noqa: E402

DEVICES = configure_devices("cpu", 2, 1, 2)

import keras  # noqa: E402

from backends.keras_common.models import build_model, trainable_param_count  # noqa: E402
from backends.tf_mirrored.data import ReplicaBatches  # noqa: E402
from backends.tf_mirrored.strategy import build_strategy  # noqa: E402
from backends.tf_mirrored.trainer import KerasTrainer, agree_on_overflow  # noqa: E402
from common.config import RunConfig  # noqa: E402
from common.data.batches import TrainBatches  # noqa: E402
from common.data.datasets import TRAIN_SPLIT, load_split  # noqa: E402
from common.results import validate_record  # noqa: E402
from common.spec import model_spec  # noqa: E402
from tests.conftest import assert_profiled, assert_tensorboard_log_is_the_record, run_cli  # noqa: E402


def _config(workload: str, devices: int, per_device_batch: int, grad_accum: int) -> RunConfig:
    return RunConfig(run_id="test", backend="tf_mirrored", workload=workload, devices=devices, device_kind="cpu",
                     threads_per_device=1, scaling="strong", batch_size=per_device_batch * devices * grad_accum,
                     per_device_batch=per_device_batch, grad_accum=grad_accum, data="real", data_dir="",
                     seed=0, total_steps=2, warmup_steps=0, out="")


def _feed(data, workload: str, strategy, replicas: int, per_device_batch: int, grad_accum: int) -> ReplicaBatches:
    spec = model_spec(workload)
    batches = TrainBatches(data, spec, 0, per_device_batch * replicas, 1, 0, grad_accum)
    return ReplicaBatches(batches, strategy, replicas, total_steps=4)


@pytest.mark.parametrize("workload,grad_accum", [("cnn", 2), ("mlm", 1)])
def test_replica_r_gets_rank_r_slice(data_dir: Path, workload: str, grad_accum: int):
    spec = model_spec(workload)
    data = load_split(workload, TRAIN_SPLIT, "real", data_dir, spec, 0)
    strategy = build_strategy("mirrored", DEVICES, "RING", 60)
    feed = _feed(data, workload, strategy, 2, 4, grad_accum)
    ranks = [TrainBatches(data, spec, 0, 4, 2, r, grad_accum) for r in range(2)]
    key, model_key = ("image", "image") if workload == "cnn" else ("input_ids", "token_ids")
    try:
        for step in (0, 1, 3):
            got = feed.get(step)
            assert got.denominator == ranks[0].get(step).denominator
            for k, micro in enumerate(got.micro):
                for r, value in enumerate(strategy.experimental_local_results(micro)):
                    np.testing.assert_array_equal(value[model_key].numpy(), ranks[r].get(step).micro[k][key])
    finally:
        feed.close()


def _train(workload: str, data, devices: list[str], grad_accum: int, weights, steps: int = 2, compile: str = "",
           trained: list | None = None, precision: str = "fp32", alter=None):
    """`steps` optimizer steps of a global batch of 8 on len(devices) replicas; returns the
    trainable weights before and after, and the losses (and appends the trainer to `trained`). `alter(step,
    batch)`: the batch each step trains on instead of the feed's."""
    replicas = len(devices)
    per_device = 8 // (replicas * grad_accum)
    strategy = build_strategy("mirrored", devices, "RING", 60)
    with strategy.scope():
        model = build_model(workload, model_spec(workload))
    model.set_weights(weights)
    before = [w.numpy() for w in model.trainable_weights]
    cfg = _config(workload, replicas, per_device, grad_accum)
    cfg.compile, cfg.warmup_steps, cfg.precision = compile, 1, precision
    trainer = KerasTrainer(strategy, model, cfg, "cpu")
    if trained is not None:
        trained.append(trainer)
    feed = _feed(data, workload, strategy, replicas, per_device, grad_accum)
    try:
        losses = [trainer.train_step((alter or (lambda _, b: b))(step, feed.get(step)), 1e-3) for step in range(steps)]
    finally:
        feed.close()
    return before, [w.numpy() for w in model.trainable_weights], losses


@pytest.fixture(scope="module")
def two_replica_steps(data_dir: Path):
    """Per workload, made once for the tests that start from it: (training split, initial weights of seed 0,
    _train's result on two replicas), the plain steps every variant here is held to."""
    made = {}

    def steps(workload: str):
        if workload not in made:
            spec = model_spec(workload)
            data = load_split(workload, TRAIN_SPLIT, "real", data_dir, spec, 0)
            keras.utils.set_random_seed(0)
            initial = build_model(workload, spec).get_weights()
            trained = []
            made[workload] = data, initial, _train(workload, data, DEVICES, 1, initial, trained=trained), trained[0]
        return made[workload]
    return steps


# The CNN only: the MLM's two replicas against one are bench.parity's "tf_mirrored: 2 devices = 1 device x 2
# micro-batches" (tests/test_parity.py, its loss curve within float32 rounding), and one replica traced apart
# took 20-50 s of the suite. The CNN's BatchNorm statistics per replica are what this test alone holds.
@pytest.mark.e2e
@pytest.mark.parametrize("workload", ["cnn"])
def test_two_replicas_equal_one_replica(two_replica_steps, workload: str):
    """Two replicas of 4 samples == one replica of the same 8 samples, after two AdamW steps.

    cnn: BatchNorm normalises with each replica's own statistics, so the single replica takes the
    same 8 samples as 2 micro-batches of 4 (grad_accum 2): the same statistics, the same gradient
    (the moving statistics, updated once per micro-batch there, are not compared).
    Tolerance: the gradients agree to float32 rounding (partial sums added in another order), but
    Adam divides by sqrt(v), so a component whose gradient is ~0 can move by up to lr on one side
    and not on the other; hence a tight bound on the bulk (99.9% of values within 1e-6) and a
    bound of 2 x lr x steps on every value.
    """
    data, initial, (before, two, losses_two), _ = two_replica_steps(workload)
    _, one, losses_one = _train(workload, data, DEVICES[:1], 2 if workload == "cnn" else 1, initial)
    np.testing.assert_allclose(losses_two, losses_one, rtol=1e-5)
    diffs = np.concatenate([np.abs(a - b).ravel() for a, b in zip(two, one)])
    moved = np.concatenate([np.abs(a - b).ravel() for a, b in zip(two, before)])
    assert np.quantile(moved, 0.5) > 1e-4  # the steps did move the weights
    assert np.quantile(diffs, 0.999) < 1e-6, np.quantile(diffs, [0.5, 0.99, 0.999, 1.0])
    assert diffs.max() < 2 * 1e-3 * 2


def _mlm_variant_and_plain(two_replica_steps, policy: str = "float32", **variant):
    """Two steps on two replicas under `variant` (_train's options) and plainly: (losses, plain losses, trainer)."""
    data, initial, (_, _, plain), _ = two_replica_steps("mlm")
    trained = []
    keras.config.set_dtype_policy(policy)
    try:
        _, _, losses = _train("mlm", data, DEVICES, 1, initial, trained=trained, **variant)
    finally:
        keras.config.set_dtype_policy("float32")
    return losses, plain, trained[0]


@pytest.mark.e2e
def test_xla_compiled_step_equals_the_plain_step_and_compiles_once(two_replica_steps):
    """--compile: the same 2-replica steps through XLA (jit_compile=True); compiled once, in the warm-up."""
    losses_xla, losses_plain, trainer = _mlm_variant_and_plain(two_replica_steps, compile="default")
    np.testing.assert_allclose(losses_xla, losses_plain, rtol=1e-4)  # XLA fuses and reorders float32 sums
    metrics = trainer.backend_metrics()
    assert [c["step"] for c in metrics["compile_steps"]] == [0] and metrics["recompiled_in_measured_window"] == []
    assert metrics["compile_s"] > 0 and trainer._gradients._jit_compile


def test_one_replicas_overflow_skips_the_step_on_every_replica():
    strategy = build_strategy("mirrored", DEVICES, "RING", 60)

    def replica_grads():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return agree_on_overflow([tf.where(replica == 1, float("inf"), 1.0) * tf.ones(3)])

    for replica_grads_out in strategy.experimental_local_results(strategy.run(replica_grads)):
        assert not np.isfinite(replica_grads_out[0].numpy()).any()
    clean = strategy.run(lambda: agree_on_overflow([tf.ones(3)]))
    assert all((g[0].numpy() == 1).all() for g in strategy.experimental_local_results(clean))


@pytest.mark.e2e
def test_fp16_unscales_its_gradients_skips_an_overflowing_step_and_follows_fp32(two_replica_steps):
    """mixed_float16 + LossScaleOptimizer on two replicas, against the plain float32 steps. A step whose gradients
    overflow float16 on every replica (its batch's loss weighted 1e30 times; one replica's overflow alone:
    test_one_replicas_overflow_skips_the_step_on_every_replica) is skipped: the weights and AdamW's
    moments stay as they were and the scale halves. Training then goes on as if it had not been: the next steps
    take the float32 run's batches and their losses are its own within float16's precision, and after them AdamW's
    first moment is the float32 run's. That is what shows the gradients unscaled: one left scaled by 2^15 would be
    32,768 times the float32 one there, which the losses alone would hide (Adam's step is scale-invariant)."""
    data, initial, (_, _, plain), plain_trainer = two_replica_steps("mlm")
    fed, before_step, trained = [], [], []

    def alter(step: int, batch):
        # Trains on b0, b1 weighted 1e30 (overflows), b1, b2: the float32 run's b0, b1 with a skipped step between.
        fed.append(batch)
        before_step.append([v.numpy() for v in (*trained[0].model.trainable_variables, *_moments(trained[0]))])
        if step == 1:
            return replace(fed[0], denominator=fed[0].denominator * 1e-30)
        return fed.pop(0)
    keras.config.set_dtype_policy("mixed_float16")
    try:
        _, _, losses = _train("mlm", data, DEVICES, 1, initial, steps=3, trained=trained, precision="fp16",
                              alter=alter)
    finally:
        keras.config.set_dtype_policy("float32")
    skipped_from, skipped_to = before_step[1], before_step[2]
    assert all(np.array_equal(a, b) for a, b in zip(skipped_from, skipped_to))   # weights and moments untouched
    metrics = trained[0].backend_metrics()
    assert metrics["loss_scale_skipped_steps"] == 1 and metrics["loss_scale_final"] == 2.0**14
    np.testing.assert_allclose([losses[0], losses[2]], plain, rtol=1e-2)
    # All of them as one vector: a variable whose gradient is ~1e-12 (a token row no sample touched but through the
    # tied decoder) is below float16's resolution even scaled, and its own relative error says nothing.
    fp16, fp32 = (np.concatenate([m.numpy().ravel() for m in _moments(t)]) for t in (trained[0], plain_trainer))
    assert np.linalg.norm(fp16 - fp32) <= 0.05 * np.linalg.norm(fp32), (np.linalg.norm(fp16 - fp32),
                                                                        np.linalg.norm(fp32))


def _moments(trainer) -> list:
    """AdamW's first moments, one per trainable variable (under loss scaling, the inner optimizer's)."""
    optimizer = getattr(trainer.optimizer, "inner_optimizer", trainer.optimizer)
    return list(optimizer._momentums)


@pytest.mark.parametrize("workload", ["cnn", "mlm"])
def test_trainable_params_equal_spec(workload: str):
    spec = model_spec(workload)
    model = build_model(workload, spec)
    assert trainable_param_count(model) == spec.param_count()
    assert not any("pooled" in w.path for w in model.weights)


def test_the_matmul_probe_times_one_product_per_device_at_once():
    precision, seconds = time_matmul(DEVICES, "fp32", 64, 3)
    assert precision == "fp32" and len(seconds) == 3 and all(0 < s < 1 for s in seconds)


# Each mode once and each workload once: the CNN in one process (MirroredStrategy), the MLM in one process per
# worker (MultiWorkerMirroredStrategy). The other two pairs train in bench.parity (tf_mirrored, both workloads,
# 1 and 2 devices), test_faults (the CNN, multi_worker) and test_multihost (the MLM, multi_worker, two hosts).
@pytest.mark.e2e
@pytest.mark.parametrize("workload, mode", [("cnn", "mirrored"), ("mlm", "multi_worker")])
def test_end_to_end_record(data_dir: Path, tmp_path: Path, workload: str, mode: str):
    # Evaluating a whole split would be most of the run (the CNN's 10,000 test images: 22 s of its 31): each
    # evaluates a part, the MLM its first 32 sequences (each worker its shard, summed), the CNN its first 500
    # images (the last of 2 batches a partial one). Every image once is held on MindSpore's CNN run
    # (test_mindspore_auto) and torch's sweep (test_torch_ddp); the shard is common.loop's for every backend.
    evaluated = ["--eval-samples", "32" if workload == "mlm" else "500"]
    proc = run_cli("bench.run", "--backend", "tf_mirrored", "--workload", workload, "--devices", "2",
                   "--steps", "6", "--warmup-steps", "2", "--batch-size", "8", "--data", "real",
                   "--data-dir", str(data_dir), "--tf-mode", mode, "--collective-timeout", "120",
                   "--timeout", "400", "--out", str(tmp_path), "--tensorboard", str(tmp_path / "tb"),
                   "--profile", "2", *evaluated)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = (tmp_path / "runs").glob("*.json")
    record = json.loads(path.read_text())
    assert validate_record(record) == []
    assert record["strategy"] == {"mirrored": "MirroredStrategy", "multi_worker": "MultiWorkerMirroredStrategy"}[mode]
    metrics = record["backend_metrics"]
    assert metrics["tf_mode"] == mode and metrics["replicas_in_sync"] == 2
    assert metrics["processes"] == (1 if mode == "mirrored" else 2)
    assert metrics["all_reduce"] in record["notes"][0]
    assert metrics["trainable_params"] == record["params"] == model_spec(workload).param_count()
    assert record["measured_steps"] == 4 and len(record["loss"]["curve"]) == 6
    evaluated = {"cnn": (500, 10_000), "mlm": (32, 1704)}[workload]
    assert record["eval"]["count"] > 0
    assert (record["eval"]["samples_evaluated"], record["eval"]["split_size"]) == evaluated
    assert np.isfinite(record["loss"]["last"])
    assert_tensorboard_log_is_the_record(tmp_path / "tb", record)
    processes = metrics["processes"]
    memory, peak = record["memory"], record["achievable_peak"]
    assert memory["processes_share"] is (mode == "mirrored") and len(memory["training_per_rank"]) == processes
    assert all(0 < t < p for t, p in zip(memory["training_per_rank"], memory["process_peak_per_rank"]))
    assert len(peak["per_rank"]) == processes and record["mfu_achievable"] > 0
    assert_profiled(record, xspace_steps)
    assert record["backend_metrics"]["attribution"]["categories"]["all_reduce"]["seconds"] > 0  # 2 replicas
    assert record["backend_metrics"]["fast_path"]["options"]["xla_jit_compile"] is False


def xspace_steps(folder: Path) -> int:
    """The step annotations of the XSpace tf.profiler wrote in `folder`, parsed by TensorFlow's own schema."""
    from backends.tf_mirrored.profile import read_xspace
    from common.attribution import STEP_MARKER

    [path] = folder.glob("plugins/profile/*/*.xplane.pb")
    return sum(plane.event_metadata[e.metadata_id].name == STEP_MARKER
               for plane in read_xspace(path).planes for line in plane.lines for e in line.events)
