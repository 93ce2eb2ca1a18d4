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


def test_this_torch_still_says_which_kernel_sdpa_takes_and_a_missing_chooser_is_not_measured():
    """fast_path's sdpa_kernel: on a CPU, flash attention without dropout, the math kernel with it."""
    import torch

    from backends.torch_common.fast_path import attention_kernel
    from common.spec import BERT_SIZES, CNN

    q = torch.zeros(1, 2, 16, 64)
    mask = torch.ones(1, 1, 1, 16, dtype=torch.bool)
    assert internals.sdpa_backend(q, q, q, mask, 0.0) == "FLASH_ATTENTION", "torch._fused_sdp_choice moved"
    assert internals.sdpa_backend(q, q, q, mask, 0.1) == "MATH"
    assert attention_kernel(BERT_SIZES["tiny"], torch.device("cpu"), "fp32") == "FLASH_ATTENTION"
    assert attention_kernel(CNN, torch.device("cpu"), "fp32") == "none (no attention)"
    with pytest.MonkeyPatch.context() as patch:
        patch.delattr(torch, "_fused_sdp_choice")
        assert internals.sdpa_backend(q, q, q, mask, 0.0) is None
        assert attention_kernel(BERT_SIZES["tiny"], torch.device("cpu"), "fp32") == "not measured"


def test_fused_adamw_takes_dtensors_and_plain_tensors_in_groups_of_their_own():
    """Tensor parallelism leaves the norms whole: one fused AdamW over both kinds must still step."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from backends.torch_common.fast_path import adamw
    from common.spec import DEFAULTS

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        plain = torch.nn.Parameter(torch.ones(4))
        sharded = torch.nn.Parameter(distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)]))
        optimizer = adamw([plain, sharded], DEFAULTS["mlm"].optim)
        assert [len(g["params"]) for g in optimizer.param_groups] == [1, 1] and optimizer.defaults["fused"]
        for p in (plain, sharded):
            p.grad = torch.ones_like(p)
        optimizer.step()
        assert float(plain.detach()[0]) < 1.0 and float(sharded.detach().full_tensor()[0, 0]) < 1.0
    finally:
        dist.destroy_process_group()
