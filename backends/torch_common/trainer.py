"""common.loop's Trainer for PyTorch: one optimizer step, evaluation, collectives and checkpoints.

The same class serves a plain module, nn.DataParallel (one process) and DDP (one process per
rank): `model` is what runs the training forward, `core` the bare module underneath.
"""
from __future__ import annotations

import contextlib
import pickle
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from backends.torch_common.comm import CommCounter, kinds_probe, link_probe
from backends.torch_common.fast_path import adamw, fast_path
from backends.torch_common.matmul import time_matmul
from backends.torch_common.profile import TorchProfiler
from backends.torch_common.weights import final_params
from common.checkpoints import commit, valid_checkpoints
from common.compile_log import CompileLog
from common.config import RunConfig
from common.data.batches import Batch, StepBatch
from common.final_params import FIELD as FINAL_PARAMS
from common.memory import resident_peak_bytes
from common.sections import Fp32Math, TrainableParams, merged

CHECKPOINT_EXT = ".pt"
AUTOCAST_DTYPES = {"amp": torch.bfloat16, "fp16": torch.float16}


def compile_options(mode: str) -> dict:
    """torch.compile's arguments for --compile MODE ("default" is torch's own default)."""
    return {} if mode == "default" else {"mode": mode}


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far: a step that raises it (re)compiled."""
    from torch._dynamo.utils import counters  # dynamo's own bookkeeping, imported only when compiling
    return int(counters["stats"]["unique_graphs"])


def loss_and_correct(model: nn.Module, workload: str, batch: dict[str, torch.Tensor], count_correct: bool = True):
    """(sum of per-sample or per-token losses, number correct), unreduced so that any
    denominator (global batch, global mask count) can divide them afterwards. A training step passes
    count_correct=False and gets None for the count: eager torch would otherwise run an argmax over the
    vocabulary each step only to discard it (13 ms of a 600 ms tiny-BERT step on one CPU thread), work
    the bare loops and the graph-compiling frameworks do not do."""
    if workload == "cnn":
        return cnn_loss_and_correct(model(batch["image"]).float(), batch, count_correct)
    if workload == "lm":
        return lm_loss_and_correct(model(batch["input_ids"]).float(), batch, count_correct)
    return mlm_loss_and_correct(model(batch["input_ids"], batch["padding_mask"], batch["mask_positions"]).float(),
                                batch, count_correct)


def cnn_loss_and_correct(logits: torch.Tensor, batch: dict[str, torch.Tensor], count_correct: bool = True):
    labels = batch["label"].long()
    loss = F.cross_entropy(logits, labels, reduction="sum")
    return loss, (logits.argmax(-1) == labels).sum() if count_correct else None


def token_loss_and_correct(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                           count_correct: bool = True):
    """The cross-entropy at each token position, weighted and summed (weight 0: no label there)."""
    labels = labels.long()
    per_token = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
    loss = (per_token * weights.flatten()).sum()
    return loss, ((logits.argmax(-1) == labels).float() * weights).sum() if count_correct else None


def mlm_loss_and_correct(logits: torch.Tensor, batch: dict[str, torch.Tensor], count_correct: bool = True):
    return token_loss_and_correct(logits, batch["mask_ids"], batch["mask_weights"], count_correct)


def lm_loss_and_correct(logits: torch.Tensor, batch: dict[str, torch.Tensor], count_correct: bool = True):
    """The next-token loss over the real labels (the last row's padding weighs 0)."""
    return token_loss_and_correct(logits, batch["labels"], batch["label_weights"], count_correct)


def sample_count(tensors: dict[str, torch.Tensor]) -> float:
    """What a batch's loss is averaged over: weighted tokens (mlm, lm) or samples (cnn)."""
    for weights in ("mask_weights", "label_weights"):
        if weights in tensors:
            return float(tensors[weights].sum())
    return len(tensors["label"])


class TorchTrainer:
    def __init__(self, model: nn.Module, core: nn.Module, cfg: RunConfig, device: torch.device,
                 rank: int = 0, world: int = 1, metrics: Callable[[], dict] | None = None,
                 count_comm_in: Callable[[CommCounter], None] | None = None,
                 memory_devices: list[int] | None = None):
        self.model, self.core, self.cfg, self.device = model, core, cfg, device
        # The CUDA devices whose allocators hold this process's training: DataParallel's replicas, else its own.
        self._memory_devices = memory_devices or ([device] if device.type == "cuda" else [])
        # Where the probe steps count communication: by default every op of the step passes the counter (a
        # dispatch mode, slow for a many-op model); a backend whose collectives all pass one place (DDP's comm
        # hook) counts them there instead, installed before the first probe step.
        self._counter, self._count_comm_in, self._counting_in_place = CommCounter(), count_comm_in, False
        self._metrics = metrics
        self.rank, self.world = rank, world
        self.optimizer = adamw(core.parameters(), cfg.optim)  # fused (torch_common.fast_path)
        self.autocast = torch.autocast(device.type, dtype=AUTOCAST_DTYPES.get(cfg.precision, torch.float32),
                                       enabled=cfg.precision in AUTOCAST_DTYPES)
        # float16 gradients underflow: the loss is scaled up, the scale halved (and the step skipped)
        # whenever a gradient overflows, grown again after 2000 clean steps (torch's defaults).
        self.scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")
        # The scale after the last step: one read per step, at its end. Read before scaler.step() as well,
        # it would wait for the backward on a GPU in the middle of every step.
        self._scale_seen = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.skipped_steps = 0
        self.compile_log = CompileLog(cfg.compile, cfg.warmup_steps, "torch._dynamo counters['stats']"
                                      "['unique_graphs'] before and after each step", graphs_compiled)
        self._collective_device = device if dist.is_initialized() and dist.get_backend() == "nccl" else "cpu"
        self.skipped_checkpoints: list[str] = []

    def to_device(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(v).to(self.device, non_blocking=True) for k, v in batch.items()}

    def train_step(self, batch: StepBatch, lr: float) -> float:
        if self.cfg.compile:
            return self.compile_log.run(lambda: self._train_step(batch, lr))
        return self._train_step(batch, lr)

    def compiled_last_step(self) -> bool:
        return self.compile_log.compiled_last_step()

    def _train_step(self, batch: StepBatch, lr: float) -> float:
        total = self._forward_backward(batch, lr)
        self._optimizer_step()
        return float(total) / batch.denominator  # waits for the device: the step is done

    def _optimizer_step(self) -> None:
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self._scale_seen is not None:
            scale = self.scaler.get_scale()
            if scale < self._scale_seen:
                self.skipped_steps += 1  # an overflow: GradScaler skipped the update and lowered the scale
            self._scale_seen = scale

    def _forward_backward(self, batch: StepBatch, lr: float) -> torch.Tensor:
        """The step up to the optimizer: gradients of every micro-batch (DDP reduces them); the loss sum."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        # DDP averages gradients over ranks; scaling by world/denominator makes the result the
        # gradient of (global loss sum / global denominator), as a single device would compute it.
        scale = self.world / batch.denominator
        total = torch.zeros((), device=self.device)
        last = len(batch.micro) - 1
        for i, micro in enumerate(batch.micro):
            skip_sync = i < last and hasattr(self.model, "no_sync")
            with self.model.no_sync() if skip_sync else contextlib.nullcontext(), self.autocast:
                loss_sum, _ = loss_and_correct(self.model, self.cfg.workload, self.to_device(micro),
                                               count_correct=False)
            self.scaler.scale(loss_sum * scale).backward()
            total += loss_sum.detach()
        return total

    probe_source = ("torch: perf_counter around forward+backward and optimizer.step, device synchronised between; "
                    "communication = every collective the step issues (torch_common.comm.CommCounter), each waited "
                    "for, so it stands apart from the compute it would overlap")

    def probe_step(self, batch: StepBatch, lr: float) -> dict[str, float]:
        """One step, phases timed apart (common.loop's --breakdown-steps, after the measured window)."""
        counter = self._counter
        if self._count_comm_in is not None and not self._counting_in_place:
            self._count_comm_in(counter)
            self._counting_in_place = True
        counter.reset()
        self.sync()
        t0 = time.perf_counter()
        with contextlib.nullcontext() if self._count_comm_in else counter:
            total = self._forward_backward(batch, lr)
        self.sync()
        t1 = time.perf_counter()
        self._optimizer_step()
        self.sync()
        t2 = time.perf_counter()
        float(total)
        nbytes, comm_s = counter.total()
        return {"forward_backward_s": t1 - t0 - comm_s, "grad_comm_s": comm_s, "optimizer_s": t2 - t1,
                "grad_comm_bytes": nbytes if self.world > 1 else 0}  # one rank: nothing crosses a link

    def link_probe(self, nbytes: float) -> tuple[int, int, list[float]]:
        return link_probe(nbytes, self.device) if self.world > 1 else (1, 0, [])

    def kinds_probe(self, nbytes: float) -> tuple[int, int, dict[str, list[float]]]:
        return kinds_probe(nbytes, self.device) if self.world > 1 else (1, 0, {})

    def profiler(self, directory: Path) -> TorchProfiler:
        return TorchProfiler(directory, self.device, self.rank)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def evaluate(self, batches) -> tuple[float, float, float]:
        # The bare module: a DDP forward would broadcast buffers, a collective that ranks with
        # uneven evaluation shards would not all reach.
        self.core.eval()
        loss = correct = count = 0.0
        try:
            for batch in batches:
                tensors = self.to_device(batch)
                with self.autocast:
                    l_sum, c = loss_and_correct(self.core, self.cfg.workload, tensors)
                loss += float(l_sum)
                correct += float(c)
                count += sample_count(tensors)
        finally:
            self.core.train()
        return loss, correct, count

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self._collective_device)
        dist.all_reduce(t)
        return t.tolist()

    def all_gather(self, obj: dict) -> list[dict]:
        if self.world == 1:
            return [obj]
        out: list = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def _barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def save_checkpoint(self, directory: Path, step: int) -> None:
        if self.rank == 0:
            state = {"model": self.core.state_dict(), "optimizer": self.optimizer.state_dict(), "step": step}
            commit(directory, step, CHECKPOINT_EXT, lambda tmp: torch.save(state, tmp))
        self._barrier()  # nobody runs ahead of (or exits before) a checkpoint that is still being written

    def load_checkpoint(self, directory: Path) -> int | None:
        """The newest checkpoint whose digest matches, loaded as tensors only (weights_only: a payload
        that asks to run code is refused, not unpickled); torn or refused ones are skipped with a note."""
        try:
            for step, path in valid_checkpoints(directory, CHECKPOINT_EXT, self.skipped_checkpoints):
                try:
                    state = torch.load(path, map_location=self.device, weights_only=True)
                except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
                    self.skipped_checkpoints.append(f"checkpoint {path.name} skipped: refused by torch.load "
                                                    f"(weights_only): {str(exc).splitlines()[0][:200]}")
                    continue
                self.core.load_state_dict(state["model"])
                self.optimizer.load_state_dict(state["optimizer"])
                return int(step)
            return None
        finally:
            for note in self.skipped_checkpoints:
                print(f"rank {self.rank}: {note}", file=sys.stderr, flush=True)

    def backend_metrics(self) -> dict:
        counted = sum(p.numel() for p in self.core.parameters() if p.requires_grad)
        skipped = {"skipped_checkpoints": self.skipped_checkpoints} if self.skipped_checkpoints else {}
        extra = {**(self.compile_log.metrics() if self.cfg.compile else {}), **self._precision_metrics()}
        fast = fast_path(self.cfg, self.device, bool(self.optimizer.defaults.get("fused")))
        return merged(TrainableParams(counted), fast, **{FINAL_PARAMS: final_params(self.core)}, **skipped, **extra,
                      **(self._metrics() if self._metrics else {}))

    def _precision_metrics(self) -> dict:
        # torch's float32 matmuls stay on plain float32 units unless TF32 is allowed (common.peak_flops)
        fp32 = "tf32" if self.device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32 else "fp32"
        if not self.scaler.is_enabled():
            return Fp32Math(fp32).to_metrics()
        return {**Fp32Math(fp32).to_metrics(), "loss_scale_final": float(self.scaler.get_scale()),
                "loss_scale_skipped_steps": self.skipped_steps}

    allocator_source = "torch.cuda.memory_allocated and max_memory_allocated, summed over the process's devices"

    def allocator_memory(self, reset: bool) -> tuple[int, int] | None:
        if not self._memory_devices:
            return None
        held = sum(int(torch.cuda.memory_allocated(d)) for d in self._memory_devices)
        peak = sum(int(torch.cuda.max_memory_allocated(d)) for d in self._memory_devices)
        if reset:
            for d in self._memory_devices:
                torch.cuda.reset_peak_memory_stats(d)
        return held, peak

    def time_matmul(self, n: int, repeats: int) -> tuple[str, list[float]]:
        return time_matmul(self.device, self.cfg.precision, n, repeats)

    def peak_memory_bytes(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return resident_peak_bytes()
