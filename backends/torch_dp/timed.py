"""nn.DataParallel with the time of each of its phases measured: what makes it slow is visible.

forward() is DataParallel.forward (torch 2.x) with a device-synchronised clock read between
scatter, replicate, parallel_apply and gather. The synchronisation serialises a little of what
DataParallel would overlap; the record says so.
"""
from __future__ import annotations

import time
from itertools import chain

import numpy as np
import torch
from torch import nn

PHASES = ("scatter", "replicate", "parallel_apply", "gather")


class TimedDataParallel(nn.DataParallel):
    def __init__(self, module: nn.Module, device_ids=None, output_device=None):
        super().__init__(module, device_ids=device_ids, output_device=output_device)
        self.phase_log: list[dict[str, float]] = []

    def _now(self) -> float:
        for d in dict.fromkeys(self.device_ids):  # each distinct device once
            torch.cuda.synchronize(d)
        return time.perf_counter()

    def forward(self, *inputs, **kwargs):
        if not self.device_ids:  # no CUDA: DataParallel calls the module directly
            return self.module(*inputs, **kwargs)
        for t in chain(self.module.parameters(), self.module.buffers()):
            if t.device != self.src_device_obj:
                raise RuntimeError(f"module must have its parameters and buffers on {self.src_device_obj}")
        times = {}
        t0 = self._now()
        inputs, module_kwargs = self.scatter(inputs, kwargs, self.device_ids)
        t1 = self._now()
        times["scatter"] = t1 - t0
        if len(self.device_ids) == 1:
            out = self.module(*inputs[0], **module_kwargs[0])
            times["parallel_apply"] = self._now() - t1
            self.phase_log.append(times)
            return out
        replicas = self.replicate(self.module, self.device_ids[: len(inputs)])
        t2 = self._now()
        outputs = self.parallel_apply(replicas, inputs, module_kwargs)
        t3 = self._now()
        out = self.gather(outputs, self.output_device)
        times.update(replicate=t2 - t1, parallel_apply=t3 - t2, gather=self._now() - t3)
        self.phase_log.append(times)
        return out

    def phase_means(self, skip: int, forwards_per_step: int) -> dict[str, float] | None:
        """Mean seconds per optimizer step spent in each phase, after the first `skip` forwards."""
        measured = self.phase_log[skip:]
        if not measured:
            return None
        steps = len(measured) / forwards_per_step
        return {p: float(np.sum([m.get(p, 0.0) for m in measured])) / steps for p in PHASES}
