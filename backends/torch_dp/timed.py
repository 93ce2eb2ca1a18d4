"""nn.DataParallel with the time of each of its phases measured: what makes it slow is visible.

forward() is DataParallel.forward (torch 2.x) with CUDA events recorded between scatter, replicate,
parallel_apply and gather, on the current stream of every device taking part. Recording an event
does not wait for anything, so the measured window runs as DataParallel would run without us; the
events are read after the window (phase_means), once every device has finished. A phase's time is
the longest interval any device's stream spent between its two boundaries: the GPU-timeline span,
which covers host-side work (replicate's Python) wherever the GPU waited for it.
"""
from __future__ import annotations

from itertools import chain

import numpy as np
import torch
from torch import nn

PHASES = ("scatter", "replicate", "parallel_apply", "gather")
HOW = ("CUDA events on each device's current stream at the phase boundaries, read after the measured window "
       "(no device synchronisation inside it); a phase = the longest span any device spent in it")


class TimedDataParallel(nn.DataParallel):
    def __init__(self, module: nn.Module, device_ids: list[int], output_device: int):
        super().__init__(module, device_ids=device_ids, output_device=output_device)
        self._devices = list(dict.fromkeys(self.device_ids))  # each distinct device once
        self.phase_log: list[list[list[torch.cuda.Event]]] = []  # forward -> boundary -> event per device

    def _mark(self, marks: list) -> None:
        events = []
        for d in self._devices:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(d))
            events.append(event)
        marks.append(events)

    def forward(self, *inputs, **kwargs):
        for t in chain(self.module.parameters(), self.module.buffers()):
            if t.device != self.src_device_obj:
                raise RuntimeError(f"module must have its parameters and buffers on {self.src_device_obj}")
        marks: list = []
        self._mark(marks)
        inputs, module_kwargs = self.scatter(inputs, kwargs, self.device_ids)
        self._mark(marks)
        if len(self.device_ids) == 1:
            out = self.module(*inputs[0], **module_kwargs[0])
            self._mark(marks)
            self.phase_log.append(marks)
            return out
        replicas = self.replicate(self.module, self.device_ids[: len(inputs)])
        self._mark(marks)
        outputs = self.parallel_apply(replicas, inputs, module_kwargs)
        self._mark(marks)
        out = self.gather(outputs, self.output_device)
        self._mark(marks)
        self.phase_log.append(marks)
        return out

    def _phase_seconds(self, marks: list) -> dict[str, float]:
        names = ("scatter", "parallel_apply") if len(marks) == 3 else PHASES
        return {name: max(a.elapsed_time(b) for a, b in zip(marks[i], marks[i + 1])) / 1e3
                for i, name in enumerate(names)}

    def phase_means(self, skip: int, forwards_per_step: int) -> dict[str, float] | None:
        """Mean seconds per optimizer step spent in each phase, after the first `skip` forwards.
        Called after the measured window: the synchronisation here is outside it."""
        measured = self.phase_log[skip:]
        if not measured:
            return None
        for d in self._devices:
            torch.cuda.synchronize(d)
        return per_step_means([self._phase_seconds(m) for m in measured], forwards_per_step)


def per_step_means(times: list[dict[str, float]], forwards_per_step: int) -> dict[str, float]:
    """Seconds per optimizer step in each phase, from each forward's phase seconds. One device:
    DataParallel neither replicates nor gathers, and those phases are absent."""
    steps = len(times) / forwards_per_step
    return {p: float(np.sum([t[p] for t in times])) / steps for p in PHASES if p in times[0]}
