"""One MindSpore process, started by msrun: python backends/mindspore_auto/worker.py CONFIG.json RESULT.json

msrun runs a script path, not a module, so the repository reaches sys.path through PYTHONPATH
(common.launch.child_env sets it).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import mindspore as ms
from mindspore.communication import get_group_size, get_rank, init

from backends.mindspore_auto.data import DatasetBatches
from backends.mindspore_auto.models import build_loss_net, param_count
from backends.mindspore_auto.parallel_config import ParallelConfig, parallel_config_from
from backends.mindspore_auto.trainer import MindSporeTrainer, float16_matmuls
from common.config import RunConfig
from common.data.batches import TrainBatches, eval_batches
from common.data.datasets import TRAIN_SPLIT, load_split
from common.initial_weights import run_initial_weights
from common.loop import EVAL_BATCH, run_loop
from common.results import write_json_atomic

DEVICE_TARGETS = {"cpu": "CPU", "cuda": "GPU", "ascend": "Ascend"}
PARALLEL_MODES = {"data": ms.ParallelMode.DATA_PARALLEL, "semi_auto": ms.ParallelMode.SEMI_AUTO_PARALLEL,
                  "auto": ms.ParallelMode.AUTO_PARALLEL}


PID_DIR_ENV = "PARBENCH_WORKER_PID_DIR"
FINISHED = "finished"


def _pid_file() -> Path | None:
    return Path(os.environ[PID_DIR_ENV]) / str(os.getpid()) if PID_DIR_ENV in os.environ else None


def register_pid() -> None:
    """msrun starts workers in sessions of their own (setsid), out of reach of the harness's
    process-group kill: the backend ends whoever registered here once msrun is gone. The file says
    the role and rank msrun gave this process, so that the backend can name a worker that dies."""
    path = _pid_file()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{os.environ.get('MS_ROLE', '')} {os.environ.get('RANK_ID', '')}\n")


def mark_finished() -> None:
    """A registered worker that is gone without this mark died (signal, os._exit, crash)."""
    path = _pid_file()
    if path is not None:
        with open(path, "a") as fh:
            fh.write(f"{FINISHED}\n")


def set_parallel_context(pcfg: ParallelConfig, processes: int) -> None:
    if pcfg.mode == "data":
        ms.set_auto_parallel_context(parallel_mode=PARALLEL_MODES["data"], gradients_mean=True, device_num=processes)
        return
    # Every process loads the whole global batch and the compiler slices it by the strategies:
    # the batch's rank layout then never has to agree with the model-parallel groups.
    ms.set_auto_parallel_context(
        parallel_mode=PARALLEL_MODES[pcfg.mode], device_num=processes, full_batch=True,
        pipeline_stages=pcfg.pipeline_stage, pipeline_config={"pipeline_scheduler": pcfg.pipeline_scheduler},
        enable_parallel_optimizer=pcfg.optimizer_shard,
        # auto: start from the strategies models.py sets and propagate them to the other operators.
        **({"search_mode": "sharding_propagation"} if pcfg.mode == "auto" else {}),
    )


def start_worker(config_path: str) -> tuple[RunConfig, ParallelConfig, int, int]:
    """One msrun worker joined to its group, graph mode on the run's device and threads, the parallel
    context set: (config, parallel config, rank, processes). The suite's worker and the bare loop share it."""
    register_pid()
    cfg = RunConfig.load(Path(config_path))
    pcfg = parallel_config_from(cfg.backend_options, cfg.devices)
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device(DEVICE_TARGETS[cfg.device_kind])
    if cfg.device_kind == "cpu":
        ms.device_context.cpu.op_tuning.threads_num(cfg.threads_per_device)
    init()  # msrun's scheduler; its --cluster_time_out bounds the rendezvous
    rank, processes = get_rank(), get_group_size()
    set_parallel_context(pcfg, processes)
    ms.set_seed(cfg.seed)
    return cfg, pcfg, rank, processes


def main(config_path: str, result_path: str) -> None:
    cfg, pcfg, rank, processes = start_worker(config_path)

    data_dir = Path(cfg.data_dir)
    split = load_split(cfg.workload, TRAIN_SPLIT, cfg.data, data_dir, cfg.spec, cfg.seed)
    eval_data = load_split(cfg.workload, cfg.eval_split, cfg.data, data_dir, cfg.spec, cfg.seed)
    loss_net = build_loss_net(cfg.workload, cfg.spec, pcfg, run_initial_weights(cfg))
    if cfg.precision == "fp16":
        loss_net = float16_matmuls(loss_net, Path(config_path).parent / f"amp-rank{rank}")
    trainer = MindSporeTrainer(loss_net, cfg, pcfg, rank, processes)
    # DATA_PARALLEL: this rank's shard of each micro-batch; otherwise all of it, on every process.
    per_rank = cfg.per_device_batch if pcfg.mode == "data" else cfg.global_batch // cfg.grad_accum
    train = TrainBatches(split, cfg.spec, cfg.seed, per_rank, trainer.world, trainer.rank, cfg.grad_accum)
    first_eval = next(eval_batches(eval_data, cfg.spec, cfg.seed, trainer.rank, trainer.world, EVAL_BATCH))
    compile_s = trainer.compile(train.get(0), first_eval)

    outcome = run_loop(trainer, cfg, DatasetBatches(train, cfg.feed_steps), eval_data)
    if rank % cfg.devices_per_node == 0:  # msrun numbers ranks node by node; each node's first keeps it
        outcome["backend_metrics"] = {**(outcome["backend_metrics"] or {}), **compile_s, "parallel": pcfg.as_dict(),
                                      "processes": processes, "trainable_params": param_count(loss_net)}
        write_json_atomic(Path(result_path), outcome)
    mark_finished()


if __name__ == "__main__":
    main(*sys.argv[1:3])
