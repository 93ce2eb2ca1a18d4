"""The torch internals a measurement reads (backends/torch_common/internals.py): present in this torch, and
when one is gone the probe says "not measured" instead of failing the run."""
from __future__ import annotations

import importlib

import pytest

from backends.torch_common import internals


def test_this_torch_still_has_the_pipeline_wait_the_bubble_probe_times():
    module, name = internals.PIPELINE_WAIT
    assert hasattr(importlib.import_module(module), name), (
        f"torch no longer has {module}.{name}: the pipeline bubble (backend_metrics.bubble.measured) is not "
        "measured with this torch; find its new place and update backends/torch_common/internals.py")


def test_the_pipeline_wait_timer_times_the_wait_and_puts_the_original_back():
    module = importlib.import_module(internals.PIPELINE_WAIT[0])
    original = getattr(module, internals.PIPELINE_WAIT[1])
    calls = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, internals.PIPELINE_WAIT[1], lambda work: calls.append(work))
        replaced = getattr(module, internals.PIPELINE_WAIT[1])
        with internals.pipeline_wait_timer() as waited:
            getattr(module, internals.PIPELINE_WAIT[1])("work")
        assert calls == ["work"] and waited.seconds >= 0
        assert getattr(module, internals.PIPELINE_WAIT[1]) is replaced
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
