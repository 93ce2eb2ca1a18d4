"""common.loop's Trainer for Keras 3 on JAX: one jitted, stateless step over arrays laid out on the mesh.

The model's and the optimizer's variables are taken out of Keras once (their values, already sharded by the
LayoutMap) and threaded through `stateless_call` / `stateless_apply` in a jax.jit that XLA's GSPMD partitions:
the collectives are the compiler's. Batches enter as global arrays sharded over "batch". Every process of a
multi-process run executes the same programs (SPMD), so the step's loss is global: rank 0 reports it.
"""
from __future__ import annotations

import json
import math
import time

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from backends.keras_common.models import decoder_inputs, token_targets
from backends.keras_jax.fast_path import fast_path
from backends.keras_jax.hlo import collectives
from backends.keras_jax.profile import JaxProfiler
from common.achievable import timed_repeats
from common.config import RunConfig
from common.data.batches import StepBatch
from common.errors import Unsupported
from common.final_params import FIELD as FINAL_PARAMS
from common.final_params import summarise
from common.memory import resident_peak_bytes
from common.peak_flops import PRECISION_MATH
from common.sections import CommPerStep, Fp32Math, StateBytesPerRank, TrainableParams, merged


def model_inputs(batch: dict) -> dict:
    """common's arrays -> the Keras model's inputs (int32 masks, one segment as in torch)."""
    if "image" in batch:
        return batch["image"]
    ids = batch["input_ids"]
    if "labels" in batch:
        return decoder_inputs(ids)
    return {"token_ids": ids, "segment_ids": jnp.zeros_like(ids), "padding_mask": batch["padding_mask"],
            "mask_positions": batch["mask_positions"]}


@jax.named_scope("loss")  # names the loss's ops in the compiled program, for --profile's attribution
def loss_and_correct(logits, batch: dict):
    """(sum of per-sample or per-token losses, number correct), unreduced, as tf_mirrored's."""
    logits = logits.astype(jnp.float32)
    if "image" in batch:
        labels, weights = batch["label"].astype(jnp.int32), batch["weight"]
    else:
        labels, weights = token_targets(batch)
    picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    per_item = jax.nn.logsumexp(logits, axis=-1) - picked
    hits = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return jnp.sum(per_item * weights), jnp.sum(hits * weights)


def host_arrays(batch: dict, rows_multiple: int = 1) -> dict[str, np.ndarray]:
    """common's batch as the arrays the programs take: int32 masks, a per-sample weight for the CNN, rows padded
    (weight 0) to a multiple of the data-parallel size so that the batch splits evenly over "batch"."""
    out = {k: np.asarray(v) for k, v in batch.items()}
    if "padding_mask" in out:
        out["padding_mask"] = out["padding_mask"].astype(np.int32)
    if "image" in out:
        out.setdefault("weight", np.ones(len(out["label"]), np.float32))
    pad = -len(next(iter(out.values()))) % rows_multiple
    if pad:
        out = {k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)]) for k, v in out.items()}
    return out


def _bytes_per_device(shape, dtype, sharding, into: dict[int, int]) -> None:
    """Add one array's shard on every device of its sharding (global: no gather needed; the plan splits evenly)."""
    shard = np.dtype(dtype).itemsize * math.prod(sharding.shard_shape(tuple(shape)))
    for device in sharding.device_set:
        into[device.id] = into.get(device.id, 0) + shard


