"""PyTorch nn.DataParallel: one process scatters each global batch over N CUDA devices."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from backends.torch_common.backend import TorchBackend
from backends.torch_common.launch import cuda_device_names, plan_over
from common.config import RunConfig
from common.devices import DevicePlan
from common.errors import Unsupported
from common.launch import OneProcess, launch


def data_parallel_plan(count: int, kind: str, threads_per_device: int, gpu_names: list[str]) -> DevicePlan:
    """torch's plan (plan_over), for one process: CPU only at one device, virtual devices as replicas."""
    plan = plan_over(count, kind, threads_per_device, gpu_names)
    if plan.kind == "cpu" and count > 1:
        raise Unsupported(f"nn.DataParallel with {count} devices needs CUDA devices; "
                          + ("--device-kind cpu asked for CPU" if gpu_names else "this machine has none"))
    if plan.kind == "cuda" and plan.virtual:
        # Like TensorFlow's logical GPUs: N replicas over fewer GPUs, if DataParallel accepts it.
        device_ids = [i % len(plan.hardware) for i in range(count)]
        return dataclasses.replace(plan, description=f"{count} replicas on {plan.physical_devices} x "
                                                     f"{plan.hardware[0]} (device_ids={device_ids})")
    return plan


class TorchDP(TorchBackend):
    name = "torch_dp"
    strategy = "DataParallel"

    def plan_devices(self, count: int, kind: str, threads_per_device: int) -> DevicePlan:
        return data_parallel_plan(count, kind, threads_per_device, cuda_device_names())

    def check(self, cfg: RunConfig, plan: DevicePlan) -> None:
        if cfg.sync_bn:
            raise Unsupported("--sync-bn: nn.DataParallel has no SyncBatchNorm (it needs DDP process groups)")
        if cfg.compile and plan.kind == "cuda" and cfg.devices > 1:
            raise Unsupported("--compile: torch.compile cannot trace nn.DataParallel's replicate and threaded "
                              "parallel_apply, and a compiled module does not replicate; compile runs on 1 device")

    def run_bare(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        return launch(cfg, workdir, ["-m", "backends.torch_dp.bare"],
                      OneProcess(self._env(plan), workdir / "bare.log", cfg.timeout_s, "bare torch loop"))

    def run(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        outcome = launch(cfg, workdir, ["-m", "backends.torch_dp.worker"],
                         OneProcess(self._env(plan), workdir / "worker.log", cfg.timeout_s, "DataParallel worker"))
        phases = (outcome.get("backend_metrics") or {}).get("phase_s_per_step")
        step = (outcome.get("step_time_s") or {}).get("mean")
        if phases and step:
            outcome["backend_metrics"]["phase_share_of_step"] = {k: v / step for k, v in phases.items()}
        return outcome

    @staticmethod
    def _env(plan: DevicePlan) -> dict[str, str]:
        return {"OMP_NUM_THREADS": str(max(1, plan.threads_per_device))}

    def notes(self, cfg: RunConfig, plan: DevicePlan) -> list[str]:
        notes = self.precision_notes(cfg)
        if plan.kind == "cuda":
            from backends.torch_dp.timed import HOW  # imports torch: only on a CUDA plan, where torch is there

            notes.append("one process; each forward scatters the batch over the devices, replicates the "
                         "module and gathers the outputs on the first device")
            notes.append(f"phase times (backend_metrics.phase_s_per_step): {HOW}")
        if plan.kind == "cuda" and plan.virtual:
            notes.append("virtual devices: GPUs repeated in device_ids; replicas share their compute")
            notes.append("before training, one step's whole gradient through DataParallel is held against the plain "
                         "module's (relative error <= 1e-4, mlm). Not per parameter: the attention key biases' "
                         "gradient is exactly zero in exact arithmetic (softmax is shift-invariant), so its own "
                         "relative error is rounding noise (0.64-1.13 on an H100, other parameters within 2e-6), "
                         "which the per-parameter probe took for DataParallel being wrong")
        if plan.kind == "cpu":
            notes.append("CPU: the module runs unwrapped, as nn.DataParallel runs it without CUDA (no scatter, "
                         "replicate or gather); unwrapped, it stays on the CPU on a machine with CUDA too")
        if cfg.workload == "cnn" and cfg.devices > 1:
            notes.append("BatchNorm statistics are per replica; running statistics come from the first device")
        return notes
