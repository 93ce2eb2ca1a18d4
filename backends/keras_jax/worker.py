"""One keras_jax process: python -m backends.keras_jax.worker CONFIG.json RESULT.json

`single_process`: the only process, every device of the run (virtual CPU devices from XLA's host platform, or
the node's GPUs). `multi_process`: one of N processes with one device each, joined by jax.distributed.
"""
from __future__ import annotations

import os
import sys

from backends.keras_jax.devices import CORES_ENV
from backends.keras_jax.no_tensorflow import keep_tensorflow_out

keep_tensorflow_out()

if os.environ.get(CORES_ENV):
    # Before XLA starts: it sizes its thread pools from the cores this process may run on.
    os.sched_setaffinity(0, {int(c) for c in os.environ[CORES_ENV].split(",")})

import jax  # noqa: E402
import keras  # noqa: E402

from backends.keras_common.models import build_model  # noqa: E402
from backends.keras_common.optimizer import TorchAdamW  # noqa: E402
from backends.keras_common.weights import canonical_names, keras_shapes, load_initial_weights  # noqa: E402
from backends.keras_jax.layout_map import MESH_AXES, layout_map_keys, unsplit, weight_plan  # noqa: E402
from backends.keras_jax.modes import mode_of  # noqa: E402
from backends.keras_jax.trainer import JaxTrainer  # noqa: E402
from common import worker  # noqa: E402
from common.config import RunConfig  # noqa: E402

COORDINATOR_ENV, PROCESS_ID_ENV, PROCESSES_ENV = ("PARBENCH_JAX_COORDINATOR", "PARBENCH_JAX_PROCESS_ID",
                                                  "PARBENCH_JAX_PROCESSES")


def _placed_axes(variable) -> tuple:
    """The mesh axis each dimension of the variable's array is split over (a one-device array: none)."""
    spec = tuple(getattr(variable.value.sharding, "spec", ()))
    return spec + (None,) * (len(variable.shape) - len(spec))


def recompute(layer: keras.layers.Layer) -> None:
    """The layer's activations recomputed in the backward pass (keras.remat: jax.checkpoint). keras.RematScope
    would hand the layer's `training` flag to jax.checkpoint as a traced value, which keras-hub's dropout then
    cannot test (a boolean conversion of a tracer): the flag stays a Python value here, outside the checkpoint."""
    call = layer.call

    def rematerialised(inputs, *args, training=None, **kwargs):
        return keras.remat(lambda x, *a, **k: call(x, *a, training=training, **k))(inputs, *args, **kwargs)

    layer.call = rematerialised


class KerasJaxWorker(worker.Worker):
    def start(self, cfg: RunConfig) -> worker.Process:
        self.mode = mode_of(cfg)
        lay = cfg.layout
        if self.mode == "multi_process":
            coordinator = os.environ[COORDINATOR_ENV]
            # Every wait is bounded: joining (initialization_timeout), a silent peer (heartbeat), leaving.
            jax.distributed.initialize(
                coordinator, num_processes=int(os.environ[PROCESSES_ENV]),
                process_id=int(os.environ[PROCESS_ID_ENV]), initialization_timeout=int(cfg.collective_timeout_s),
                heartbeat_timeout_seconds=max(10, int(cfg.collective_timeout_s) // 10),
                shutdown_timeout_seconds=int(cfg.collective_timeout_s), coordinator_bind_address=coordinator)
        rank, world = jax.process_index(), jax.process_count()
        # Rank order = the mesh's: (batch, model) with model innermost, as common.layout numbers ranks.
        self.devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
        if len(self.devices) != cfg.devices:
            raise RuntimeError(f"JAX sees {len(self.devices)} devices, the run has {cfg.devices}")
        if cfg.precision == "amp":
            keras.config.set_dtype_policy("mixed_bfloat16")
        if world == 1:
            return worker.data_parallel_process(cfg, 0, 1, keeps_result=True, local_devices=lay.data,
                                                drives=cfg.devices)
        coords = lay.coordinates(rank)
        first_on_node = rank % (world // cfg.nnodes) == 0
        return worker.Process(rank, world, keeps_result=first_on_node, replica=coords["data"], replicas=lay.data,
                              samples=cfg.per_device_batch)

    def _distribution(self, cfg: RunConfig, plan: dict):
        lay, names = cfg.layout, [f"{d.platform}:{d.id}" for d in self.devices]
        if lay.tp == 1 and not lay.sharded:
            mesh = keras.distribution.DeviceMesh((lay.data,), MESH_AXES[:1], names)
            return keras.distribution.DataParallel(device_mesh=mesh), mesh
        mesh = keras.distribution.DeviceMesh((lay.data, lay.tp), MESH_AXES, names)
        layout_map = keras.distribution.LayoutMap(mesh)
        for key, axes in layout_map_keys(plan).items():
            layout_map[key] = axes
        return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name=MESH_AXES[0]), mesh

    def model_on_mesh(self, cfg: RunConfig, weights):
        """The workload's Keras model with its initial weights, laid out on the run's mesh as planned (checked);
        (the model, the Keras DeviceMesh). The bare loop (bare.py) builds its model here too."""
        lay = cfg.layout
        keras.utils.set_random_seed(cfg.seed)
        self.plan = weight_plan(keras_shapes(cfg.spec, weights), lay)
        distribution, mesh = self._distribution(cfg, self.plan)
        self.distribution_name = type(distribution).__name__
        keras.distribution.set_distribution(distribution)
        model = build_model(cfg.workload, cfg.spec, cfg.sync_bn)
        if lay.recomputes:
            for i in range(cfg.spec.layers):
                recompute(model.get_layer(f"transformer_layer_{i}"))
        load_initial_weights(model, cfg.spec, weights)
        wrong = unsplit(self.plan, {v.path: _placed_axes(v) for v in model.weights})
        if wrong:  # a LayoutMap entry that reached no variable would leave its weight replicated without a word
            raise RuntimeError(f"keras_jax: the model's weights are not laid out as planned: {'; '.join(wrong[:3])}")
        return model, mesh

    def trainer(self, cfg, process, data, weights):
        lay = cfg.layout
        model, mesh = self.model_on_mesh(cfg, weights)
        o = cfg.optim
        optimizer = TorchAdamW(learning_rate=o.lr, weight_decay=o.weight_decay, beta_1=o.beta1, beta_2=o.beta2,
                               epsilon=o.eps)
        optimizer.build(model.trainable_variables)
        per_replica_bn = cfg.workload == "cnn" and lay.data > 1 and not cfg.sync_bn
        self.trainer_ = JaxTrainer(model, optimizer, cfg, mesh.backend_mesh, process.rank, process.processes,
                                   canonical_names(cfg.spec), per_replica_bn)
        return self.trainer_, data.train

    def metrics(self, process: worker.Process) -> dict:
        split = sorted(path for path, axes in self.plan.items() if any(axes))
        return {"jax_mode": self.mode, "processes": process.processes, "distribution": self.distribution_name,
                "mesh": dict(self.trainer_.mesh.shape), "devices": [str(d) for d in self.devices],
                "sharded_weights": {path: list(self.plan[path]) for path in split},
                "xla_flags": os.environ.get("XLA_FLAGS", ""),
                "cores": sorted(os.sched_getaffinity(0))}

    def finish(self, process: worker.Process) -> None:
        if self.mode == "multi_process":
            jax.distributed.shutdown()  # every process leaves together, as it joined


if __name__ == "__main__":
    sys.exit(worker.main(KerasJaxWorker()))
