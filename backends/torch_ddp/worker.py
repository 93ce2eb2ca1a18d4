"""One DDP rank, started by torchrun: python -m backends.torch_ddp.worker CONFIG.json RESULT.json"""
from __future__ import annotations

import dataclasses
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from backends.torch_common.trainer import TorchTrainer
from backends.torch_common.weights import initialised_model
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


def main(config_path: str, result_path: str) -> None:
    cfg = RunConfig.load(Path(config_path))
    # torchrun --max-restarts: a restarted worker group carries on from the newest valid checkpoint.
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restarts and cfg.checkpoint_dir:
        cfg = dataclasses.replace(cfg, resume=True)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = cfg.device_kind == "cuda"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(cfg.threads_per_device)
    # Every collective below inherits this timeout: a dead peer ends the run, it does not hang it.
    timeout = timedelta(seconds=cfg.collective_timeout_s)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout, device_id=device if cuda else None,
                            store=attempt_store(rank, world, restarts, timeout), rank=rank, world_size=world)
    model = None
    try:
        data_dir = Path(cfg.data_dir)
        train = TrainBatches(load_split(cfg.workload, TRAIN_SPLIT, cfg.data, data_dir, cfg.spec, cfg.seed),
                             cfg.spec, cfg.seed, cfg.per_device_batch, world, rank, cfg.grad_accum)
        eval_data = load_split(cfg.workload, cfg.eval_split, cfg.data, data_dir, cfg.spec, cfg.seed)
        torch.manual_seed(cfg.seed)
        core = initialised_model(cfg.workload, cfg.spec, run_initial_weights(cfg)).to(device)
        if cfg.sync_bn:
            core = torch.nn.SyncBatchNorm.convert_sync_batchnorm(core)
        model = DistributedDataParallel(core, device_ids=[local_rank] if cuda else None)
        trainer = TorchTrainer(model, core, cfg, device, rank, world, metrics=lambda: {"restarts": restarts})
        outcome = run_loop(trainer, cfg, train, eval_data)
        if local_rank == 0:  # every rank holds the aggregate; each node's first process keeps it
            write_json_atomic(Path(result_path), outcome)
        # Gloo aborts a process whose peer tears down while it still holds work objects
        # ("terminate called without an active exception"): finish together, reducer first.
        dist.barrier()
    finally:
        del model
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
