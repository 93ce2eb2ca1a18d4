"""One torch_3d rank, started by torchrun: python -m backends.torch_3d.worker CONFIG.json RESULT.json"""
from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from backends.torch_3d.parallelize import build_mesh, parallelize
from backends.torch_3d.stages import FIRST_INPUT, stage_module
from backends.torch_3d.trainer import LayoutTrainer, Placement
from backends.torch_common import process_group
from backends.torch_common.models import param_count
from backends.torch_common.weights import initialised_model
from common import worker
from common.config import RunConfig


def tie_group(where: Placement, timeout, tied: bool) -> dist.ProcessGroup | None:
    """The first and last stage of each (dp, tp) position, which both hold the tied token embedding (the MLM's;
    the decoder LM's output layer is untied). Every rank creates every group, in the same order (new_group is
    collective)."""
    lay, mine = where.layout, None
    if lay.pp == 1 or not tied:
        return None
    for dp in range(lay.data):
        for tp in range(lay.tp):
            ranks = [where.rank_at(0, dp, tp), where.rank_at(lay.pp - 1, dp, tp)]
            group = dist.new_group(ranks, timeout=timeout)
            if dist.get_rank() in ranks:
                mine = group
    return mine


class LayoutWorker(process_group.RankWorker):
    def start(self, cfg: RunConfig) -> worker.Process:
        me = process_group.join_process_group(cfg)
        layout = cfg.layout
        mesh = build_mesh(layout, me.device.type, dist.get_backend(), cfg.collective_timeout_s)
        self.where = Placement(layout, mesh, layout.coordinates(me.rank), FIRST_INPUT[cfg.workload])
        self.where.tie_group = tie_group(self.where, timedelta(seconds=cfg.collective_timeout_s),
                                         tied=cfg.workload == "mlm")
        # Every rank of one data-parallel replica (its tensor and pipeline ranks) is dealt the same samples.
        return worker.Process(me.rank, me.world, keeps_result=me.local_rank == 0, replica=self.where.coords["data"],
                              replicas=layout.data, samples=cfg.per_device_batch, device=me.device)

    def trainer(self, cfg, process, data, weights):
        torch.manual_seed(cfg.seed)
        model = initialised_model(cfg.workload, cfg.spec, weights).to(process.device)
        trainable = param_count(model)
        part = stage_module(cfg.workload, model, cfg.layout, self.where.coords["pp"], cfg.global_batch)
        stage = parallelize(part, cfg.layout, self.where.mesh, cfg.workload)
        return LayoutTrainer(stage, cfg, process.device, process.rank, process.processes, self.where,
                             trainable), data.train


if __name__ == "__main__":
    # record: a Python exception reaches torchrun's error file, and from there the run's failure report.
    sys.exit(record(worker.main)(LayoutWorker()))
