"""common.loop's Trainer for MindSpore: a graph-mode train step, evaluation, collectives, checkpoints.

The train step is one compiled cell: the loss of every micro-batch of the step (unrolled, so the
CNN's BatchNorm sees each micro-batch on its own, as torch's accumulation does), its gradients,
their reduction across ranks and an AdamW update. Both graphs are compiled before the loop and
timed apart, so compilation never reaches the throughput figures.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor, amp, nn, ops
from mindspore.communication import GlobalComm
from mindspore.experimental.optim import AdamW

from backends.mindspore_auto.fast_path import fast_path
from backends.mindspore_auto.matmul import time_matmul
from backends.mindspore_auto.models import INPUT_COLUMNS
from backends.mindspore_auto.parallel_config import ParallelConfig
from backends.mindspore_auto.profile import MindSporeProfiler
from common.config import RunConfig
from common.data.batches import Batch, StepBatch
from common.memory import resident_peak_bytes

CHECKPOINT_NAME = "checkpoint.ckpt"
# Rows per evaluation forward. The MLM loss holds several rows x 20 x vocabulary float32 tensors
# (logits, their exponentials, one-hot labels): 32 rows keep each near 85 MB, where the loop's
# 256-row batches would take gigabytes per process. The decoder LM has logits at all 128 positions:
# 4 rows keep each near 68 MB.
EVAL_CHUNK_ROWS = {"cnn": 256, "mlm": 32, "lm": 4}
# --compile: MindSpore's O1 adds its common graph optimizations and automatic operator fusion to the
# graph the train step always is in GRAPH_MODE (O0, mindspore.jit's default: only the passes correctness needs).
COMPILED_JIT_LEVEL = "O1"
# --precision fp16: MindSpore's own defaults, those of amp.DynamicLossScaleManager (torch and Keras keep theirs).
LOSS_SCALE_START, LOSS_SCALE_FACTOR, LOSS_SCALE_WINDOW = 2.0 ** 24, 2, 2000


def float16_matmuls(loss_net: nn.Cell, scratch: Path) -> nn.Cell:
    """--precision fp16, amp O1: Conv2D, MatMul, BatchMatMul and Dense in float16, cast back to float32 after;
    the rest (softmax and its -1e9 mask bias, LayerNorm, the loss) stays float32, as torch's autocast keeps it.
    MindSpore's rewrite writes the rewritten cells' source to ./rewritten_network and imports it from there:
    it runs in `scratch` (the run's folder), never in the user's working directory."""
    scratch.mkdir(parents=True, exist_ok=True)
    here = os.getcwd()
    os.chdir(scratch)
    try:
        return amp.auto_mixed_precision(loss_net, "O1", dtype=ms.float16)
    finally:
        os.chdir(here)


class ScaledLoss(nn.Cell):
    """scale x the summed loss of K stacked micro-batches ([K, b, ...] inputs)."""

    def __init__(self, loss_net: nn.Cell, micro_batches: int):
        super().__init__(auto_prefix=False)
        self.loss_net, self.micro_batches = loss_net, micro_batches

    def construct(self, scale, *inputs):
        total = 0.0
        for k in range(self.micro_batches):
            total = total + self.loss_net(*[column[k] for column in inputs])
        return total * scale


class TrainLoss(nn.Cell):
    """The loss sum alone: what gradients, and a PipelineCell, take."""

    def __init__(self, loss_net: nn.Cell):
        super().__init__(auto_prefix=False)
        self.loss_net = loss_net

    def construct(self, *inputs):
        return self.loss_net(*inputs)[0]


class TrainStep(nn.Cell):
    """One optimizer step. With a loss scaler (fp16) the loss is multiplied by its scale before the
    gradients, which are unscaled after the all-reduce; a step whose reduced gradients overflowed
    (the same on every rank) leaves the weights alone, and the scaler halves its scale."""

    def __init__(self, scaled_loss: nn.Cell, optimizer: AdamW, grad_reducer: nn.Cell,
                 loss_scaler: amp.DynamicLossScaler | None = None):
        super().__init__(auto_prefix=False)
        self.scaled_loss, self.optimizer, self.grad_reducer = scaled_loss, optimizer, grad_reducer
        self.grad_fn = ops.value_and_grad(scaled_loss, None, optimizer.parameters)
        self.lr = optimizer.lrs[0]
        self.loss_scaler = loss_scaler

    def construct(self, lr, scale, *inputs):
        if self.loss_scaler is not None:
            return self._loss_scaled_step(lr, scale, *inputs)
        value, grads = self.grad_fn(scale, *inputs)
        grads = self.grad_reducer(grads)
        grads = ops.depend(grads, ops.assign(self.lr, lr))
        self.optimizer(grads)
        return value

    def _loss_scaled_step(self, lr, scale, *inputs):
        loss_scale = self.loss_scaler.scale_value * 1.0  # read before adjust() changes it
        value, grads = self.grad_fn(scale * loss_scale, *inputs)
        value = value / loss_scale
        grads = self.grad_reducer(grads)
        finite = amp.all_finite(grads)
        if finite:
            grads = self.loss_scaler.unscale(grads)
            grads = ops.depend(grads, ops.assign(self.lr, lr))
            self.optimizer(grads)
        self.loss_scaler.adjust(finite)
        return value


class ProbeGradients(nn.Cell):
    """The breakdown probe's first graph: the train step's loss and gradients, nothing after them."""

    def __init__(self, step: TrainStep):
        super().__init__(auto_prefix=False)
        self.grad_fn = step.grad_fn

    def construct(self, scale, *inputs):
        return self.grad_fn(scale, *inputs)


class ProbeReduce(nn.Cell):
    """The probe's second graph: the train step's gradient all-reduce alone."""

    def __init__(self, step: TrainStep):
        super().__init__(auto_prefix=False)
        self.grad_reducer = step.grad_reducer

    def construct(self, grads):
        return self.grad_reducer(grads)


class ProbeUpdate(nn.Cell):
    """The probe's third graph: the train step's AdamW update alone."""

    def __init__(self, step: TrainStep):
        super().__init__(auto_prefix=False)
        self.optimizer, self.lr = step.optimizer, step.lr

    def construct(self, lr, grads):
        grads = ops.depend(grads, ops.assign(self.lr, lr))
        return ops.depend(lr, self.optimizer(grads))


def build_grad_reducer(pcfg: ParallelConfig, world: int, parameters) -> nn.Cell:
    """DATA_PARALLEL: an explicit averaging all-reduce; semi_auto/auto insert their own reductions,
    except across pipeline micro-batches, which PipelineGradReducer accumulates."""
    if pcfg.mode == "data":
        if world == 1:
            return nn.Identity()
        return nn.DistributedGradReducer(parameters, mean=True, degree=world, group=GlobalComm.WORLD_COMM_GROUP)
    if pcfg.pipeline_stage > 1:
        return nn.PipelineGradReducer(parameters, opt_shard=pcfg.optimizer_shard)
    return nn.Identity()


class MindSporeTrainer:
    """`rank`/`world` are what common.loop sees. DATA_PARALLEL: the processes themselves, each with
    its shard of every batch. semi_auto/auto: one logical trainer (rank 0 of 1) that every process
    runs in SPMD fashion on the full batch (full_batch=True), the compiler splitting the work."""

    def __init__(self, loss_net: nn.Cell, cfg: RunConfig, pcfg: ParallelConfig, process_rank: int, processes: int):
        self.cfg, self.pcfg = cfg, pcfg
        self.process_rank, self.processes = process_rank, processes
        self.data_parallel_mode = pcfg.mode == "data"
        self.rank, self.world = (process_rank, processes) if self.data_parallel_mode else (0, 1)
        self.loss_net, self.columns = loss_net, INPUT_COLUMNS[cfg.workload]
        self.loss_scaler = (amp.DynamicLossScaler(LOSS_SCALE_START, LOSS_SCALE_FACTOR, LOSS_SCALE_WINDOW)
                            if cfg.precision == "fp16" else None)
        self._scale_seen = self._loss_scale()  # the scale after the last step: one read per step
        self.skipped_steps = 0
        o = cfg.optim
        train_net = TrainLoss(loss_net)
        if pcfg.pipeline_stage > 1:
            train_net = nn.PipelineCell(train_net, pcfg.micro_batch_num)
        scaled = ScaledLoss(train_net, cfg.grad_accum)
        params = loss_net.trainable_params()
        self.optimizer = AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)
        self.step_cell = TrainStep(scaled, self.optimizer, build_grad_reducer(pcfg, processes, params),
                                   self.loss_scaler)
        self.step_cell.set_train(True)
        if cfg.compile:
            self.step_cell.set_jit_config(ms.JitConfig(jit_level=COMPILED_JIT_LEVEL))
        self.eval_rows = EVAL_CHUNK_ROWS[cfg.workload]
        # With a pipeline only the last stage's processes (rank-major: the last `loss_holders`
        # ranks) compute the loss; the others are told it through one all-reduce.
        self.loss_holders = processes // pcfg.pipeline_stage
        self.holds_loss = process_rank >= processes - self.loss_holders

    # ------------------------------------------------------------------ inputs

    def _columns(self, batch: Batch) -> list[np.ndarray]:
        if self.cfg.workload == "cnn" and "weight" not in batch:
            batch = {**batch, "weight": np.ones(len(batch["label"]), np.float32)}
        return [batch[c] for c in self.columns]

    def _eval_chunks(self, batch: Batch):
        """The batch in chunks of `eval_rows`, the last padded with zero-weight rows, so that one
        compiled graph serves every chunk and padding counts for nothing."""
        columns = self._columns(batch)
        for start in range(0, len(columns[0]), self.eval_rows):
            yield _pad_rows([c[start:start + self.eval_rows] for c in columns], self.eval_rows)

    def _step_inputs(self, batch: StepBatch, lr: float) -> list[Tensor]:
        # DATA_PARALLEL averages gradients over ranks: world x local sum / global denominator
        # makes the average the gradient of the global mean, as one device would compute it.
        scale = self.world / batch.denominator
        stacked = [np.stack(col) for col in zip(*(self._columns(m) for m in batch.micro))]
        return [Tensor(np.float32(lr)), Tensor(np.float32(scale)), *(Tensor(a) for a in stacked)]

    # ------------------------------------------------------------------ compile

    def compile(self, batch: StepBatch, eval_batch: Batch) -> dict[str, float]:
        """Compile the train and eval graphs on real shapes; the seconds each took."""
        t0 = time.perf_counter()
        self.step_cell.compile(*self._step_inputs(batch, self.cfg.optim.lr))
        t1 = time.perf_counter()
        self.loss_net.set_train(False)
        try:
            self.loss_net.compile(*(Tensor(a) for a in next(self._eval_chunks(eval_batch))))
        finally:
            self.loss_net.set_train(True)
        return {"compile_s": t1 - t0, "eval_compile_s": time.perf_counter() - t1,
                "jit_level": self.step_cell.jit_config_dict.get("jit_level") or "MindSpore's default"}

    # ------------------------------------------------------------------ Trainer protocol

    def train_step(self, batch: StepBatch, lr: float) -> float:
        value = float(self.step_cell(*self._step_inputs(batch, lr)).asnumpy())
        if self._scale_seen is not None:
            scale = self._loss_scale()
            if scale < self._scale_seen:
                self.skipped_steps += 1  # an overflow: the update was skipped and the scale halved
            self._scale_seen = scale
        if self.data_parallel_mode:
            return value / self.world  # this rank's share of the global mean
        if self.pcfg.pipeline_stage > 1:
            value = _all_reduce([value if self.holds_loss else 0.0])[0] / self.loss_holders
        return value

    # ------------------------------------------------------------------ breakdown probe (common.loop)

    @property
    def probe_source(self) -> str:
        if not self.data_parallel_mode:
            return "mindspore_auto: the compiler places the collectives of a sharded layout; whole step timed"
        return ("mindspore_auto: the train step's three parts compiled as graphs of their own (value_and_grad; "
                "DistributedGradReducer over mccl/nccl/hccl; AdamW), perf_counter around each, outputs read back")

    def probe_step(self, batch: StepBatch, lr: float) -> dict[str, float]:
        inputs = self._step_inputs(batch, lr)
        if not self.data_parallel_mode:
            t0 = time.perf_counter()
            self.step_cell(*inputs).asnumpy()
            return {"forward_backward_s": time.perf_counter() - t0, "grad_comm_s": 0.0, "optimizer_s": 0.0}
        if not hasattr(self, "_probe_cells"):
            self._probe_cells = tuple(cell(self.step_cell) for cell in (ProbeGradients, ProbeReduce, ProbeUpdate))
        gradients, reduce, update = self._probe_cells
        t0 = time.perf_counter()
        value, grads = gradients(*inputs[1:])
        value.asnumpy()
        t1 = time.perf_counter()
        # mutable: a tuple of tensors handed to a graph is otherwise a constant, and each call would recompile.
        if self.processes > 1:
            grads = reduce(ms.mutable(grads))
            grads[-1].asnumpy()
        t2 = time.perf_counter()
        update(inputs[0], ms.mutable(grads)).asnumpy()
        t3 = time.perf_counter()
        nbytes = sum(int(np.prod(g.shape)) * g.itemsize for g in grads) if self.processes > 1 else 0
        return {"forward_backward_s": t1 - t0, "grad_comm_s": t2 - t1, "optimizer_s": t3 - t2,
                "grad_comm_bytes": nbytes}

    def link_probe(self, nbytes: float) -> tuple[int, int, list[float]]:
        """MindSpore's AllReduce on one float32 tensor of about nbytes, timed after a warm-up."""
        buffer = Tensor(np.zeros(max(int(nbytes) // 4, 1 << 18), np.float32))
        times = []
        for i in range(4):
            t0 = time.perf_counter()
            ops.AllReduce()(buffer).asnumpy()
            if i:
                times.append(time.perf_counter() - t0)
        return self.processes, int(buffer.shape[0]) * 4, times

    def profiler(self, directory: Path) -> MindSporeProfiler:
        return MindSporeProfiler(directory, self.cfg.device_kind)

    def sync(self) -> None:
        # On CPU the step's asnumpy() has already waited for the graph; MindSpore has no CPU stream.
        if self.cfg.device_kind != "cpu":
            ms.runtime.synchronize()

    def evaluate(self, batches) -> tuple[float, float, float]:
        self.loss_net.set_train(False)
        loss = correct = count = 0.0
        try:
            for batch in batches:
                for columns in self._eval_chunks(batch):
                    l_sum, c = self.loss_net(*(Tensor(a) for a in columns))
                    loss += float(l_sum.asnumpy())
                    correct += float(c.asnumpy())
                    count += float(columns[-1].sum())
        finally:
            self.loss_net.set_train(True)
        return loss, correct, count

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        return _all_reduce(values) if self.world > 1 else list(values)

    def all_gather(self, obj: dict) -> list[dict]:
        if self.world == 1:
            return [obj]
        raw = np.frombuffer(json.dumps(obj).encode(), np.uint8)
        # float32 carries bytes and lengths exactly: MindSpore's CPU collectives take no integers,
        # and its CPU all-reduce only sums, so the longest length comes from an all-gather.
        longest = int(ops.AllGather()(Tensor(np.array([len(raw)], np.float32))).asnumpy().max())
        padded = np.zeros((1, longest), np.float32)
        padded[0, :len(raw)] = raw
        rows = ops.AllGather()(Tensor(padded)).asnumpy().astype(np.uint8)
        return [json.loads(bytes(row).rstrip(b"\0")) for row in rows]

    def _checkpoint_path(self, directory: Path) -> Path:
        """Replicas share one file; sharded layouts keep one file of slices per process."""
        if self.data_parallel_mode:
            return directory / CHECKPOINT_NAME
        return directory / f"checkpoint-rank{self.process_rank}.ckpt"

    def save_checkpoint(self, directory: Path, step: int) -> None:
        if self.process_rank == 0 or not self.data_parallel_mode:
            directory.mkdir(parents=True, exist_ok=True)
            # The temporary name must end in .ckpt: save_checkpoint appends it to any name that does not.
            fd, tmp = tempfile.mkstemp(prefix=".checkpoint.", suffix=".ckpt", dir=directory)
            os.close(fd)
            try:
                ms.save_checkpoint(self.step_cell, tmp, integrated_save=False, append_dict={"step": step})
                os.replace(tmp, self._checkpoint_path(directory))
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        if self.processes > 1:
            _all_reduce([0.0])  # a barrier: nobody runs ahead of (or exits before) a checkpoint being written

    def load_checkpoint(self, directory: Path) -> int | None:
        path = self._checkpoint_path(directory)
        if not path.is_file():
            return None
        state = ms.load_checkpoint(str(path))
        step = int(state.pop("step").asnumpy())
        missing, _ = ms.load_param_into_net(self.step_cell, state, strict_load=True)
        if missing:
            raise RuntimeError(f"checkpoint {path} lacks {', '.join(missing[:5])}")
        return step

    def _loss_scale(self) -> float | None:
        return float(self.loss_scaler.scale_value.asnumpy()) if self.loss_scaler is not None else None

    def backend_metrics(self) -> dict:
        """The precision's facts and the fast path; the worker adds the strategy's on rank 0, where they are at hand."""
        fast = fast_path(self.cfg, self.step_cell.jit_config_dict.get("jit_level") or "O0").to_metrics()
        scaling = {"loss_scale_final": self._loss_scale(), "loss_scale_skipped_steps": self.skipped_steps}
        return {**fast, **(scaling if self.loss_scaler is not None else {})}

    allocator_source = "mindspore.runtime.memory_allocated and max_memory_allocated"

    def allocator_memory(self, reset: bool) -> tuple[int, int] | None:
        if self.cfg.device_kind == "cpu":
            return None
        held, peak = int(ms.runtime.memory_allocated()), int(ms.runtime.max_memory_allocated())
        if reset:
            ms.runtime.reset_peak_memory_stats()
        return held, peak

    def time_matmul(self, n: int, repeats: int) -> tuple[str, list[float]]:
        return time_matmul(self.cfg.precision, n, repeats)

    def peak_memory_bytes(self) -> int:
        if self.cfg.device_kind != "cpu":
            return int(ms.runtime.max_memory_allocated())
        return resident_peak_bytes()


def _all_reduce(values: list[float]) -> list[float]:
    """Sum over every process of the job, in float32 (MindSpore's collectives take no float64):
    exact for counts below 2**24, about 7 significant digits for loss sums."""
    return ops.AllReduce()(Tensor(np.asarray(values, np.float32))).asnumpy().astype(float).tolist()


def _pad_rows(columns: list[np.ndarray], size: int) -> list[np.ndarray]:
    """Zero rows up to `size`: their weight column (the last) is 0, so they count for nothing."""
    short = size - len(columns[0])
    if short <= 0:
        return columns
    return [np.concatenate([c, np.zeros((short, *c.shape[1:]), c.dtype)]) for c in columns]
