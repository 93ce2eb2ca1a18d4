"""One DDP rank, started by torchrun: python -m backends.torch_ddp.worker CONFIG.json RESULT.json"""
from __future__ import annotations

import sys

import torch
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from backends.torch_common import process_group
from backends.torch_common.comm import count_ddp_allreduce
from backends.torch_common.trainer import TorchTrainer, compile_options
from backends.torch_common.weights import initialised_model
from common import worker
from common.config import RunConfig


class DDPWorker(process_group.RankWorker):
    def config(self, cfg: RunConfig) -> RunConfig:
        return process_group.resumed(cfg)

    def start(self, cfg: RunConfig) -> worker.Process:
        me = process_group.join_process_group(cfg)
        self.restarts = me.restarts
        return worker.data_parallel_process(cfg, me.rank, me.world, me.local_rank == 0, me.device)

    def trainer(self, cfg, process, data, weights):
        device = process.device
        torch.manual_seed(cfg.seed)
        core = initialised_model(cfg.workload, cfg.spec, weights).to(device)
        if cfg.sync_bn:
            core = torch.nn.SyncBatchNorm.convert_sync_batchnorm(core)
        model = DistributedDataParallel(core, device_ids=[device.index] if device.type == "cuda" else None)
        ddp = model
        if cfg.compile:  # the DDP module: dynamo's DDPOptimizer splits the graph at the gradient buckets
            model = torch.compile(model, **compile_options(cfg.compile))
        restarts = self.restarts
        trainer = TorchTrainer(model, core, cfg, device, process.rank, process.processes,
                               metrics=lambda: {"restarts": restarts},
                               count_comm_in=lambda counter: count_ddp_allreduce(ddp, counter))
        return trainer, data.train


if __name__ == "__main__":
    # record: a Python exception reaches torchrun's error file, and from there the run's failure report.
    sys.exit(record(worker.main)(DDPWorker()))
