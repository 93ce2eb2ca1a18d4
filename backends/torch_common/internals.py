"""The torch internals a measurement needs where no public API offers it, in one guarded place.

A probe here measures, never trains: when a torch release renames or removes the internal it reads,
the probe says "not measured" (None) and the run goes on. tests/test_torch_internals.py fails loudly
when an internal is gone, so that an upgrade of torch says which measurement it took away.
"""
from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Iterator

import torch

# torch.distributed.pipelining's schedules wait for each batch of a stage's sends and receives here:
# the time a stage waits for its neighbours (its idle share of a step). No public hook exposes it.
PIPELINE_WAIT = ("torch.distributed.pipelining.schedules", "_wait_batch_p2p")


class Stopwatch:
    seconds: float | None = 0.0  # None: not measured (the internal is gone)


@contextlib.contextmanager
def pipeline_wait_timer() -> Iterator[Stopwatch]:
    """Within the block, the seconds pipeline schedules spend waiting on their point-to-point batches."""
    watch = Stopwatch()
    module = importlib.import_module(PIPELINE_WAIT[0])
    original = getattr(module, PIPELINE_WAIT[1], None)
    if original is None:
        watch.seconds = None
        yield watch
        return

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            watch.seconds += time.perf_counter() - t0

    setattr(module, PIPELINE_WAIT[1], timed)
    try:
        yield watch
    finally:
        setattr(module, PIPELINE_WAIT[1], original)


def sdpa_backend(query, key, value, mask, dropout: float) -> str | None:
    """The kernel F.scaled_dot_product_attention picks for these inputs (torch.nn.attention.SDPBackend's name, e.g.
    FLASH_ATTENTION, MATH), by torch's own dispatcher (torch._fused_sdp_choice); None where that is gone."""
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return None
    try:
        chosen = int(choose(query, key, value, mask, dropout, False))
    except (RuntimeError, TypeError):
        return None
    names = {int(v): k for k, v in torch.nn.attention.SDPBackend.__members__.items()}
    return names.get(chosen)
