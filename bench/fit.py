"""The fit check before launch from a run's command line (bench.run's check_run, and so bench.compare's every run),
with --out's records and validation.json; the rule is common.plan.fit's."""
from __future__ import annotations

import json
import math
import os
import socket
from functools import lru_cache
from pathlib import Path

from common.devices import gpu_memory_bytes
from common.layout import Layout
from common.plan.fit import GIB, DoesNotFit, measured_overhead, predicted_check, refusal
from common.results import load_records
from common.sections import FitCheck
from common.spec import DEFAULTS, model_spec

VALIDATION = "validation.json"  # bench.reporting.validation.FILE: bench imports stay top-down from here


def device_limit(args, devices_per_node: int) -> tuple[float | None, str, str]:
    """(bytes per device or None, where that limit comes from, the device kind it is of)."""
    gpus = gpu_memory_bytes() if args.device_kind != "cpu" else ()
    kind = "cuda" if gpus else "cpu"
    if args.memory_per_device:
        return args.memory_per_device * GIB, f"--memory-per-device {args.memory_per_device:g} GiB", kind
    if gpus:
        share = math.ceil(devices_per_node / len(gpus))
        return (min(gpus) / share, f"the GPU's memory (nvidia-smi: {min(gpus) / GIB:.1f} GiB"
                + (f", shared by {share} devices)" if share > 1 else ")"), kind)
    return None, "no device limit known (a CPU device: give --memory-per-device)", kind


@lru_cache(maxsize=4)
def _folder(out: str, stamp: int | None) -> tuple[list[dict], float | None]:
    """--out's records and the model's largest measured memory error; `stamp` (runs/'s mtime) renews it."""
    try:
        summary = json.loads((Path(out) / VALIDATION).read_text())["summary"]["all"]["memory_per_rank"]
        error = summary.get("max_abs_error")
    except (OSError, ValueError, KeyError, TypeError):
        error = None
    return load_records(Path(out)), error


def _stamp(out: Path) -> int | None:
    """runs/'s modification time; None without one (0 is a time: an archive's reproducible stamp)."""
    try:
        return os.stat(out / "runs").st_mtime_ns
    except OSError:
        return None


def fit_before_launch(args, layout: Layout, global_batch: int, devices_per_node: int) -> FitCheck:
    """The run's fit check; DoesNotFit (bad input, one line with the figures) when it is predicted not to fit,
    unless --no-fit-check."""
    available, limit, kind = device_limit(args, devices_per_node)
    spec = model_spec(args.workload, args.model_size)
    records, error = _folder(str(Path(args.out).resolve()), _stamp(Path(args.out)))
    overhead = measured_overhead(spec, records, args.backend, args.workload, args.precision, kind,
                                 socket.gethostname())
    eval_batch = None if args.skip_eval else DEFAULTS[args.workload].eval_batch
    check = predicted_check(spec, layout, global_batch, args.backend, args.precision, eval_batch, available, limit,
                            overhead, error)
    if check.verdict == "does not fit" and not args.no_fit_check:
        raise DoesNotFit(refusal(check, layout), check)
    return check
