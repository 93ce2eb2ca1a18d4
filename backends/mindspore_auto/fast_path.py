"""mindspore_auto's fast path (backend_metrics.fast_path): what MindSpore documents for speed, what parbench turns
on and why. On by default where the numerics stay within parity's tolerances; an option otherwise."""
from __future__ import annotations

from common.config import RunConfig
from common.sections import FastPath

WHY = {
    "graph_mode": "on: the train step is one compiled graph (GRAPH_MODE), MindSpore's documented way to train fast",
    "jit_level": "O0 (MindSpore's default) unless --compile asks for O1 (operator fusion and graph optimisations), "
                 "an option: fusion reorders float operations",
    "matmul_precision": "float32 products stay float32 (MindSpore has no TF32 switch on CPUs); --precision fp16 casts "
                        "them to float16 (amp O1)",
}


def fast_path(cfg: RunConfig, jit_level: str) -> FastPath:
    options = {"graph_mode": True, "jit_level": jit_level,
               "matmul_precision": "float16" if cfg.precision == "fp16" else "float32"}
    return FastPath(options, dict(WHY))
