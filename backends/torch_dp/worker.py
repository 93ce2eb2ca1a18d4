"""The DataParallel process: python -m backends.torch_dp.worker CONFIG.json RESULT.json"""
from __future__ import annotations

import sys

import torch

from backends.torch_common.trainer import TorchTrainer, compile_options, loss_and_correct
from backends.torch_common.weights import initialised_model
from backends.torch_dp.timed import HOW, TimedDataParallel
from common import worker
from common.config import RunConfig
from common.errors import Unsupported

PROBE_RTOL = 1e-4


def probe_repeated_device(model: TimedDataParallel, core: torch.nn.Module, cfg: RunConfig, batch: dict) -> str | None:
    """None if DataParallel over a repeated device gives the plain module's gradients, else why not.

    The error is that of the whole gradient (all parameters), not the worst parameter's own relative
    error: the attention key biases have an exactly zero gradient in exact arithmetic (softmax is
    shift-invariant: q.(k_j + b) moves every score of a query by the same q.b), so theirs is rounding
    noise, and replicas that sum partial gradients in another order give other noise: 1.13 and 0.64
    relative on an H100 for device_ids=[0, 0] while every other parameter agreed to 2e-6. That, not
    DataParallel, is what the per-parameter probe refused before."""
    try:
        grads = []
        for runner in (core, model):
            core.zero_grad(set_to_none=True)
            loss, _ = loss_and_correct(runner, cfg.workload, batch, count_correct=False)
            loss.backward()
            grads.append([p.grad.clone() for p in core.parameters()])
        core.zero_grad(set_to_none=True)
    except Exception as exc:  # the exact error is the finding
        return f"nn.DataParallel rejects device_ids={model.device_ids}: {type(exc).__name__}: {exc}"
    diff = torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(*grads)))
    norm = torch.sqrt(sum((b ** 2).sum() for b in grads[1]))
    error = float(diff / norm.clamp_min(1e-12))
    if cfg.workload == "mlm" and error > PROBE_RTOL:  # (BatchNorm makes CNN gradients differ by design)
        return f"nn.DataParallel over device_ids={model.device_ids} gives a gradient off by {error:.2e} (relative)"
    return None


def start_device(cfg: RunConfig) -> torch.device:
    """The process's device: the first GPU (DataParallel's output device), or the CPU with the run's threads."""
    if cfg.device_kind == "cuda":
        return torch.device("cuda", 0)
    torch.set_num_threads(cfg.threads_per_device)
    return torch.device("cpu")


def replica_devices(cfg: RunConfig) -> list[int]:
    """The CUDA device ids of the replicas; none on CPU, where nn.DataParallel would claim every GPU
    present (device_ids=None means all of them) and move the batch there, whatever --device-kind asked.
    Virtual devices: replica i on GPU i mod the GPUs present (torch_device_plan's round robin)."""
    if cfg.device_kind != "cuda":
        return []
    return [i % torch.cuda.device_count() for i in range(cfg.devices)]


def wrap(core: torch.nn.Module, cfg: RunConfig) -> tuple[torch.nn.Module, list[int]]:
    """(what runs the training forward, the CUDA device ids). On CPU the module itself: nn.DataParallel
    without CUDA only calls the module."""
    device_ids = replica_devices(cfg)
    if not device_ids:
        return core, []
    return TimedDataParallel(core, device_ids=device_ids, output_device=device_ids[0]), device_ids


class DataParallelWorker(worker.Worker):
    def start(self, cfg: RunConfig) -> worker.Process:
        # One process sees the whole global batch; DataParallel's scatter cuts micro-batch rows into
        # contiguous chunks, chunk r being what rank r gets from TrainBatches in the other backends.
        return worker.Process(0, 1, keeps_result=True, replica=0, replicas=1,
                              samples=cfg.per_device_batch * cfg.devices, local_devices=cfg.devices,
                              device=start_device(cfg))

    def trainer(self, cfg, process, data, weights):
        torch.manual_seed(cfg.seed)
        core = initialised_model(cfg.workload, cfg.spec, weights).to(process.device)
        model, device_ids = wrap(core, cfg)
        if cfg.compile:  # one device only (the backend refuses more): DataParallel then calls the module itself
            core.compile(**compile_options(cfg.compile))

        def metrics() -> dict:
            per_device = [int(torch.cuda.max_memory_allocated(d)) for d in dict.fromkeys(device_ids)]
            timed = isinstance(model, TimedDataParallel)
            return {
                "device_ids": device_ids,
                "phase_s_per_step": model.phase_means(cfg.warmup_steps * cfg.grad_accum, cfg.grad_accum)
                if timed else None,
                "phase_timing": HOW if timed else None,
                "peak_memory_per_device": per_device,
                # Outputs and the loss live on the first device: its excess is DataParallel's imbalance.
                "memory_imbalance": max(per_device) / max(1, min(per_device)) if per_device else None,
            }

        trainer = TorchTrainer(model, core, cfg, process.device, metrics=metrics,
                               memory_devices=list(dict.fromkeys(device_ids)))
        if len(set(device_ids)) < len(device_ids):
            reason = probe_repeated_device(model, core, cfg, trainer.to_device(data.train.get(0).micro[0]))
            if reason:
                raise Unsupported(reason)
            model.phase_log.clear()
        return trainer, data.train


if __name__ == "__main__":
    sys.exit(worker.main(DataParallelWorker()))
