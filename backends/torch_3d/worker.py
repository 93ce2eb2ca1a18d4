"""One torch_3d rank, started by torchrun: python -m backends.torch_3d.worker CONFIG.json RESULT.json"""
from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from backends.torch_3d.parallelize import build_mesh, parallelize
from backends.torch_3d.stages import FIRST_INPUT, stage_module
from backends.torch_3d.trainer import LayoutTrainer, Placement
from backends.torch_common.models import param_count
from backends.torch_common.weights import initialised_model
from backends.torch_ddp.worker import start_process_group
from common.config import RunConfig
from common.data.batches import TrainBatches
from common.data.datasets import TRAIN_SPLIT, load_split
from common.initial_weights import run_initial_weights
from common.loop import run_loop
from common.results import write_json_atomic


def tie_group(where: Placement, timeout) -> dist.ProcessGroup | None:
    """The first and last stage of each (dp, tp) position, which both hold the tied token embedding.
    Every rank creates every group, in the same order (new_group is collective)."""
    lay, mine = where.layout, None
    if lay.pp == 1:
        return None
    for dp in range(lay.dp):
        for tp in range(lay.tp):
            ranks = [where.rank_at(0, dp, tp), where.rank_at(lay.pp - 1, dp, tp)]
            group = dist.new_group(ranks, timeout=timeout)
            if dist.get_rank() in ranks:
                mine = group
    return mine


def main(config_path: str, result_path: str) -> None:
    cfg, rank, world, local_rank, device = start_process_group(RunConfig.load(Path(config_path)))
    layout = cfg.layout
    stage = None
    try:
        backend = dist.get_backend()
        mesh = build_mesh(layout, device.type, backend, cfg.collective_timeout_s)
        where = Placement(layout, mesh, layout.coordinates(rank), FIRST_INPUT[cfg.workload])
        where.tie_group = tie_group(where, timedelta(seconds=cfg.collective_timeout_s))
        data_dir = Path(cfg.data_dir)
        # Every rank of one data-parallel replica (its tensor and pipeline ranks) is dealt the same samples.
        train = TrainBatches(load_split(cfg.workload, TRAIN_SPLIT, cfg.data, data_dir, cfg.spec, cfg.seed),
                             cfg.spec, cfg.seed, cfg.per_device_batch, layout.dp, where.coords["dp"],
                             cfg.accumulation)
        eval_data = load_split(cfg.workload, cfg.eval_split, cfg.data, data_dir, cfg.spec, cfg.seed)
        torch.manual_seed(cfg.seed)
        model = initialised_model(cfg.workload, cfg.spec, run_initial_weights(cfg)).to(device)
        trainable = param_count(model)
        stage = parallelize(stage_module(cfg.workload, model, layout, where.coords["pp"]), layout, mesh)
        trainer = LayoutTrainer(stage, cfg, device, rank, world, where, trainable)
        outcome = run_loop(trainer, cfg, train, eval_data)
        if local_rank == 0:  # every rank holds the aggregate; each node's first process keeps it
            write_json_atomic(Path(result_path), outcome)
        dist.barrier()  # finish together: gloo aborts a process whose peer tears down mid-work
    finally:
        del stage
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
