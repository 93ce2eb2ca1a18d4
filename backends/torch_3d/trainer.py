"""common.loop's Trainer for a torch_3d layout: one module per rank (its pipeline stage, tensor and
FSDP shards), stepped micro-batch by micro-batch or through a pipeline schedule.

A rank's share of the loss (the loop sums the shares of all ranks) is its micro-batches' loss when it
holds the loss, the last stage's first tensor-parallel rank, and 0 on every other rank.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import DTensor

from backends.torch_common.comm import CommCounter
from backends.torch_common.fast_path import fast_path
from backends.torch_common.internals import pipeline_wait_timer
from backends.torch_common.trainer import TorchTrainer, sample_count
from backends.torch_common.weights import final_params
from common.config import RunConfig
from common.data.batches import StepBatch
from common.errors import Unsupported
from common.final_params import FIELD as FINAL_PARAMS
from common.layout import Layout
from common.sections import Bubble, CommPerStep, StateBytesPerRank, TrainableParams, merged

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


@dataclass
class Placement:
    layout: Layout
    mesh: DeviceMesh
    coords: dict[str, int]
    first_input: str                 # the batch tensor the first stage takes by position
    tie_group: dist.ProcessGroup | None = None  # first and last stage of one (dp, tp): the tied embedding

    @property
    def first(self) -> bool:
        return self.coords["pp"] == 0

    @property
    def last(self) -> bool:
        return self.coords["pp"] == self.layout.pp - 1

    def rank_at(self, pp: int, dp: int, tp: int) -> int:
        return (pp * self.layout.data + dp) * self.layout.tp + tp


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class LayoutTrainer(TorchTrainer):
    def __init__(self, stage: nn.Module, cfg: RunConfig, device: torch.device, rank: int, world: int,
                 where: Placement, trainable_params: int):
        super().__init__(stage, stage, cfg, device, rank, world)
        self.where, self.layout = where, where.layout
        self.data_rank, self.data_world = where.coords["data"], self.layout.data
        self.holds_loss = where.last and where.coords["tp"] == 0
        self._trainable = trainable_params
        self._scale = 1.0
        self._micro_losses: list[torch.Tensor] = []
        self.schedule = None
        if self.layout.pp > 1:
            pipe = PipelineStage(stage, where.coords["pp"], self.layout.pp, device, group=where.mesh["pp"].get_group())
            # scale_grads=False: the loss is already divided by the global denominator
            self.schedule = SCHEDULES[self.layout.schedule](pipe, n_microbatches=self.layout.micro_batches,
                                                           loss_fn=self._pipeline_loss, scale_grads=False)
        # The probe runs on the last warm-up step (the first also holds a pipeline's one-off shape exchange).
        self._steps_to_probe = cfg.warmup_steps - 1 if cfg.warmup_steps > 0 else None
        self._probe: dict = {}

    # -- training --------------------------------------------------------------------------------
    def train_step(self, batch: StepBatch, lr: float) -> float:
        total = self._forward_backward(batch, lr)
        self._optimizer_step()
        return float(total) / batch.denominator if self.holds_loss else 0.0

    def _forward_backward(self, batch: StepBatch, lr: float) -> torch.Tensor:
        """The step up to the optimizer on this stage and shard (TorchTrainer's probe_step times it too)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        # FSDP's reduce-scatter averages over dp; a plain all-reduce here sums.
        self._scale = (self.layout.fsdp if self.layout.sharded else 1) / batch.denominator
        micro = [self.to_device(m) for m in batch.micro]
        if self._steps_to_probe == 0:  # a warm-up step, outside the measured window
            total = self._probed_step(micro)
        else:
            total = self._step(micro)
        if self._steps_to_probe is not None:
            self._steps_to_probe -= 1
        return total

    def _step(self, micro: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        total = self._pipeline_step(micro) if self.schedule else self._local_step(micro)
        self._sync_grads()
        return total

    def _inputs(self, tensors: dict[str, torch.Tensor]) -> tuple[tuple, dict]:
        rest = {k: v for k, v in tensors.items() if k != self.where.first_input}
        return ((tensors[self.where.first_input],) if self.where.first else ()), rest

    def _local_step(self, micro: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        for i, tensors in enumerate(micro):
            if self.layout.sharded:
                self.model.set_requires_gradient_sync(i == len(micro) - 1)  # reduce-scatter once per step
            args, kwargs = self._inputs(tensors)
            with self.autocast:
                out = self.model(*args, **kwargs)
            (out[0] * self._scale).backward()
            total += out[0].detach()
        return total

    def _pipeline_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self._micro_losses.append(output[0].detach())
        return output[0] * self._scale

    def _pipeline_step(self, micro: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        # The schedule splits a step's batch into equal micro-batches: concatenated, ours come back as they were.
        whole = {k: torch.cat([t[k] for t in micro]) for k in micro[0]}
        args, kwargs = self._inputs(whole)
        self._micro_losses = []
        # The schedule wants a target per micro-batch; the last stage computes its loss from kwargs.
        target = torch.zeros(len(micro), device=self.device)
        with self.autocast:
            self.schedule.step(*args, target=target, return_outputs=False, **kwargs)
        # The first step also runs the loss on the schedule's shape-inference forward: the step's own
        # micro-batches are the last ones.
        mine = self._micro_losses[-len(micro):]
        return torch.stack(mine).sum() if mine else torch.zeros(())

    def _sync_grads(self) -> None:
        """Data parallel without FSDP: one flat all-reduce of every gradient over dp (DDP's job with
        one bucket; DDP itself does not take DTensor parameters or a pipeline's micro-batches).
        A pipeline: the two copies of the tied token embedding sum their gradients."""
        for p in self.core.parameters():
            # DTensor may leave a sharded weight's gradient replicated (the embedding's backward does): each
            # rank keeps its own rows, as the other copy of a tied weight and the optimizer have them.
            if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        grads = [local(p.grad) for p in self.core.parameters() if p.grad is not None]
        if self.layout.dp > 1 and not self.layout.sharded and grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.where.mesh["dp"].get_group())
            for g, reduced in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(reduced.view_as(g))
        if self.where.tie_group is not None:
            dist.all_reduce(local(self.core.model.token_embedding.weight.grad), group=self.where.tie_group)

    def _probed_step(self, micro: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """The step, with its collectives counted and, in a pipeline, the time each stage waits for
        its neighbours (the idle share of the step; None where torch no longer lets it be measured)."""
        counter = CommCounter()
        began = time.perf_counter()
        with counter, pipeline_wait_timer() as waited:
            total = self._step(micro)
        elapsed = time.perf_counter() - began
        idle = waited.seconds / elapsed if self.schedule and waited.seconds is not None else None
        self._probe = {"comm": counter.summary(), "idle_share": idle}
        return total

    # -- evaluation --------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, batches) -> tuple[float, float, float]:
        """Ranks of one replica share its shard; replicas' shards differ by at most one batch, so every
        rank runs as many forwards as the longest (FSDP, tensor and pipeline ranks must all take part)
        and the extra ones, on a repeated batch, are not counted."""
        self.core.eval()
        loss = correct = count = 0.0
        mine = [self.to_device(b) for b in batches]
        longest = torch.tensor([len(mine)], device=self._collective_device)
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)
        try:
            for i in range(int(longest)):
                tensors = mine[i] if i < len(mine) else mine[0]
                out = self._forward(tensors)
                if i < len(mine) and self.holds_loss:
                    loss, correct, count = loss + float(out[0]), correct + float(out[1]), count + sample_count(tensors)
        finally:
            self.core.train()
        return loss, correct, count

    def _forward(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """One forward through every stage: activations sent stage to stage (eval batches vary in size,
        which the training schedule's fixed buffers do not)."""
        args, kwargs = self._inputs(tensors)
        step = self.layout.data * self.layout.tp  # the rank distance between neighbouring stages
        if not self.where.first:
            x = torch.empty(len(next(iter(kwargs.values()))), self.cfg.spec.seq_len, self.cfg.spec.hidden,
                            device=self.device)
            dist.recv(x, src=self.rank - step)
            args = (x,)
        with self.autocast:
            out = self.model(*args, **kwargs)
        if not self.where.last:
            dist.send(out.float().contiguous(), dst=self.rank + step)
            return None
        return out

    # -- what the record gets ------------------------------------------------------------------------
    def save_checkpoint(self, directory, step):
        raise Unsupported("torch_3d does not write checkpoints (sharded state needs torch.distributed.checkpoint)")

    def load_checkpoint(self, directory):
        raise Unsupported("torch_3d does not resume from checkpoints")

    def _state_bytes(self) -> dict[str, int]:
        def size(tensors):
            return sum(local(t).numel() * local(t).element_size() for t in tensors if isinstance(t, torch.Tensor))
        if self.layout.sharded:
            # FSDP's root does not reshard after its forward: after an evaluation its parameters would
            # count whole (and their sharded gradients not at all).
            self.core.reshard()
        params = list(self.core.parameters())
        optimizer = [v for state in self.optimizer.state.values() for v in state.values()]
        return {"params": size(params), "grads": size(p.grad for p in params if p.grad is not None),
                "optimizer": size(optimizer)}

    @torch.no_grad()
    def _whole_weights(self) -> dict | None:
        """This stage's weights gathered whole and summarised (common.final_params), on the stage's first
        (dp, tp) rank; None elsewhere. Every rank of the stage gathers each weight, in the same order."""
        if self.layout.sharded:
            self.core.reshard()  # the root's weights as sharded as the layers', whatever ran last
        whole = []
        for name, param in self.core.named_parameters():
            name = name.replace("recomputed.", "").removeprefix("model.")  # parallelize.Recomputed's child
            whole.append((name, param.full_tensor() if isinstance(param, DTensor) else param))
        return final_params(self.core.model, whole) if self.where.coords["data"] == self.where.coords["tp"] == 0 \
            else None

    def backend_metrics(self) -> dict:
        # Every rank calls this in the same place of the loop: gathering here is safe.
        ranks = self.all_gather({"state": self._state_bytes(), "comm": self._probe.get("comm"),
                                 "idle": self._probe.get("idle_share"), "coords": self.where.coords,
                                 "weights": self._whole_weights()})
        # The first and the last stage both hold the tied token embedding, equal after every step.
        whole = {name: summary for r in ranks for name, summary in (r["weights"] or {}).items()}
        comm = CommPerStep.from_value([r["comm"] for r in ranks]) if self._probe else None
        bubble = None
        if self.layout.pp > 1:
            idle = [[r["idle"] for r in ranks if r["coords"]["pp"] == s] for s in range(self.layout.pp)]
            measured = self._probe and all(v is not None for stage in idle for v in stage)
            bubble = Bubble(self.layout.bubble(), [max(stage) for stage in idle] if measured else None)
        fast = fast_path(self.cfg, self.device, bool(self.optimizer.defaults.get("fused")))
        return merged(TrainableParams(self._trainable), StateBytesPerRank.from_value([r["state"] for r in ranks]), comm,
                      bubble, fast, **{FINAL_PARAMS: dict(sorted(whole.items()))})