class JaxTrainer:
    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, cfg: RunConfig,
                 mesh: jax.sharding.Mesh, rank: int, world: int, canonical: dict[str, str], per_replica_bn: bool):
        self.model, self.optimizer, self.cfg, self.mesh = model, optimizer, cfg, mesh
        self.rank, self.world = rank, world
        # Evaluation is one global program over the whole split, the same batches in every process.
        self.data_rank, self.data_world = 0, 1
        self.dp = mesh.shape["batch"]
        self.canonical = canonical
        self.per_replica_bn = per_replica_bn
        self.trainable = [v.value for v in model.trainable_variables]
        self.non_trainable = [v.value for v in model.non_trainable_variables]
        self.opt_vars = [v.value for v in optimizer.variables]
        # The learning rate is an optimizer variable: the step sets it from its argument (no retracing).
        self._lr_at = next(i for i, v in enumerate(optimizer.variables) if v.path.endswith("/learning_rate"))
        self.batch_sharding = NamedSharding(mesh, P("batch"))
        self.replicated = NamedSharding(mesh, P())
        self._param_shardings = [a.sharding for a in self.trainable]
        shardings = ([a.sharding for a in self.trainable], [a.sharding for a in self.non_trainable],
                     [a.sharding for a in self.opt_vars])
        self._step_fn = jax.jit(self._step, donate_argnums=(0, 1, 2), out_shardings=(*shardings, self.replicated))
        self._eval_fn = jax.jit(self._eval, out_shardings=self.replicated)
        self._step_exec = None
        self._steps_run = 0
        self._compiles: list[dict] = []

    # ------------------------------------------------------------------ the programs
    def _loss(self, trainable, non_trainable, batch: dict, denominator):
        """The micro-batch's loss share and the updated non-trainable state (BatchNorm's moving statistics)."""
        def replica(part):
            logits, state = self.model.stateless_call(trainable, non_trainable, model_inputs(part), training=True)
            return loss_and_correct(logits, part)[0], state
        if not self.per_replica_bn:
            loss_sum, state = replica(batch)
            return loss_sum / denominator, state
        # BatchNorm's statistics per data-parallel replica, as DDP's: the model runs on each replica's slice
        # (vmap over the sharded leading axis); replica 0's moving statistics are kept, as DDP broadcasts rank 0's.
        parts = jax.tree_util.tree_map(lambda x: x.reshape(self.dp, -1, *x.shape[1:]), batch)
        loss_sums, states = jax.vmap(replica)(parts)
        return jnp.sum(loss_sums) / denominator, [s[0] for s in states]

    def _step(self, trainable, non_trainable, opt_vars, scalars, micro):
        lr, denominator = scalars[0], scalars[1]
        grads, total = None, jnp.zeros((), jnp.float32)
        for batch in micro:
            (loss, non_trainable), step_grads = jax.value_and_grad(self._loss, has_aux=True)(
                trainable, non_trainable, batch, denominator)
            grads = step_grads if grads is None else [a + b for a, b in zip(grads, step_grads)]
            total = total + loss
        # Gradients laid out as their weights: with sharded state GSPMD reduce-scatters them (ZeRO/FSDP).
        grads = [jax.lax.with_sharding_constraint(g, s) for g, s in zip(grads, self._param_shardings)]
        opt_vars = list(opt_vars)
        opt_vars[self._lr_at] = lr.astype(opt_vars[self._lr_at].dtype)
        trainable, opt_vars = self.optimizer.stateless_apply(opt_vars, grads, trainable)
        return trainable, non_trainable, opt_vars, total

    def _eval(self, trainable, non_trainable, batch):
        logits = self.model.stateless_call(trainable, non_trainable, model_inputs(batch), training=False)[0]
        loss_sum, correct = loss_and_correct(logits, batch)
        count = jnp.sum(batch["weight"] if "image" in batch else token_targets(batch)[1])
        return jnp.stack([loss_sum, correct, count])

    # ------------------------------------------------------------------ breakdown probe (common.loop)
    probe_source = ("keras_jax: the gradients as one jitted program per data-parallel replica (vmapped over the "
                    "replicas' slices, so without the data-parallel reduction; tensor-parallel and sharded-state "
                    "collectives stay inside it), the reduction over 'batch' as a program of its own, then the whole "
                    "step; optimizer = the step less the two; each waited for")

    def _stacked(self, a) -> NamedSharding:
        """A per-replica stack of `a`'s gradient: replicas over "batch", each laid out as `a`."""
        spec = tuple(getattr(a.sharding, "spec", ()))
        return NamedSharding(self.mesh, P("batch", *(None if axis == "batch" else axis for axis in spec)))

    def _replica_grads(self, trainable, non_trainable, scalars, micro):
        def grads_of(parts):
            total = None
            for part in parts:
                def loss(t, part=part):
                    logits, _ = self.model.stateless_call(t, non_trainable, model_inputs(part), training=True)
                    return loss_and_correct(logits, part)[0] / scalars[1]
                g = jax.grad(loss)(trainable)
                total = g if total is None else [a + b for a, b in zip(total, g)]
            return total
        split = [jax.tree_util.tree_map(lambda x: x.reshape(self.dp, -1, *x.shape[1:]), b) for b in micro]
        return jax.vmap(grads_of)(split)

    def _build_probe(self) -> None:
        stacked = [self._stacked(a) for a in self.trainable]
        self._probe_grads = jax.jit(self._replica_grads, out_shardings=stacked)
        self._probe_reduce = jax.jit(lambda grads: [g.sum(0) for g in grads], out_shardings=self._param_shardings)

    def _timed(self, fn, *args):
        began = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        return out, time.perf_counter() - began

    def probe_step(self, batch: StepBatch, lr: float) -> dict[str, float]:
        if not hasattr(self, "_probe_grads"):
            self._build_probe()
        micro = tuple(self._global(host_arrays(m), local_rows=True) for m in batch.micro)
        scalars = self._scalars(lr, batch.denominator)
        grads, fb = self._timed(self._probe_grads, self.trainable, self.non_trainable, scalars, micro)
        comm = self._timed(self._probe_reduce, grads)[1] if self.dp > 1 else 0.0
        before = time.perf_counter()
        self.train_step(batch, lr)
        step = time.perf_counter() - before
        nbytes = sum(a.nbytes for a in self.trainable)
        # The separate gradient and reduction programs are the instrument's: the loop takes them off the step.
        return {"forward_backward_s": fb, "grad_comm_s": comm, "optimizer_s": max(0.0, step - fb - comm),
                "grad_comm_bytes": nbytes if self.dp > 1 else 0, "instrument_s": fb + comm}

    def link_probe(self, nbytes: float) -> tuple[int, int, list[float]]:
        """The reduction over "batch" alone, on one float32 array of about nbytes per replica, after a warm-up."""
        size = max(int(nbytes) // 4, 1 << 18)
        host = np.zeros((self.dp, size), np.float32)
        buffer = jax.make_array_from_callback(host.shape, self.batch_sharding, lambda index: host[index])
        reduce = jax.jit(lambda x: x.sum(0), out_shardings=self.replicated)
        times = [self._timed(reduce, buffer)[1] for _ in range(4)][1:]
        return self.dp, size * 4, times

    def profiler(self, directory) -> JaxProfiler:
        return JaxProfiler(directory, lambda: self._step_exec.as_text())

    # ------------------------------------------------------------------ feeding
    def _global(self, arrays: dict[str, np.ndarray], local_rows: bool) -> dict:
        """Global arrays sharded over "batch": from this process's rows (training: its replica's slice), or from
        the whole batch every process holds (evaluation)."""
        if local_rows:
            return {k: jax.make_array_from_process_local_data(self.batch_sharding, v) for k, v in arrays.items()}
        return {k: jax.make_array_from_callback(v.shape, self.batch_sharding, lambda index, v=v: v[index])
                for k, v in arrays.items()}

    def _scalars(self, *values: float):
        host = np.asarray(values, np.float32)
        return jax.make_array_from_callback(host.shape, self.replicated, lambda index: host[index])

    # ------------------------------------------------------------------ common.loop's Trainer
    def train_step(self, batch: StepBatch, lr: float) -> float:
        micro = tuple(self._global(host_arrays(m), local_rows=True) for m in batch.micro)
        args = (self.trainable, self.non_trainable, self.opt_vars, self._scalars(lr, batch.denominator), micro)
        if self._step_exec is None:  # compiled ahead of its first call: compile time apart from the step's
            began = time.perf_counter()
            self._step_exec = self._step_fn.lower(*args).compile()
            self._compiles.append({"step": self._steps_run, "graphs": 1, "wall_s": time.perf_counter() - began})
        self.trainable, self.non_trainable, self.opt_vars, total = self._step_exec(*args)
        self._steps_run += 1
        loss = float(np.asarray(total.addressable_data(0)))  # waits for the step
        return loss if self.rank == 0 else 0.0

    def compiled_last_step(self) -> bool:
        return bool(self._compiles) and self._compiles[-1]["step"] == self._steps_run - 1

    def sync(self) -> None:
        jax.block_until_ready(self.trainable)

    def evaluate(self, batches) -> tuple[float, float, float]:
        sums = np.zeros(3)
        for batch in batches:
            arrays = self._global(host_arrays(batch, self.dp), local_rows=False)
            sums += np.asarray(self._eval_fn(self.trainable, self.non_trainable, arrays).addressable_data(0))
        # Every process computed the same global sums: one of them reports them.
        return tuple(float(v) for v in sums) if self.rank == 0 else (0.0, 0.0, 0.0)

    def _gather_bytes(self, payload: bytes) -> list[bytes]:
        """Every process's bytes, in process order (JAX's host collective over the run's devices)."""
        mine = np.frombuffer(payload, np.uint8)
        sizes = np.asarray(multihost_utils.process_allgather(np.int32(mine.size))).reshape(-1)
        padded = np.zeros(int(sizes.max()), np.uint8)
        padded[:mine.size] = mine
        rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(self.world, -1)
        return [rows[r, :sizes[r]].tobytes() for r in range(self.world)]

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return list(values)
        # Gathered as float64 bytes and summed here: JAX computes in float32 unless x64 is switched on globally.
        rows = [np.frombuffer(b, np.float64) for b in self._gather_bytes(np.asarray(values, np.float64).tobytes())]
        return np.sum(rows, axis=0).tolist()

    def all_gather(self, obj: dict) -> list[dict]:
        if self.world == 1:
            return [obj]
        return [json.loads(b) for b in self._gather_bytes(json.dumps(obj).encode())]

    def save_checkpoint(self, directory, step):
        raise Unsupported("keras_jax does not write checkpoints")

    def load_checkpoint(self, directory):
        raise Unsupported("keras_jax does not resume from checkpoints")

    def peak_memory_bytes(self) -> int:
        if self.cfg.device_kind == "cuda":
            stats = [d.memory_stats() or {} for d in jax.local_devices()]
            return int(sum(s.get("peak_bytes_in_use", 0) for s in stats))
        return resident_peak_bytes()

    def time_matmul(self, n: int, repeats: int) -> tuple[str, list[float]]:
        """(math mode, seconds of each of `repeats` rounds of one n x n x n product on every device this process
        drives, all at once, after an untimed round): common.achievable's probe, as the step runs its devices."""
        devices = jax.local_devices()
        dtype = jnp.bfloat16 if self.cfg.precision == "amp" else jnp.float32
        sharding = NamedSharding(jax.sharding.Mesh(np.array(devices), ("d",)), P("d"))
        host = np.random.default_rng(0).standard_normal((len(devices), n, n), np.float32).astype(dtype)
        a, b = jax.device_put(host, sharding), jax.device_put(host, sharding)
        products = jax.jit(lambda x, y: jnp.sum(jnp.matmul(x, y), axis=(1, 2)))
        return self._math_mode(), timed_repeats(lambda: jax.block_until_ready(products(a, b)), repeats)

    def _math_mode(self) -> str:
        """What a product runs as: the precision's, or TF32 for float32 on GPUs (XLA's default matmul precision)."""
        exact = jax.config.jax_default_matmul_precision in ("highest", "float32")
        if self.cfg.precision == "fp32" and self.cfg.device_kind == "cuda" and not exact:
            return "tf32"
        return PRECISION_MATH[self.cfg.precision]

    # ------------------------------------------------------------------ what the record gets
    def _device_order(self) -> list[int]:
        """Device ids in rank order: the mesh's (batch, model) grid, model innermost (common.layout's ranks)."""
        return [d.id for d in self.mesh.devices.flat]

    def _state_bytes(self) -> StateBytesPerRank:
        parts: dict[str, dict[int, int]] = {"params": {}, "grads": {}, "optimizer": {}}
        for a in self.trainable:
            _bytes_per_device(a.shape, a.dtype, a.sharding, parts["params"])
        for a, sharding in zip(self.trainable, self._param_shardings):  # the step's constraint on gradients
            _bytes_per_device(a.shape, a.dtype, sharding, parts["grads"])
        for a in self.opt_vars:
            _bytes_per_device(a.shape, a.dtype, a.sharding, parts["optimizer"])
        return StateBytesPerRank.from_value([{p: parts[p].get(d, 0) for p in parts} for d in self._device_order()])

    def _comm(self) -> CommPerStep | None:
        if self._step_exec is None:
            return None
        found = collectives(self._step_exec.as_text())
        per_device = {kind: {**c, "time_s": None} for kind, c in found.items()}
        return CommPerStep.from_value([per_device for _ in self._device_order()])

    def _memory_analysis(self) -> dict | None:
        """XLA's own account of the step's buffers on one device (bytes), where the runtime gives one."""
        try:
            m = self._step_exec.memory_analysis()
        except Exception:  # not every PJRT client implements it: not measured
            return None
        fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
                  "generated_code_size_in_bytes")
        return {f: int(getattr(m, f)) for f in fields if hasattr(m, f)} if m is not None else None

    def _final_params(self) -> dict:
        whole = []
        for variable, value in zip(self.model.trainable_variables, self.trainable):
            full = np.asarray(value) if value.is_fully_addressable else multihost_utils.process_allgather(value,
                                                                                                       tiled=True)
            whole.append((self.canonical[variable.path], full))
        return summarise(whole)

    def backend_metrics(self) -> dict:
        late = [c["step"] for c in self._compiles if c["step"] >= self.cfg.warmup_steps]
        compile_log = {"compile_mode": "xla (jax.jit, ahead of the first step)",
                       "compile_s": sum(c["wall_s"] for c in self._compiles), "compile_steps": self._compiles,
                       "recompiled_in_measured_window": late,
                       "compile_detection": "the step is lowered and compiled explicitly before its first call"}
        trainable = sum(a.size for a in self.trainable)
        fp32 = Fp32Math("tf32" if self._math_mode() == "tf32" else "fp32")
        return merged(TrainableParams(trainable), fp32, self._state_bytes(), self._comm(), fast_path(self.cfg),
                      **compile_log,
                      xla_step_memory_per_device=self._memory_analysis(), **{FINAL_PARAMS: self._final_params()})
