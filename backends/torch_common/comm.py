"""Counting the communication a torch step actually issues: bytes, calls and time per kind of collective.

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
