"""common.loop's Trainer for PyTorch: one optimizer step, evaluation, collectives and checkpoints.

The same class serves a plain module, nn.DataParallel (one process) and DDP (one process per
rank): `model` is what runs the training forward, `core` the bare module underneath.
"""
from __future__ import annotations

import contextlib
import pickle
import resource
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from common.checkpoints import commit, valid_checkpoints
from common.config import RunConfig
from common.data.batches import Batch, StepBatch

CHECKPOINT_EXT = ".pt"


def loss_and_correct(model: nn.Module, workload: str, batch: dict[str, torch.Tensor]):
    """(sum of per-sample or per-token losses, number correct), unreduced so that any
    denominator (global batch, global mask count) can divide them afterwards."""
    if workload == "cnn":
        logits = model(batch["image"]).float()
        labels = batch["label"].long()
        loss = F.cross_entropy(logits, labels, reduction="sum")
        return loss, (logits.argmax(-1) == labels).sum()
    logits = model(batch["input_ids"], batch["padding_mask"], batch["mask_positions"]).float()
    weights, labels = batch["mask_weights"], batch["mask_ids"].long()
    per_token = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
    loss = (per_token * weights.flatten()).sum()
    return loss, ((logits.argmax(-1) == labels).float() * weights).sum()


class TorchTrainer:
    def __init__(self, model: nn.Module, core: nn.Module, cfg: RunConfig, device: torch.device,
                 rank: int = 0, world: int = 1, metrics: Callable[[], dict] | None = None):
        self.model, self.core, self.cfg, self.device = model, core, cfg, device
        self._metrics = metrics
        self.rank, self.world = rank, world
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(core.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                           weight_decay=o.weight_decay)
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "amp")
        self._collective_device = device if dist.is_initialized() and dist.get_backend() == "nccl" else "cpu"
        self.skipped_checkpoints: list[str] = []

    def to_device(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(v).to(self.device, non_blocking=True) for k, v in batch.items()}

    def train_step(self, batch: StepBatch, lr: float) -> float:
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
                loss_sum, _ = loss_and_correct(self.model, self.cfg.workload, self.to_device(micro))
            (loss_sum * scale).backward()
            total += loss_sum.detach()
        self.optimizer.step()
        return float(total) / batch.denominator

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
                count += float(tensors["mask_weights"].sum()) if "mask_weights" in tensors else len(tensors["label"])
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
        return {"trainable_params": counted, **skipped, **(self._metrics() if self._metrics else {})}

    def peak_memory_bytes(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
