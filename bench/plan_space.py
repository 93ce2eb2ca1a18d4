"""What a backend refuses of a layout, asked of the same checks a run meets (bench.run's check_run and the backend's
own): bench.plan hands it to common.plan.space as its `refuse`, so the planner keeps no list of its own."""
from __future__ import annotations

from collections.abc import Callable

from backends import load_backend
from bench import run as bench_run
from common.config import RunConfig
from common.devices import cpu_plan, cuda_plan
from common.errors import BadInput, Unsupported
from common.layout import Layout
from common.predict.hardware import Hardware


def backend_refusal(backend: str, workload: str, size: str, devices: int, global_batch: int, precision: str,
                    hardware: Hardware) -> Callable[[Layout], str | None]:
    """A function: layout -> why `backend` would not run it on `devices` of `hardware` (None: it would)."""
    runner = load_backend(backend)  # Unsupported where its framework is missing: the plan cannot be checked
    parser = bench_run.build_parser()
    devices_plan = cpu_plan(devices, 1) if hardware.device_kind == "cpu" else \
        cuda_plan(devices, devices, [hardware.device_name or "CUDA device"] * devices)

    def refuse(layout: Layout) -> str | None:
        argv = ["--backend", backend, "--workload", workload, "--model-size", size, "--devices", str(devices),
                "--scaling", "strong", "--batch-size", str(global_batch), "--precision", precision,
                "--data", "synthetic", *layout.run_flags()]
        try:
            # fit=False: whether a layout fits is the plan's own question, against the plan's memory limit.
            checked = bench_run.check_run(parser.parse_args(argv), fit=False)
            cfg = RunConfig(run_id="plan", backend=backend, workload=workload, devices=devices,
                            device_kind=devices_plan.kind, threads_per_device=devices_plan.threads_per_device,
                            scaling="strong", batch_size=global_batch, per_device_batch=checked.per_device_batch,
                            grad_accum=1, data="synthetic", data_dir="", seed=0, total_steps=1, warmup_steps=0,
                            out="", model_size=size, precision=precision, layout=checked.layout)
            bench_run.check_supported(backend, runner, cfg, devices_plan)
        except (BadInput, Unsupported) as exc:
            return str(exc)
        return None
    return refuse
