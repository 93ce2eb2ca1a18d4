"""The fast path of every torch backend (backend_metrics.fast_path): what torch documents for speed, what parbench
turns on, and why. On by default where the numerics stay within parity's tolerances; an option otherwise.
bench.calibrate's bare loops build their optimizer here too, so that both halves of a calibration run alike."""
from __future__ import annotations

import sys

import torch

from backends.torch_common.internals import sdpa_backend
from common.config import RunConfig
from common.sections import FastPath
from common.spec import BertSpec, OptimSpec

WHY = {
    "fused_adamw": "on: torch's AdamW documents fused as its fastest implementation (one kernel for the whole update, "
                   "on CPUs and GPUs), the same arithmetic as the default foreach loop; measured on one CPU core for "
                   "tiny BERT's parameters: 14 ms per update against 144 ms",
    "sdpa_kernel": "the kernel F.scaled_dot_product_attention dispatches to for the model's shapes, dtype and dropout "
                   "(torch._fused_sdp_choice): flash attention where the inputs allow it, else the math kernel",
    "torch_compile": "an option (--compile): it fuses and reorders float operations, and compiles for minutes on a "
                     "CPU; off by default",
    "float32_matmul_precision": "torch's default ('highest'): 'high' would run float32 products as TF32 on GPUs, "
                                "beyond parity's tolerances",
}


def adamw(params, optim: OptimSpec) -> torch.optim.AdamW:
    """The suite's AdamW, fused (WHY). The fused kernel takes one parameter group at a time, and a group cannot mix
    DTensors with plain tensors (tensor parallelism leaves the norms whole): each kind gets a group of its own,
    with the same hyperparameters."""
    params = list(params)
    kinds = [[p for p in params if _is_dtensor(p) is sharded] for sharded in (False, True)]
    return torch.optim.AdamW([{"params": kind} for kind in kinds if kind], lr=optim.lr,
                             betas=(optim.beta1, optim.beta2), eps=optim.eps, weight_decay=optim.weight_decay,
                             fused=True)


def _is_dtensor(tensor) -> bool:
    # A DTensor exists only where torch.distributed.tensor was imported (torch_3d's layouts): importing it for this
    # check alone cost every torch_ddp and torch_dp worker 0.9 s of its start.
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def attention_kernel(spec, device: torch.device, precision: str) -> str:
    """What SDPA runs for one sequence of the model (the kernel choice does not depend on the batch)."""
    if not isinstance(spec, BertSpec):
        return "none (no attention)"
    dtype = {"amp": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    q = torch.zeros(1, spec.heads, spec.seq_len, spec.head_dim, dtype=dtype, device=device)
    mask = torch.ones(1, 1, 1, spec.seq_len, dtype=torch.bool, device=device)
    return sdpa_backend(q, q, q, mask, spec.dropout) or "not measured"


def fast_path(cfg: RunConfig, device: torch.device, fused_adamw: bool) -> FastPath:
    options = {"fused_adamw": fused_adamw, "sdpa_kernel": attention_kernel(cfg.spec, device, cfg.precision),
               "torch_compile": cfg.compile or False,
               "float32_matmul_precision": torch.get_float32_matmul_precision()}
    return FastPath(options, dict(WHY))
