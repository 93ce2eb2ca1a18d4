"""Counting the communication a torch step actually issues: bytes, calls and time per kind of collective.
The one way the torch backends measure communication: torch_3d's per-step counts, and every torch
backend's --breakdown-steps (DDP's gradient all-reduce is counted in DDP's comm hook: count_ddp_allreduce).

A TorchDispatchMode sees every c10d op (what torch.distributed, FSDP2 and pipelining issue) and every
functional collective (what DTensor issues) as it is dispatched. Use it around one probe step outside
the measured window: to time a collective it waits for that collective to finish right away, which
serialises communication the real steps overlap (the counts are unchanged, the timing is the probe's).

Bytes per call are the larger buffer this rank takes part with: the tensor of an all-reduce, a
broadcast, a send or a receive; the full input of a reduce-scatter; the gathered output of an all-gather.
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils._python_dispatch import TorchDispatchMode

c10d = torch.ops.c10d
funcol = torch.ops._c10d_functional

# op -> (kind, index of the argument whose tensors count, whether that is the gathered output)
_C10D = {
    c10d.allreduce_.default: ("all_reduce", 0), c10d.allreduce_coalesced_.default: ("all_reduce", 0),
    c10d._reduce_scatter_base_.default: ("reduce_scatter", 1),
    c10d.reduce_scatter_.default: ("reduce_scatter", 1),
    c10d.reduce_scatter_tensor_coalesced_.default: ("reduce_scatter", 1),
    c10d._allgather_base_.default: ("all_gather", 0), c10d.allgather_.default: ("all_gather", 0),
    c10d.allgather_into_tensor_coalesced_.default: ("all_gather", 0),
    c10d.broadcast_.default: ("broadcast", 0),
    c10d.alltoall_base_.default: ("all_to_all", 1),
    c10d.send.default: ("send_recv", 0), c10d.recv_.default: ("send_recv", 0),
}
_FUNCTIONAL = {
    funcol.all_reduce.default: "all_reduce", funcol.all_reduce_coalesced.default: "all_reduce",
    funcol.reduce_scatter_tensor.default: "reduce_scatter",
    funcol.reduce_scatter_tensor_coalesced.default: "reduce_scatter",
    funcol.all_gather_into_tensor.default: "all_gather",
    funcol.all_gather_into_tensor_coalesced.default: "all_gather",
    funcol.all_to_all_single.default: "all_to_all", funcol.broadcast.default: "broadcast",
}
# Waiting on a send or receive at once could deadlock a pipeline schedule that posts its sends
# before the peer's matching receives: point-to-point is counted, not timed.
_UNTIMED = {"send_recv"}


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        local = value.to_local() if hasattr(value, "to_local") else value
        return local.numel() * local.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _works(result) -> list:
    items = result if isinstance(result, (list, tuple)) else [result]
    return [w for w in items if hasattr(w, "wait") and not isinstance(w, torch.Tensor)]


class CommCounter(TorchDispatchMode):
    """with CommCounter() as c: step(); c.summary() -> {kind: {"bytes", "calls", "time_s"}}."""

    def __init__(self):
        super().__init__()
        self.reset()

    def reset(self) -> None:
        self.bytes: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _C10D:
            kind, arg = _C10D[func]
            size = _nbytes(args[arg])
        elif func in _FUNCTIONAL:
            kind = _FUNCTIONAL[func]
            size = _nbytes(args[0])
            if kind == "all_gather":
                size *= args[1]  # group size: the gathered output
        else:
            return func(*args, **kwargs)
        t0 = time.perf_counter()
        result = func(*args, **kwargs)
        if kind not in _UNTIMED:
            if func in _FUNCTIONAL:
                result = funcol.wait_tensor.default(result) if isinstance(result, torch.Tensor) else result
            for work in _works(result):
                work.wait()
            self.seconds[kind] += time.perf_counter() - t0
        self.bytes[kind] += size
        self.calls[kind] += 1
        return result

    def summary(self) -> dict[str, dict]:
        return {kind: {"bytes": self.bytes[kind], "calls": self.calls[kind],
                       "time_s": None if kind in _UNTIMED else round(self.seconds[kind], 6)}
                for kind in sorted(self.calls)}

    def total(self) -> tuple[int, float]:
        """(bytes, seconds) of every timed collective: what a probe step spent communicating."""
        return (sum(self.bytes[k] for k in self.calls if k not in _UNTIMED),
                sum(self.seconds[k] for k in self.calls if k not in _UNTIMED))


# A module function with its counter as DDP's hook state, not a bound method: DDP's C++ reducer keeps the
# hook, and one that reached back to the DDP module would make a cycle the garbage collector cannot see; the
# reducer would live until interpreter shutdown, where freeing its Python futures aborts the process.
# No annotations: DDP checks them against dist.GradBucket.
def _counted_allreduce_hook(counter, bucket):
    with counter:
        return default_hooks.allreduce_hook(None, bucket)


def count_ddp_allreduce(ddp_model, counter: CommCounter) -> None:
    """DDP all-reduces its gradient buckets in C++, out of a dispatch mode's sight. Its reference comm hook
    (default_hooks.allreduce_hook: the same averaging all-reduce per bucket) issues them through
    torch.distributed; run inside `counter`, each is counted and waited for. Only the hook is counted, so the
    rest of the step runs at full speed. For probe steps only, after the measured window."""
    ddp_model.register_comm_hook(counter, _counted_allreduce_hook)


LINK_PROBE_REPEATS = 3
MIN_LINK_PROBE_BYTES = 1 << 20  # small buffers measure latency, not the link


def _timed(collective, device: torch.device, group) -> list[float]:
    """Seconds of each of LINK_PROBE_REPEATS calls after a warm-up, every rank starting together."""
    times = []
    for i in range(LINK_PROBE_REPEATS + 1):
        dist.barrier(group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        collective()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - t0)
    return times


def link_probe(nbytes: float, device: torch.device, group=None) -> tuple[int, int, list[float]]:
    """A plain all-reduce of about `nbytes` on `group` (default: the world), timed a few times after a warm-up:
    (ranks, bytes, seconds of each), for the link's bandwidth."""
    ranks = dist.get_world_size(group)
    buffer = torch.zeros(max(int(nbytes), MIN_LINK_PROBE_BYTES) // 4, dtype=torch.float32, device=device)
    return ranks, buffer.numel() * 4, _timed(lambda: dist.all_reduce(buffer, group=group), device, group)


def kinds_probe(nbytes: float, device: torch.device, group=None) -> tuple[int, int, dict[str, list[float]]]:
    """FSDP's collectives, a reduce-scatter and an all-gather of about `nbytes` (the whole buffer) on `group`,
    timed as link_probe times its all-reduce: (ranks, bytes, seconds of each per kind). A backend need not run
    them as the ring nccl-tests' factors describe: Gloo on the 2-core VM, two ranks, 18.9 MB, took 14.7 ms to
    all-reduce, 20.6 ms to reduce-scatter and 17.7 ms to all-gather (docs/prediction.md)."""
    ranks = dist.get_world_size(group)
    numel = max(int(nbytes), MIN_LINK_PROBE_BYTES) // 4 // ranks * ranks
    whole = torch.zeros(numel, dtype=torch.float32, device=device)
    shard = torch.zeros(numel // ranks, dtype=torch.float32, device=device)
    return ranks, numel * 4, {
        "reduce_scatter": _timed(lambda: dist.reduce_scatter_tensor(shard, whole, group=group), device, group),
        "all_gather": _timed(lambda: dist.all_gather_into_tensor(whole, shard, group=group), device, group)}
