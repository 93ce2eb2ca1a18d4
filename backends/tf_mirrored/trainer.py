"""common.loop's Trainer for TensorFlow: a distributed step, evaluation, collectives, checkpoints.

One class serves both modes. `rank`/`world` are processes, as run_loop sees them: (0, 1) for
MirroredStrategy, whose N replicas live in one process, and (i, N) for MultiWorkerMirroredStrategy.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from backends.keras_common.models import token_targets
from backends.keras_common.optimizer import TorchAdamW
from backends.tf_mirrored.data import model_inputs, token_inputs
from backends.tf_mirrored.fast_path import fast_path
from backends.tf_mirrored.matmul import time_matmul
from backends.tf_mirrored.profile import TfProfiler
from common.compile_log import CompileLog
from common.config import RunConfig
from common.data.batches import StepBatch, batch_weight
from common.memory import resident_peak_bytes
from common.results import write_json_atomic
from common.sections import Fp32Math

LATEST = "latest.json"
STATE_PREFIX = "state"


def loss_and_correct(model: keras.Model, batch: dict, training: bool):
    """(sum of per-sample or per-token losses, number correct), unreduced, so that any denominator
    (the global batch, the global mask count) can divide them afterwards."""
    if "image" in batch:
        logits = tf.cast(model(batch["image"], training=training), tf.float32)
        labels, weights = tf.cast(batch["label"], tf.int32), None
    else:
        logits = tf.cast(model(token_inputs(batch), training=training), tf.float32)
        labels, weights = token_targets(batch)
    per_item = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    hits = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
    if weights is not None:
        per_item, hits = per_item * weights, hits * weights
    return tf.reduce_sum(per_item), tf.reduce_sum(hits)


def _dense(grad):
    # The tied token embedding gets a sparse (lookup) and a dense (decoder) part; sum them densely.
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def agree_on_overflow(grads: list) -> list:
    """The replica's gradients, made non-finite when any replica's are. LossScaleOptimizer decides to skip
    a step from one replica's own gradients (replica 0's under MirroredStrategy, each worker's under
    MultiWorkerMirroredStrategy) before its all-reduce, so an overflow elsewhere would be applied, or one
    worker would skip the all-reduce the others wait in; one small all-reduce makes the decision common."""
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
    overflows = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(finite, tf.float32))
    poison = tf.where(overflows > 0, float("nan"), 0.0)
    return [g + tf.cast(poison, g.dtype) for g in grads]


class KerasTrainer:
    def __init__(self, strategy: tf.distribute.Strategy, model: keras.Model, cfg: RunConfig, device_kind: str,
                 rank: int = 0, world: int = 1):
        self.strategy, self.model, self.cfg, self.device_kind = strategy, model, cfg, device_kind
        self.rank, self.world = rank, world
        o = cfg.optim
        with strategy.scope():
            self.optimizer = TorchAdamW(learning_rate=o.lr, weight_decay=o.weight_decay,
                                        beta_1=o.beta1, beta_2=o.beta2, epsilon=o.eps)
            self.loss_scaling = cfg.precision == "fp16"
            if self.loss_scaling:  # float16 gradients underflow: Keras' dynamic loss scale (2^15, halved on
                # overflow with the step skipped, doubled after 2000 clean steps), as torch's GradScaler
                self.optimizer = keras.optimizers.LossScaleOptimizer(self.optimizer)
            self.optimizer.build(model.trainable_variables)
        # The scale after the last step: one read per step
        self._scale_seen = float(self.optimizer.dynamic_scale.numpy()) if self.loss_scaling else None
        self.skipped_steps = 0
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=self.optimizer)
        # --compile: XLA compiles each replica's forward and backward on its own device. Not the whole step,
        # as Keras' fit(jit_compile=True) would: one XLA cluster cannot reach variables on several devices
        # ("Trying to access resource ... located in device CPU:1 from device CPU:0" with 2 replicas), so
        # the all-reduce and AdamW stay in the (traced, not XLA-compiled) step function.
        self._gradients = (tf.function(self._replica_gradients, jit_compile=True) if cfg.compile
                           else self._replica_gradients)
        self._step = tf.function(self._distributed_step)
        self.compile_log = CompileLog(cfg.compile, cfg.warmup_steps, "tf.function tracing count before and "
                                      "after each step (each trace is one XLA compilation)",
                                      self._step.experimental_get_tracing_count)
        self._eval = tf.function(lambda batch: loss_and_correct(model, batch, training=False),
                                 reduce_retracing=True)

    def _replica_step(self, micro: tuple, denominator: tf.Tensor) -> tf.Tensor:
        """Runs on each replica. Loss = local sum / global denominator, so the SUM all-reduce that
        Keras' optimizer applies to the gradients under a strategy gives the single-device gradient."""
        grads, total = self._gradients(micro, denominator)
        if self.loss_scaling:
            grads = agree_on_overflow(grads)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        return total

    def _replica_gradients(self, micro: tuple, denominator: tf.Tensor):
        """(summed gradients of the micro-batches, loss share) of one replica: its whole computation."""
        variables = self.model.trainable_variables
        grads, total = None, tf.zeros((), tf.float32)
        for batch in micro:
            with tf.GradientTape() as tape:
                loss_sum, _ = loss_and_correct(self.model, batch, training=True)
                loss = loss_sum / denominator
                target = self.optimizer.scale_loss(loss) if self.loss_scaling else loss
            step_grads = tape.gradient(target, variables)
            step_grads = [_dense(g) for g in step_grads]
            grads = step_grads if grads is None else [a + b for a, b in zip(grads, step_grads)]
            total += loss
        return grads, total

    # ------------------------------------------------------------------ breakdown probe (common.loop)

    probe_source = ("tf_mirrored: gradients and replica_context.all_reduce (the collective Keras' optimizer uses) "
                    "each run as a tf.function of its own, then the whole train step; optimizer = that step less "
                    "the two; perf_counter around each, devices synchronised")

    @staticmethod
    def _replica_sum(values):
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, values)

    def _build_probe(self) -> None:
        s = self.strategy
        self._probe_grads = tf.function(lambda micro, d: s.run(self._gradients, args=(micro, d)))
        self._probe_reduce = tf.function(lambda grads: s.run(self._replica_sum, args=(grads,)))

    def _timed(self, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)  # a tf.function call returns when its CPU kernels are done; sync() waits for GPUs
        self.sync()
        return out, time.perf_counter() - t0

    def probe_step(self, batch: StepBatch, lr: float) -> dict[str, float]:
        """Keras' optimizer all-reduces inside apply_gradients and refuses to run outside replica context, so
        the update is not timed alone: it is the whole step less the gradients and all-reduce timed before."""
        if not hasattr(self, "_probe_grads"):
            self._build_probe()
        self.optimizer.learning_rate = lr
        micro, denominator = tuple(batch.micro), tf.constant(batch.denominator, tf.float32)
        (grads, _), fb = self._timed(self._probe_grads, micro, denominator)
        replicated = self.strategy.num_replicas_in_sync > 1
        comm = self._timed(self._probe_reduce, grads)[1] if replicated else 0.0
        step = self._timed(self._step, micro, denominator)[1]
        nbytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in self.model.trainable_variables)
        # The separate gradient and all-reduce runs are the instrument's: the loop takes them off the step.
        return {"forward_backward_s": fb, "grad_comm_s": comm, "optimizer_s": max(0.0, step - fb - comm),
                "grad_comm_bytes": nbytes if replicated else 0, "instrument_s": fb + comm}

    def link_probe(self, nbytes: float) -> tuple[int, int, list[float]]:
        """The same collective on one float32 tensor of about nbytes, timed after a warm-up."""
        size = max(int(nbytes) // 4, 1 << 18)
        buffer = self.strategy.experimental_distribute_values_from_function(lambda _: tf.zeros(size, tf.float32))
        reduce = tf.function(lambda x: self.strategy.run(self._replica_sum, args=(x,)))
        times = [self._timed(reduce, buffer)[1] for _ in range(4)][1:]
        return self.strategy.num_replicas_in_sync, size * 4, times

    def profiler(self, directory: Path) -> TfProfiler:
        return TfProfiler(directory)

    def _distributed_step(self, micro: tuple, denominator: tf.Tensor):
        return self.strategy.run(self._replica_step, args=(micro, denominator))

    def train_step(self, batch: StepBatch, lr: float) -> float:
        self.optimizer.learning_rate = lr  # a variable assign, outside the graph: no retracing
        def step() -> float:
            shares = self._step(tuple(batch.micro), tf.constant(batch.denominator, tf.float32))
            return float(sum(float(s) for s in self.strategy.experimental_local_results(shares)))
        loss = self.compile_log.run(step) if self.cfg.compile else step()
        if self._scale_seen is not None:
            scale = float(self.optimizer.dynamic_scale.numpy())
            if scale < self._scale_seen:
                self.skipped_steps += 1  # an overflow: the optimizer skipped the update and halved the scale
            self._scale_seen = scale
        return loss

    def compiled_last_step(self) -> bool:
        return self.compile_log.compiled_last_step()

    def sync(self) -> None:
        if self.device_kind == "cuda":
            tf.test.experimental.sync_devices()

    def _use_rank0_statistics(self) -> None:
        """Give every worker rank 0's BatchNorm moving statistics before evaluating.

        Keras updates them per replica (aggregation none), so the copies drift apart. DDP evaluates
        every rank with rank 0's buffers (it broadcasts them at each forward); in one process the
        primary copy read below is replica 0's already, across processes it is broadcast here.
        """
        stats = self.model.non_trainable_weights
        if self.world == 1 or not stats:
            return
        sizes = [int(np.prod(w.shape)) for w in stats]
        flat = np.zeros(sum(sizes))
        if self.rank == 0:
            flat = np.concatenate([w.numpy().ravel() for w in stats]).astype(np.float64)
        flat = self._all_reduce_array(flat)
        for w, chunk in zip(stats, np.split(flat, np.cumsum(sizes)[:-1])):
            w.assign(chunk.reshape(w.shape).astype(w.dtype))

    def evaluate(self, batches) -> tuple[float, float, float]:
        # Outside strategy.run: the variables' primary copies, on this process's shard of the split.
        self._use_rank0_statistics()
        loss = correct = count = 0.0
        for batch in batches:
            l_sum, c = self._eval(model_inputs(batch))
            loss += float(l_sum)
            correct += float(c)
            count += batch_weight(self.cfg.workload, batch)
        return loss, correct, count

    def _all_reduce_array(self, values: np.ndarray) -> np.ndarray:
        """SUM over the workers of MultiWorkerMirroredStrategy (one replica each), float64 so that
        integers and bytes survive exactly. Eager, for the few calls of a run (evaluations, the final
        gather, checkpoint barriers): TF's warning about eager overhead does not matter here."""
        def replica_fn(x):
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, x)
        out = self.strategy.run(replica_fn, args=(tf.constant(values, tf.float64),))
        return self.strategy.experimental_local_results(out)[0].numpy()

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return list(values)
        return self._all_reduce_array(np.asarray(values, np.float64)).tolist()

    def all_gather(self, obj: dict) -> list[dict]:
        """Gather JSON-able dicts through the one collective TF offers everywhere, a sum: each worker
        fills its own row of a zero matrix with its bytes."""
        if self.world == 1:
            return [obj]
        mine = np.frombuffer(json.dumps(obj).encode(), np.uint8)
        sizes = np.zeros(self.world)
        sizes[self.rank] = mine.size
        sizes = self._all_reduce_array(sizes).astype(int)
        rows = np.zeros((self.world, sizes.max()))
        rows[self.rank, :mine.size] = mine
        rows = self._all_reduce_array(rows)
        return [json.loads(rows[r, :sizes[r]].astype(np.uint8).tobytes()) for r in range(self.world)]

    def _barrier(self) -> None:
        if self.world > 1:
            self._all_reduce_array(np.zeros(1))

    def save_checkpoint(self, directory: Path, step: int) -> None:
        """Rank 0 writes the state into a fresh folder, renames it into place, then points latest.json
        at it: a crash at any moment leaves the previous checkpoint whole. The variables are mirrored
        (no on-read aggregation), so writing them needs no collective and the other ranks only wait."""
        if self.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".checkpoint-", dir=directory))
            try:
                self.checkpoint.write(str(tmp / STATE_PREFIX))
                final = directory / f"step-{step:08d}"
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            write_json_atomic(directory / LATEST, {"step": step, "folder": final.name})
            for old in directory.glob("step-*"):
                if old != final:
                    shutil.rmtree(old, ignore_errors=True)
        self._barrier()  # nobody runs ahead of (or exits before) a checkpoint that is still being written

    def load_checkpoint(self, directory: Path) -> int | None:
        latest = directory / LATEST
        if not latest.is_file():
            return None
        meta = json.loads(latest.read_text())
        with self.strategy.scope():
            self.checkpoint.read(str(directory / meta["folder"] / STATE_PREFIX)).assert_existing_objects_matched()
        return int(meta["step"])

    def backend_metrics(self) -> dict:
        # The worker adds the strategy's facts on rank 0, where they are at hand.
        scaling = ({"loss_scale_final": float(self.optimizer.dynamic_scale.numpy()),
                    "loss_scale_skipped_steps": self.skipped_steps} if self.loss_scaling else {})
        # TensorFlow runs float32 matmuls and convolutions as TF32 on GPUs that have it, unless told not to.
        tf32 = self.device_kind == "cuda" and tf.config.experimental.tensor_float_32_execution_enabled()
        return {**(self.compile_log.metrics() if self.cfg.compile else {}), **scaling,
                **Fp32Math("tf32" if tf32 else "fp32").to_metrics(), **fast_path(self.cfg).to_metrics()}

    allocator_source = "tf.config.experimental.get_memory_info current and peak, summed over the logical GPUs"

    def allocator_memory(self, reset: bool) -> tuple[int, int] | None:
        if self.device_kind != "cuda":
            return None
        names = [d.name for d in tf.config.list_logical_devices("GPU")]
        infos = [tf.config.experimental.get_memory_info(name) for name in names]
        if reset:
            for name in names:
                tf.config.experimental.reset_memory_stats(name)
        return sum(i["current"] for i in infos), sum(i["peak"] for i in infos)

    def time_matmul(self, n: int, repeats: int) -> tuple[str, list[float]]:
        return time_matmul(list(self.strategy.extended.worker_devices), self.cfg.precision, n, repeats)

    def peak_memory_bytes(self) -> int:
        if self.device_kind == "cuda":
            return sum(tf.config.experimental.get_memory_info(d.name)["peak"]
                       for d in tf.config.list_logical_devices("GPU"))
        return resident_peak_bytes()
