"""One DDP rank, started by torchrun: python -m backends.torch_ddp.worker CONFIG.json RESULT.json"""
from __future__ import annotations

import dataclasses
import gc
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from backends.torch_common.trainer import TorchTrainer, compile_options
from backends.torch_common.weights import initialised_model
from backends.torch_ddp.backend import process_group_backend
from backends.torch_ddp.comm_probe import DDPCommProbe
from common.config import RunConfig
from common.data.batches import TrainBatches
from common.data.datasets import TRAIN_SPLIT, load_split
from common.initial_weights import run_initial_weights
from common.loop import run_loop
from common.results import write_json_atomic


def attempt_store(rank: int, world: int, attempt: int, timeout: timedelta) -> dist.Store:
    """torchrun's store, under a prefix of its own per restart: a restarted group otherwise can read the
    gloo addresses its dead predecessors left there and fail with "Connection refused" (seen in CI)."""
    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent_hosts_it, timeout=timeout)
    return dist.PrefixStore(f"parbench/attempt{attempt}", store)


def start_process_group(cfg: RunConfig) -> tuple[RunConfig, int, int, int, torch.device]:
    """Join torchrun's group: (config, rank, world, local rank, device), the config set to resume after
    a restart. Every collective inherits --collective-timeout: a dead peer ends the run, it does not hang it."""
    # torchrun --max-restarts: a restarted worker group carries on from the newest valid checkpoint.
    restarts = restart_count()
    if restarts and cfg.checkpoint_dir:
        cfg = dataclasses.replace(cfg, resume=True)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = cfg.device_kind == "cuda"
    # Virtual GPUs: local rank r on GPU r mod the GPUs present (torch_device_plan's round robin).
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(cfg.threads_per_device)
    timeout = timedelta(seconds=cfg.collective_timeout_s)
    group_backend = process_group_backend(cfg.device_kind, cfg.virtual)
    dist.init_process_group(group_backend, timeout=timeout, device_id=device if group_backend == "nccl" else None,
                            store=attempt_store(rank, world, restarts, timeout), rank=rank, world_size=world)
    return cfg, rank, world, local_rank, device


def restart_count() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def train(cfg: RunConfig, rank: int, world: int, device: torch.device) -> dict:
    """The run on this rank: its model, DDP reducer and hooks exist only inside this call."""
    cuda = device.type == "cuda"
    data_dir = Path(cfg.data_dir)
    train_batches = TrainBatches(load_split(cfg.workload, TRAIN_SPLIT, cfg.data, data_dir, cfg.spec, cfg.seed),
                                 cfg.spec, cfg.seed, cfg.per_device_batch, world, rank, cfg.grad_accum)
    eval_data = load_split(cfg.workload, cfg.eval_split, cfg.data, data_dir, cfg.spec, cfg.seed)
    torch.manual_seed(cfg.seed)
    core = initialised_model(cfg.workload, cfg.spec, run_initial_weights(cfg)).to(device)
    if cfg.sync_bn:
        core = torch.nn.SyncBatchNorm.convert_sync_batchnorm(core)
    model = DistributedDataParallel(core, device_ids=[device.index] if cuda else None)
    comm_probe = DDPCommProbe(model, device)
    if cfg.compile:  # the DDP module: dynamo's DDPOptimizer splits the graph at the gradient buckets
        model = torch.compile(model, **compile_options(cfg.compile))
    restarts = restart_count()
    trainer = TorchTrainer(model, core, cfg, device, rank, world, metrics=lambda: {"restarts": restarts},
                           comm_probe=comm_probe)
    return run_loop(trainer, cfg, train_batches, eval_data)


def main(config_path: str, result_path: str) -> None:
    cfg, rank, world, local_rank, device = start_process_group(RunConfig.load(Path(config_path)))
    try:
        outcome = train(cfg, rank, world, device)
        if local_rank == 0:  # every rank holds the aggregate; each node's first process keeps it
            write_json_atomic(Path(result_path), outcome)
        # The reducer and any Python futures it holds are freed here, while the interpreter is whole:
        # freed at shutdown instead, they abort the process. Gloo also aborts a process whose peer tears
        # down while it still holds work objects ("terminate called without an active exception"), so
        # the ranks finish together, reducer first.
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
