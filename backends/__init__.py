"""The backend registry: a name on the command line -> the class that runs it, its framework and pip extra."""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from common.errors import Unsupported


@dataclass(frozen=True)
class Entry:
    """What the harness may know of a backend without importing its framework: where it lives, what it
    needs installed, and what it supports, so that a sweep can check every planned run before any starts."""
    module: str | None   # None while the backend is not built
    cls: str
    framework: str       # the top-level import the backend needs
    extra: str           # pip install 'parbench[extra]'
    pending: str = ""    # the issue that builds it, while module is None
    # Run options only this backend takes (bench.cli declares them; bench.run refuses them elsewhere).
    options: tuple[str, ...] = ()
    # What it executes of a layout beyond data parallelism (common.layout.FEATURES: tensor, pipeline, sharded
    # state...); it refuses the rest by flag, in one line (common.layout.refuse_layout). Empty: data parallel only.
    layouts: frozenset[str] = frozenset()
    # Its own reason for a feature it does not execute, where it has one: (feature, why), said after the flag.
    refusals: tuple[tuple[str, str], ...] = ()
    # Runs every layout common.layout defines, pipelines included, wherever it runs (CPU and CUDA): what
    # `--layouts` sweeps and checks when no --backends is given.
    every_layout: bool = False


BACKENDS = {
    "torch_dp": Entry("backends.torch_dp.backend", "TorchDP", "torch", "torch"),
    "torch_ddp": Entry("backends.torch_ddp.backend", "TorchDDP", "torch", "torch", options=("max_restarts",)),
    "torch_3d": Entry("backends.torch_3d.backend", "Torch3D", "torch", "torch", every_layout=True,
                      layouts=frozenset({"tp", "pp", "fsdp", "zero2", "micro_batches", "1f1b", "recompute",
                                         "vocab_split", "stage_split"})),
    "tf_mirrored": Entry("backends.tf_mirrored.backend", "TFMirrored", "tensorflow", "tf", options=("tf_mode",)),
    "mindspore_auto": Entry("backends.mindspore_auto.backend", "MindSporeAuto", "mindspore", "mindspore",
                            options=("parallel_mode",),
                            layouts=frozenset({"tp", "pp", "fsdp", "micro_batches", "1f1b", "recompute",
                                               "vocab_split"}),
                            refusals=(("stage_split", "mindspore_auto cuts its pipeline evenly (pipeline_stage "
                                                      "per layer in the tutorial's rule); torch_3d places layers by "
                                                      "cost"),)),
    "keras_jax": Entry("backends.keras_jax.backend", "KerasJax", "jax", "jax", options=("jax_mode",),
                       layouts=frozenset({"tp", "fsdp", "recompute", "vocab_split"}),
                       refusals=(("pp", "keras.distribution has no pipeline parallelism (its layouts shard tensors "
                                        "over a device mesh; GSPMD does not schedule stages)"),)),
}
# Every run option that belongs to one backend.
EXECUTED_BY = {f: [name for name, e in BACKENDS.items() if f in e.layouts] for f in
               sorted({f for e in BACKENDS.values() for f in e.layouts})}
BACKEND_ONLY = frozenset(option for entry in BACKENDS.values() for option in entry.options)


def layout_backend() -> str | None:
    """The backend `--layouts` runs by default: the first registered one that runs every layout (None: none is)."""
    return next((name for name, entry in BACKENDS.items() if entry.every_layout and entry.module), None)


def load_backend(name: str):
    """An instance of backend `name`; Unsupported when it is not built or its framework is missing."""
    entry = BACKENDS[name]
    if entry.module is None:
        raise Unsupported(f"backend {name} is not built yet ({entry.pending})")
    # The parent side of a backend imports its framework only when it must (a GPU to count): ask for it here.
    if importlib.util.find_spec(entry.framework) is None:
        raise Unsupported(f"{entry.framework} is not installed: pip install 'parbench[{entry.extra}]'")
    try:
        return getattr(importlib.import_module(entry.module), entry.cls)()
    except ImportError as exc:
        if exc.name and exc.name.split(".")[0] == entry.framework:
            raise Unsupported(f"{entry.framework} is not installed: pip install 'parbench[{entry.extra}]'") from None
        raise
