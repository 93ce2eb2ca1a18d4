"""torch's part of the achievable-peak probe (common.achievable): timed square products on one device."""
from __future__ import annotations

import torch

from common.achievable import timed_repeats
from common.peak_flops import PRECISION_MATH

# The dtype a run's --precision puts torch's matrix products in (autocast's, as the training runs them).
MATMUL_DTYPES = {"amp": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def math_mode(device: torch.device, precision: str) -> str:
    """The math mode of a float32 product: TF32 where torch allows it on this GPU (common.peak_flops)."""
    if precision == "fp32" and device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return PRECISION_MATH[precision]


def time_matmul(device: torch.device, precision: str, n: int, repeats: int) -> tuple[str, list[float]]:
    """(math mode, seconds of each of `repeats` n x n x n products after an untimed one), synchronised; on a
    CPU on the threads torch has (set to the device's at the worker's start)."""
    dtype = MATMUL_DTYPES[precision]
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    out = torch.empty(n, n, device=device, dtype=dtype)

    def product():
        torch.matmul(a, b, out=out)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return math_mode(device, precision), timed_repeats(product, repeats)
