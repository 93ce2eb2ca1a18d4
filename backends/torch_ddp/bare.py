"""torch_ddp's reference: a bare DistributedDataParallel loop, one process per device under torchrun.

    torchrun ... -m backends.torch_ddp.bare CONFIG.json RESULT.json   (started by TorchDDP.run_bare)
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from backends.torch_common import bare
from backends.torch_common.weights import initialised_model
from common.calibration import bare_result, rank_steps
from common.config import RunConfig
from common.initial_weights import run_initial_weights
from common.results import write_json_atomic

IDIOM = "bare DDP loop under torchrun (gloo on CPU, nccl on CUDA), tensors prepared before the clock"


def main(config_path: str, result_path: str) -> None:
    cfg = RunConfig.load(Path(config_path))
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    cuda = cfg.device_kind == "cuda"
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(cfg.threads_per_device)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=cfg.collective_timeout_s))
    try:
        core = initialised_model(cfg.workload, cfg.spec, run_initial_weights(cfg)).to(device)
        model = DistributedDataParallel(core, device_ids=[local] if cuda else None)
        batches = bare.as_tensors(rank_steps(cfg, rank, world), device)
        ranks: list = [None] * world
        dist.all_gather_object(ranks, bare.train(model, model.parameters(), batches, cfg, device))
        if rank == 0:
            write_json_atomic(Path(result_path), bare_result(ranks, cfg.global_batch, IDIOM))
        dist.barrier()
        del model
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
