"""PyTorch nn.DataParallel: one process scatters each global batch over N CUDA devices."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from backends.torch_common.backend import TorchBackend
from common.config import RunConfig
from common.devices import DevicePlan, cpu_plan, cuda_plan
from common.errors import Unsupported
from common.launch import RunFailed, child_env, log_tail, run_supervised

# The worker exits with this code, and writes the reason to unsupported.txt, when DataParallel
# refuses the configuration at run time (the repeated-device probe on a single GPU).
EXIT_UNSUPPORTED = 3


class TorchDP(TorchBackend):
    name = "torch_dp"
    strategy = "DataParallel"

    def plan_devices(self, count: int, kind: str, threads_per_device: int) -> DevicePlan:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if kind != "cpu" and gpus:
            names = [torch.cuda.get_device_name(i) for i in range(gpus)]
            if count <= gpus:
                return cuda_plan(count, gpus, names)
            if gpus == 1:
                # Like TensorFlow's logical GPUs: N replicas on one GPU, if DataParallel accepts it.
                return DevicePlan("cuda", count, True, 0, False,
                                  f"{count} replicas on one {names[0]} (device_ids={[0] * count})", (names[0],))
            raise Unsupported(f"{count} CUDA devices requested, {gpus} present")
        if kind == "cuda":
            raise Unsupported("CUDA devices requested, none present")
        if count > 1:
            raise Unsupported(f"nn.DataParallel with {count} devices needs {count} CUDA devices; "
                              "this machine has none")
        return cpu_plan(1, threads_per_device)

    def check(self, cfg: RunConfig, plan: DevicePlan) -> None:
        if cfg.sync_bn:
            raise Unsupported("--sync-bn: nn.DataParallel has no SyncBatchNorm (it needs DDP process groups)")

    def run(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        config_path, result_path = workdir / "config.json", workdir / "result.json"
        cfg.save(config_path)
        cmd = [sys.executable, "-m", "backends.torch_dp.worker", str(config_path), str(result_path)]
        log = workdir / "worker.log"
        env = {"OMP_NUM_THREADS": str(max(1, plan.threads_per_device))}
        rc = run_supervised(cmd, child_env(env), log, cfg.timeout_s)
        if rc == EXIT_UNSUPPORTED and (workdir / "unsupported.txt").is_file():
            raise Unsupported((workdir / "unsupported.txt").read_text().strip())
        if rc != 0 or not result_path.is_file():
            raise RunFailed(f"DataParallel worker exited with code {rc}: {log_tail(log)}")
        outcome = json.loads(result_path.read_text())
        phases = (outcome.get("backend_metrics") or {}).get("phase_s_per_step")
        step = (outcome.get("step_time_s") or {}).get("mean")
        if phases and step:
            outcome["backend_metrics"]["phase_share_of_step"] = {k: v / step for k, v in phases.items()}
        return outcome

    def notes(self, cfg: RunConfig, plan: DevicePlan) -> list[str]:
        notes = []
        if plan.kind == "cuda":
            notes.append("one process; each forward scatters the batch over the devices, replicates the "
                         "module and gathers the outputs on the first device")
            notes.append("phase times are read with a device synchronisation between phases, which "
                         "serialises some copy/compute overlap DataParallel would otherwise get")
        if plan.kind == "cuda" and plan.virtual:
            notes.append("virtual devices: the same GPU repeated in device_ids; replicas share its compute")
        if plan.kind == "cpu":
            notes.append("no CUDA: nn.DataParallel calls the module directly (no scatter, replicate or gather)")
        if cfg.workload == "cnn" and cfg.devices > 1:
            notes.append("BatchNorm statistics are per replica; running statistics come from the first device")
        return notes
