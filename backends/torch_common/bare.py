"""The plainest PyTorch training loop, the reference the torch backends are held against (bench.calibrate).

No harness: the batches are tensors before the clock starts (as in Horovod's synthetic benchmarks), the
loss is the mean cross-entropy, the optimizer torch's AdamW at the peak learning rate (fused, as the
suite's: torch_common.fast_path). torch_dp wraps the model in nn.DataParallel, torch_ddp in
DistributedDataParallel; the loop is the same. --precision and --compile as a user writes them: autocast
(with GradScaler for float16) and torch.compile of the wrapped model.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from backends.torch_common.fast_path import adamw
from backends.torch_common.trainer import AUTOCAST_DTYPES, compile_options
from common.calibration import BareClock
from common.config import RunConfig


def as_tensors(batches: list[dict[str, np.ndarray]], device: torch.device) -> list[dict[str, torch.Tensor]]:
    return [{k: torch.from_numpy(v).to(device) for k, v in b.items()} for b in batches]


def loss_of(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    if "image" in batch:
        return F.cross_entropy(model(batch["image"]), batch["label"].long())
    if "labels" in batch:  # the decoder LM: the next token at every position
        logits, targets, weights = model(batch["input_ids"]), batch["labels"], batch["label_weights"]
    else:
        logits = model(batch["input_ids"], batch["padding_mask"], batch["mask_positions"])
        targets, weights = batch["mask_ids"], batch["mask_weights"]
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.long().flatten(), reduction="none")
    return (per_token * weights.flatten()).sum() / weights.sum()


def train(model: nn.Module, params, batches: list[dict[str, torch.Tensor]], cfg: RunConfig,
          device: torch.device) -> dict:
    optimizer = adamw(params, cfg.optim)
    autocast = torch.autocast(device.type, dtype=AUTOCAST_DTYPES.get(cfg.precision, torch.float32),
                              enabled=cfg.precision in AUTOCAST_DTYPES)
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")
    runner = torch.compile(model, **compile_options(cfg.compile)) if cfg.compile else model
    clock = BareClock(cfg.warmup_steps)
    clock.start()
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_of(runner, batch)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        clock.tick()
    return clock.result()
