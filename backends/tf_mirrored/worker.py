"""One TensorFlow process: python -m backends.tf_mirrored.worker CONFIG.json RESULT.json

`mirrored`: the only process, N logical devices, MirroredStrategy. `multi_worker`: one of N
processes (its index in TF_CONFIG), one device each, MultiWorkerMirroredStrategy.
"""
from __future__ import annotations

import json
import os
import sys

import keras
import tensorflow as tf

from backends.keras_common.models import build_model, trainable_param_count
from backends.keras_common.weights import load_initial_weights
from backends.tf_mirrored.data import ReplicaBatches
from backends.tf_mirrored.devices import configure_devices, physical_gpus
from backends.tf_mirrored.modes import all_reduce_implementation, mode_of
from backends.tf_mirrored.strategy import build_strategy
from backends.tf_mirrored.trainer import KerasTrainer
from common import worker
from common.config import RunConfig
from common.sections import TrainableParams

# Keras' mixed policies: float16/bfloat16 compute, float32 variables. fp16 adds loss scaling (trainer).
MIXED_POLICIES = {"amp": "mixed_bfloat16", "fp16": "mixed_float16"}


def _cluster_position(mode: str) -> tuple[int, int]:
    """(this process's index, number of processes)."""
    if mode == "mirrored":
        return 0, 1
    tf_config = json.loads(os.environ["TF_CONFIG"])
    return int(tf_config["task"]["index"]), len(tf_config["cluster"]["worker"])


class KerasWorker(worker.Worker):
    """`mirrored`: the only process, N logical devices. `multi_worker`: one of N processes, one device each."""

    def start(self, cfg: RunConfig) -> worker.Process:
        self.mode = mode_of(cfg)
        rank, world = _cluster_position(self.mode)
        local = cfg.devices // world
        intra_op = local * cfg.threads_per_device  # the cores of every device this process drives
        gpus_present = len(physical_gpus()) if cfg.device_kind == "cuda" else 0
        devices = configure_devices(cfg.device_kind, local, intra_op, cfg.devices, first_device=rank * local)
        self.implementation = all_reduce_implementation(cfg.device_kind, cfg.devices, gpus_present)
        self.strategy = build_strategy(self.mode, devices, self.implementation, cfg.collective_timeout_s)
        if cfg.precision in MIXED_POLICIES:
            keras.config.set_dtype_policy(MIXED_POLICIES[cfg.precision])
        first_on_node = rank % (world // cfg.nnodes) == 0
        return worker.data_parallel_process(cfg, rank, world, first_on_node, local_devices=local)

    def trainer(self, cfg, process, data, weights):
        keras.utils.set_random_seed(cfg.seed)
        with self.strategy.scope():
            self.model = build_model(cfg.workload, cfg.spec, cfg.sync_bn)
            load_initial_weights(self.model, cfg.spec, weights)
        trainer = KerasTrainer(self.strategy, self.model, cfg, cfg.device_kind, process.rank, process.processes)
        return trainer, ReplicaBatches(data.train, self.strategy, process.local_devices, cfg.feed_steps)

    def metrics(self, process: worker.Process) -> dict:
        return {
            "tf_mode": self.mode, "replicas_in_sync": self.strategy.num_replicas_in_sync,
            "processes": process.processes, "logical_devices": list(self.strategy.extended.worker_devices),
            "all_reduce": f"CollectiveAllReduce ({self.implementation})",
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads() or "TensorFlow default",
            # Trainable = the spec's count; total adds BatchNorm's moving statistics (cnn).
            **TrainableParams(trainable_param_count(self.model)).to_metrics(),
            "params_total": self.model.count_params(),
        }


if __name__ == "__main__":
    sys.exit(worker.main(KerasWorker()))
