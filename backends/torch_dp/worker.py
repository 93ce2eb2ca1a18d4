"""The DataParallel process: python -m backends.torch_dp.worker CONFIG.json RESULT.json"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from backends.torch_common.trainer import TorchTrainer, loss_and_correct
from backends.torch_common.weights import initialised_model
from backends.torch_dp.backend import EXIT_UNSUPPORTED
from backends.torch_dp.timed import TimedDataParallel
from common.config import RunConfig
from common.data.batches import TrainBatches
from common.data.datasets import TRAIN_SPLIT, load_split
from common.initial_weights import run_initial_weights
from common.loop import run_loop
from common.results import write_json_atomic

PROBE_RTOL = 1e-4


def probe_repeated_device(model: TimedDataParallel, core: torch.nn.Module, cfg: RunConfig, batch: dict) -> str | None:
    """None if DataParallel over a repeated device gives the plain module's gradients, else why not."""
    try:
        grads = []
        for runner in (core, model):
            core.zero_grad(set_to_none=True)
            loss, _ = loss_and_correct(runner, cfg.workload, batch)
            loss.backward()
            grads.append([p.grad.clone() for p in core.parameters()])
        core.zero_grad(set_to_none=True)
    except Exception as exc:  # the exact error is the finding
        return f"nn.DataParallel rejects device_ids={model.device_ids}: {type(exc).__name__}: {exc}"
    worst = max(float((a - b).norm() / b.norm().clamp_min(1e-12)) for a, b in zip(*grads))
    if cfg.workload == "mlm" and worst > PROBE_RTOL:  # (BatchNorm makes CNN gradients differ by design)
        return f"nn.DataParallel over device_ids={model.device_ids} gives gradients off by {worst:.2e}"
    return None


def main(config_path: str, result_path: str) -> int:
    cfg = RunConfig.load(Path(config_path))
    cuda = cfg.device_kind == "cuda"
    if cuda:
        available = torch.cuda.device_count()
        device_ids = list(range(cfg.devices)) if cfg.devices <= available else [0] * cfg.devices
        device = torch.device("cuda", device_ids[0])
    else:
        device_ids, device = None, torch.device("cpu")
        torch.set_num_threads(cfg.threads_per_device)
    data_dir = Path(cfg.data_dir)
    # One process sees the whole global batch; DataParallel's scatter cuts micro-batch rows into
    # contiguous chunks, chunk r being what rank r gets from TrainBatches in the other backends.
    train = TrainBatches(load_split(cfg.workload, TRAIN_SPLIT, cfg.data, data_dir, cfg.spec, cfg.seed),
                         cfg.spec, cfg.seed, cfg.per_device_batch * cfg.devices, 1, 0, cfg.grad_accum,
                         cfg.devices)
    eval_data = load_split(cfg.workload, cfg.eval_split, cfg.data, data_dir, cfg.spec, cfg.seed)
    torch.manual_seed(cfg.seed)
    core = initialised_model(cfg.workload, cfg.spec, run_initial_weights(cfg)).to(device)
    model = TimedDataParallel(core, device_ids=device_ids, output_device=device_ids[0] if cuda else None)

    def metrics() -> dict:
        per_device = [int(torch.cuda.max_memory_allocated(d)) for d in dict.fromkeys(device_ids)] if cuda else []
        return {
            "device_ids": device_ids,
            "phase_s_per_step": model.phase_means(cfg.warmup_steps * cfg.grad_accum, cfg.grad_accum),
            "peak_memory_per_device": per_device,
            # Outputs and the loss live on the first device: its excess is DataParallel's imbalance.
            "memory_imbalance": max(per_device) / max(1, min(per_device)) if per_device else None,
        }

    trainer = TorchTrainer(model, core, cfg, device, metrics=metrics)
    if cuda and len(set(device_ids)) < len(device_ids):
        reason = probe_repeated_device(model, core, cfg, trainer.to_device(train.get(0).micro[0]))
        if reason:
            (Path(result_path).parent / "unsupported.txt").write_text(reason)
            return EXIT_UNSUPPORTED
        model.phase_log.clear()
    outcome = run_loop(trainer, cfg, train, eval_data)
    write_json_atomic(Path(result_path), outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
