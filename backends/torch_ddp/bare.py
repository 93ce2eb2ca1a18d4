"""torch_ddp's reference: a bare DistributedDataParallel loop, one process per device under torchrun.

    torchrun ... -m backends.torch_ddp.bare CONFIG.json RESULT.json   (started by TorchDDP.run_bare)
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from backends.torch_common import bare, process_group
from backends.torch_common.weights import initialised_model
from common.calibration import bare_result, rank_steps
from common.config import RunConfig
from common.initial_weights import run_initial_weights
from common.results import write_json_atomic

IDIOM = "bare DDP loop under torchrun (gloo on CPU, nccl on CUDA), tensors prepared before the clock"


def main(config_path: str, result_path: str) -> None:
    cfg = RunConfig.load(Path(config_path))
    me = process_group.join_process_group(cfg)  # the suite's own rank start: device, threads, group, timeout
    rank, world, device = me.rank, me.world, me.device
    try:
        core = initialised_model(cfg.workload, cfg.spec, run_initial_weights(cfg)).to(device)
        model = DistributedDataParallel(core, device_ids=[device.index] if device.type == "cuda" else None)
        batches = bare.as_tensors(rank_steps(cfg, rank, world), device)
        ranks: list = [None] * world
        dist.all_gather_object(ranks, bare.train(model, model.parameters(), batches, cfg, device))
        if rank == 0:
            write_json_atomic(Path(result_path), bare_result(ranks, cfg.global_batch, IDIOM))
        del model
        process_group.finish_together()
    finally:
        process_group.leave_process_group()


if __name__ == "__main__":
    record(main)(*sys.argv[1:3])
