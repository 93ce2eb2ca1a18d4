"""Gradient communication of DDP, measured through DDP's own comm hook, for the breakdown's probe steps.

The hook is registered at the first probe step, after the measured window: the measured steps keep DDP's
built-in C++ all-reduce. The hook is DDP's reference `allreduce_hook` (same averaging all-reduce per
bucket) with each bucket's bytes counted and, since it waits for the all-reduce before handing the bucket
back, its time standing apart from the backward compute it otherwise overlaps.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

LINK_PROBE_REPEATS = 3
MIN_LINK_PROBE_BYTES = 1 << 20  # small buffers measure latency, not the link


class _Counts:
    """What the hook adds up, held by DDP's reducer as the hook's state."""

    def __init__(self, device: torch.device):
        self.device, self.bytes, self.seconds = device, 0, 0.0


# A module function with its own state, not a bound method: DDP's C++ reducer keeps the hook, and a hook
# that reached back to the DDP module would make a cycle the garbage collector cannot see. The reducer
# would then live until interpreter shutdown, where freeing its Python futures aborts the process (SIGABRT,
# seen in CI). No annotations: DDP checks them against dist.GradBucket, and this module's are strings.
def _timed_allreduce_hook(counts, bucket):
    buffer = bucket.buffer()
    counts.bytes += buffer.numel() * buffer.element_size()
    t0 = time.perf_counter()
    future = default_hooks.allreduce_hook(None, bucket)
    future.wait()
    if counts.device.type == "cuda":
        torch.cuda.synchronize(counts.device)
    counts.seconds += time.perf_counter() - t0
    return future


class DDPCommProbe:
    source = "torch_ddp: DDP comm hook (register_comm_hook, allreduce_hook waited per bucket) in probe steps"

    def __init__(self, model: DistributedDataParallel, device: torch.device):
        self.model, self.device = model, device
        self._counts: _Counts | None = None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        """Before a probe step's backward: from here on DDP all-reduces through the timed hook."""
        if self._counts is None:
            self._counts = _Counts(self.device)
            self.model.register_comm_hook(self._counts, _timed_allreduce_hook)
        self._counts.bytes, self._counts.seconds = 0, 0.0

    def take(self) -> tuple[int, float]:
        """(bytes all-reduced, seconds spent all-reducing) since start()."""
        return self._counts.bytes, self._counts.seconds

    def link(self, nbytes: float) -> tuple[int, int, list[float]]:
        """A plain all-reduce of as many bytes on the same process group, timed a few times after a warm-up."""
        world = dist.get_world_size()
        buffer = torch.zeros(max(int(nbytes), MIN_LINK_PROBE_BYTES) // 4, dtype=torch.float32, device=self.device)
        times = []
        for i in range(LINK_PROBE_REPEATS + 1):
            dist.barrier()
            self._sync()
            t0 = time.perf_counter()
            dist.all_reduce(buffer)
            self._sync()
            if i:
                times.append(time.perf_counter() - t0)
        return world, buffer.numel() * 4, times
