"""The torch internals a measurement reads (backends/torch_common/internals.py): present in this torch, and
when one is gone the probe says "not measured" instead of failing the run."""
from __future__ import annotations

import importlib
import time

import pytest

from backends.torch_common import internals

WAIT_S = 0.05


def test_this_torch_still_has_the_pipeline_wait_the_bubble_probe_times():
    module, name = internals.PIPELINE_WAIT
    assert hasattr(importlib.import_module(module), name), (
        f"torch no longer has {module}.{name}: the pipeline bubble (backend_metrics.bubble.measured) is not "
        "measured with this torch; find its new place and update backends/torch_common/internals.py")


def test_the_pipeline_wait_timer_times_the_wait_and_puts_the_original_back():
    module = importlib.import_module(internals.PIPELINE_WAIT[0])
    original = getattr(module, internals.PIPELINE_WAIT[1])
    calls = []

    def wait(work):  # a wait that takes WAIT_S, as a stage waiting for its neighbour's activations
        time.sleep(WAIT_S)
        calls.append(work)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, internals.PIPELINE_WAIT[1], wait)
        with internals.pipeline_wait_timer() as waited:
            getattr(module, internals.PIPELINE_WAIT[1])("work")
            time.sleep(4 * WAIT_S)  # in the block but no wait (the stage computing): not counted
            getattr(module, internals.PIPELINE_WAIT[1])("work")
        assert calls == ["work", "work"]
        assert 2 * WAIT_S <= waited.seconds < 5 * WAIT_S  # both waits, summed, and nothing else
        assert getattr(module, internals.PIPELINE_WAIT[1]) is wait
    assert getattr(module, internals.PIPELINE_WAIT[1]) is original


def test_without_the_internal_the_bubble_is_not_measured_and_nothing_fails():
    module = importlib.import_module(internals.PIPELINE_WAIT[0])
    with pytest.MonkeyPatch.context() as patch:
        patch.delattr(module, internals.PIPELINE_WAIT[1])
        with internals.pipeline_wait_timer() as waited:
            pass
        assert waited.seconds is None


def test_this_torch_still_has_what_the_collective_counter_dispatches_on():
    """backends/torch_common/comm.py counts collectives with a TorchDispatchMode over c10d and functional ops."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401  (the documented extension point)

    assert hasattr(torch.ops.c10d, "allreduce_") and hasattr(torch.ops._c10d_functional, "all_reduce")
