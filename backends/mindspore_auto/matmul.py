"""MindSpore's part of the achievable-peak probe (common.achievable): timed square products on this
process's device."""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from common.achievable import timed_repeats
from common.peak_flops import PRECISION_MATH

# The dtype a run's --precision puts MindSpore's matrix products in (amp O1's float16 MatMul for fp16).
MATMUL_DTYPES = {"fp16": ms.float16, "fp32": ms.float32}


def time_matmul(precision: str, n: int, repeats: int, seed: int = 0) -> tuple[str, list[float]]:
    """(math mode, seconds of each of `repeats` n x n x n products after an untimed one); each product is
    reduced to a scalar and read, which waits for the device."""
    rng = np.random.default_rng(seed)
    a, b = (Tensor(rng.standard_normal((n, n), np.float32), MATMUL_DTYPES[precision]) for _ in range(2))
    return PRECISION_MATH[precision], timed_repeats(lambda: ops.matmul(a, b).sum().asnumpy(), repeats)
