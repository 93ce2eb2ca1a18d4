"""One MindSpore process, started by msrun: python backends/mindspore_auto/worker.py CONFIG.json RESULT.json

msrun runs a script path, not a module, so the repository reaches sys.path through PYTHONPATH
(common.launch.child_env sets it).
"""
from __future__ import annotations

import sys

import mindspore as ms
from mindspore.communication import get_group_size, get_rank, init

from backends.mindspore_auto.data import DatasetBatches
from backends.mindspore_auto.models import build_loss_net, param_count
from backends.mindspore_auto.parallel_config import ParallelConfig, parallel_config_of
from backends.mindspore_auto.pid_registry import mark_finished, register_pid
from backends.mindspore_auto.trainer import MindSporeTrainer, float16_matmuls
from common import worker
from common.config import RunConfig
from common.data.batches import eval_batches
from common.sections import TrainableParams
from common.spec import DEFAULTS

DEVICE_TARGETS = {"cpu": "CPU", "cuda": "GPU", "ascend": "Ascend"}
PARALLEL_MODES = {"data": ms.ParallelMode.DATA_PARALLEL, "semi_auto": ms.ParallelMode.SEMI_AUTO_PARALLEL,
                  "auto": ms.ParallelMode.AUTO_PARALLEL}


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


def start_worker(cfg: RunConfig) -> tuple[RunConfig, ParallelConfig, int, int]:
    """One msrun worker joined to its group, graph mode on the run's device and threads, the parallel
    context set: (config, parallel config, rank, processes). The suite's worker and the bare loop share it."""
    register_pid()
    pcfg = parallel_config_of(cfg)
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device(DEVICE_TARGETS[cfg.device_kind])
    if cfg.device_kind == "cpu":
        ms.device_context.cpu.op_tuning.threads_num(cfg.threads_per_device)
    init()  # msrun's scheduler; its --cluster_time_out bounds the rendezvous
    rank, processes = get_rank(), get_group_size()
    set_parallel_context(pcfg, processes)
    ms.set_seed(cfg.seed)
    return cfg, pcfg, rank, processes


class MindSporeWorker(worker.Worker):
    def start(self, cfg: RunConfig) -> worker.Process:
        _, self.pcfg, rank, processes = start_worker(cfg)
        keeps = rank % cfg.devices_per_node == 0  # msrun numbers ranks node by node
        if self.pcfg.mode == "data":  # this rank's shard of each micro-batch
            return worker.data_parallel_process(cfg, rank, processes, keeps)
        # semi_auto/auto: every process loads all of it (full_batch) and the compiler splits it.
        return worker.Process(rank, processes, keeps_result=keeps, replica=0, replicas=1,
                              samples=cfg.global_batch // cfg.grad_accum)

    def trainer(self, cfg, process, data, weights):
        loss_net = build_loss_net(cfg.workload, cfg.spec, self.pcfg, weights)
        if cfg.precision == "fp16":
            loss_net = float16_matmuls(loss_net, self.workdir / f"amp-rank{process.rank}")
        trainer = MindSporeTrainer(loss_net, cfg, self.pcfg, process.rank, process.processes)
        first_eval = next(eval_batches(data.eval, cfg.spec, cfg.seed, trainer.rank, trainer.world,
                                       DEFAULTS[cfg.workload].eval_batch, cfg.eval_samples))
        self.compile_s = trainer.compile(data.train.get(0), first_eval)
        self.trainable = param_count(loss_net)
        return trainer, DatasetBatches(data.train, cfg.feed_steps)

    def metrics(self, process: worker.Process) -> dict:
        return {**self.compile_s, "parallel": self.pcfg.as_dict(), "processes": process.processes,
                **TrainableParams(self.trainable).to_metrics()}

    def finish(self, process):
        mark_finished()


if __name__ == "__main__":
    sys.exit(worker.main(MindSporeWorker()))
