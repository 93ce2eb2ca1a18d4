"""torch's part of bench.compute_table: the kernels of a training step timed one by one on one device.

Each figure is the median of a few timed batches of back-to-back kernels issued from Python, as an eager step
issues them, the device synchronised around each batch; a batch repeats its kernel until it lasts about
`target_s`, so that small kernels are timed over many launches. On a GPU the clock is CUDA events; on a CPU the
wall clock (the same code, so that every path runs in the tests).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from common.spec import attention_flops

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
BATCHES = 5


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _calls_for(device: torch.device, fn: Callable[[], object], target_s: float) -> int:
    """How many back-to-back calls of `fn` last about `target_s`, after an untimed warm-up call."""
    fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return max(1, min(1000, round(target_s / max(time.perf_counter() - t0, 1e-7))))


def _batch_s(device: torch.device, fn: Callable[[], object], calls: int) -> float:
    """Seconds of one call of `fn`, over a batch of `calls` back-to-back calls (CUDA events on a GPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def seconds_per_call(device: torch.device, fn: Callable[[], object], target_s: float) -> float:
    """Median seconds of one call of `fn` over BATCHES timed batches, after an untimed warm-up call."""
    calls = _calls_for(device, fn, target_s)
    return statistics.median(_batch_s(device, fn, calls) for _ in range(BATCHES))


def _gemm(device: torch.device, precision: str, m: int, n: int, k: int) -> Callable[[], object]:
    """C[m, n] = A[m, k] B[k, n] at `precision` (bf16/fp16/fp32: torch.matmul; fp8: torch._scaled_mm, e4m3
    operands with per-tensor scales and a bf16 result, as Float8 training runs its linear layers). Random
    normal operands: a GPU draws less power, and so clocks higher, on zeros or repeated values than on data
    like a training step's."""
    if precision == "fp8":
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs
        one = torch.ones((), device=device)

        def product():
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return product
    dtype = DTYPES[precision]
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    out = torch.empty(m, n, device=device, dtype=dtype)
    return lambda: torch.matmul(a, b, out=out)


def gemm_tflops(device: torch.device, precision: str, shapes: list[tuple[int, int, int]], target_s: float,
                rounds: int = BATCHES) -> list[float]:
    """TFLOP/s of each GEMM (`_gemm`) of `shapes`, the median of `rounds` timed batches taken in passes through
    all the shapes, not one shape's batches back to back: a transient (a host stall that drains the launch
    queue, a clock dip) then costs one batch of a few neighbouring shapes instead of every batch of one shape.
    The first measured table timed shapes one after the other; a repeat found seven neighbouring shapes 2-5
    times slow, and they moved one published point by 10%."""
    calls = [_calls_for(device, _gemm(device, precision, *shape), target_s) for shape in shapes]
    batches: list[list[float]] = [[] for _ in shapes]
    for _ in range(rounds):
        for i, shape in enumerate(shapes):
            product = _gemm(device, precision, *shape)  # operands made again: the shapes do not all fit at once
            product()
            batches[i].append(_batch_s(device, product, calls[i]))
    return [2.0 * m * n * k / statistics.median(b) / 1e12 for (m, n, k), b in zip(shapes, batches)]


def sustained_gemm(device: torch.device, precision: str, m: int, n: int, k: int, seconds: float,
                   interval_s: float) -> list[list[float]]:
    """[seconds since the start, TFLOP/s] of one GEMM run back to back for `seconds`, one sample per
    `interval_s`: how its rate moves from the first fraction of a second (where a short timing lives) to the
    clocks a device holds under a long run's power and heat."""
    product = _gemm(device, precision, m, n, k)
    calls = _calls_for(device, product, interval_s)
    series, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        elapsed = _batch_s(device, product, calls) * calls
        series.append([round(t0 - start, 3), 2.0 * m * n * k * calls / elapsed / 1e12])
        # The next sample as long, whatever the clocks do now; at most 8 times the calls, so that one sample timed
        # short (a loaded host) cannot size the next one past the whole run (CI: two samples in 3 s, 0.0 and 0.003).
        calls = max(1, min(8 * calls, round(calls * interval_s / elapsed)))
    return series


def sdpa_backend(kernel: str):
    """The SDPA backend a kernel name of the compute table stands for."""
    from torch.nn.attention import SDPBackend
    return {"torch_flash": SDPBackend.FLASH_ATTENTION, "torch_cudnn": SDPBackend.CUDNN_ATTENTION,
            "torch_efficient": SDPBackend.EFFICIENT_ATTENTION, "torch_math": SDPBackend.MATH}[kernel]


def attention_tflops(device: torch.device, kernel: str, precision: str, seq: int, tokens: int, heads: int,
                     head_dim: int, target_s: float) -> tuple[float, float]:
    """(forward, backward) TFLOP/s of causal scaled-dot-product attention through `kernel`, tokens / seq
    sequences of `heads` heads; FLOPs in the flash-attention papers' convention (common.spec.attention_flops),
    the backward timed as forward-and-backward less the forward."""
    from torch.nn.attention import sdpa_kernel
    batch = max(1, tokens // seq)
    dtype = DTYPES[precision]
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype)
    attend = torch.nn.functional.scaled_dot_product_attention

    with sdpa_kernel(sdpa_backend(kernel)):
        def forward():
            with torch.no_grad():
                return attend(q, k, v, is_causal=True)

        def forward_backward():
            out = attend(q, k, v, is_causal=True)
            torch.autograd.grad(out, (q, k, v), grad)

        fwd_s = seconds_per_call(device, forward, target_s)
        both_s = seconds_per_call(device, forward_backward, target_s)
    flops = attention_flops(batch * seq, seq, heads * head_dim, causal=True)
    bwd_s = max(both_s - fwd_s, 1e-12)
    return flops / fwd_s / 1e12, flops * 2.5 / bwd_s / 1e12


def copy_GBps(device: torch.device, nbytes: int, target_s: float) -> float:
    """A device-to-device copy of `nbytes`: bytes read and written per second, in 1e9 B/s."""
    src = torch.empty(nbytes // 2, device=device, dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    return 2.0 * nbytes / seconds_per_call(device, lambda: dst.copy_(src), target_s) / 1e9


def launch_us(device: torch.device, kernels: int = 200) -> dict[str, float | None]:
    """The shortest kernel's time: `eager` one tiny add after another from Python (what an eager step pays per
    kernel), `graph` the same adds replayed from a CUDA graph (the GPU's own floor; null on a CPU)."""
    x = torch.zeros(1, device=device)

    def adds():
        for _ in range(kernels):
            x.add_(1.0)

    eager = seconds_per_call(device, adds, 0.05) / kernels * 1e6
    graph = None
    if device.type == "cuda":
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            adds()
        torch.cuda.current_stream(device).wait_stream(stream)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            adds()
        graph = seconds_per_call(device, captured.replay, 0.05) / kernels * 1e6
    return {"eager": eager, "graph": graph}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform
    return platform.processor() or platform.machine()


def software() -> str:
    cuda = torch.version.cuda
    return f"torch {torch.__version__}" + (f", CUDA {cuda}" if cuda else "")
