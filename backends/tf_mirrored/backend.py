"""TensorFlow + Keras 3: MirroredStrategy over N logical devices in one process (`mirrored`, the
default), or MultiWorkerMirroredStrategy with one process per device through TF_CONFIG (`multi_worker`)."""
from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

from backends.base import Backend
from backends.tf_mirrored.devices import GPU_SLICE_MB, gpu_slices, physical_gpus
from backends.tf_mirrored.modes import STRATEGY_NAMES, all_reduce_implementation, mode_of
from common.breakdown import communication_note
from common.calibration import refuse_bare_options
from common.config import RunConfig
from common.devices import DevicePlan, cpu_plan, cuda_plan
from common.errors import Unsupported
from common.launch import LOOPBACK, Launcher, OneProcess, ProcessGroup, RunFailed, free_port, launch
from common.nodes import address_towards, exchange

WORKER = "backends.tf_mirrored.worker"


def tf_device_plan(count: int, kind: str, threads_per_device: int) -> DevicePlan:
    """Real GPUs when there are `count`, slices of GPU 0 when there are fewer, else virtual CPUs."""
    gpus = physical_gpus()
    if kind == "cuda" and not gpus:
        raise Unsupported("no GPU visible to TensorFlow (a CPU build, or no CUDA driver)")
    if kind == "cpu" or not gpus:
        return cpu_plan(count, threads_per_device)
    if not gpu_slices(count, len(gpus)):
        return cuda_plan(count, len(gpus), gpus)
    return DevicePlan("cuda", count, True, 0, False,
                      f"{count} logical GPU slices of {GPU_SLICE_MB} MiB on 1 x {gpus[0]}", (gpus[0],))


class TFMirrored(Backend):
    name = "tf_mirrored"
    framework = "tensorflow"
    strategy = "MirroredStrategy"

    def framework_version(self) -> str:
        versions = {name: metadata.version(name) for name in ("tensorflow", "keras", "keras-hub")}
        return f"{versions['tensorflow']} (keras {versions['keras']}, keras-hub {versions['keras-hub']})"

    def strategy_name(self, cfg: RunConfig) -> str:
        return STRATEGY_NAMES[mode_of(cfg)]

    def plan_devices(self, count: int, kind: str, threads_per_device: int) -> DevicePlan:
        return tf_device_plan(count, kind, threads_per_device)

    def spans_hosts(self, cfg: RunConfig) -> bool:
        return mode_of(cfg) == "multi_worker"

    def check(self, cfg: RunConfig, plan: DevicePlan) -> None:
        if cfg.compile not in ("", "default"):
            raise Unsupported(f"--compile {cfg.compile} is a torch.compile mode; XLA (jit_compile) has no modes")

    def run(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        return launch(cfg, workdir, ["-m", WORKER], self._launcher(cfg, plan, workdir))

    def run_bare(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        if mode_of(cfg) != "mirrored":
            raise Unsupported("the bare Keras loop runs MirroredStrategy in one process (--tf-mode mirrored)")
        refuse_bare_options(cfg, self.name)
        return launch(cfg, workdir, ["-m", "backends.tf_mirrored.bare"], self._launcher(cfg, plan, workdir))

    def _launcher(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> Launcher:
        if mode_of(cfg) == "mirrored":
            # One process drives every device: its pools get the cores of all of them.
            env = {"OMP_NUM_THREADS": str(max(1, plan.threads_per_device * cfg.devices))}
            return OneProcess(env, workdir / "worker.log", cfg.timeout_s)
        # One process per device; this node's workers are indices node_rank x per-node onwards, and the
        # worker index is the rank: TF_CONFIG's task index orders the replicas.
        cluster = {"worker": self._cluster(cfg)}
        ranks = range(cfg.first_rank_on_node, cfg.first_rank_on_node + cfg.devices_per_node)
        envs = [{"OMP_NUM_THREADS": str(max(1, plan.threads_per_device)),
                 "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}})}
                for rank in ranks]
        return ProcessGroup(envs, [workdir / f"worker-{rank}.log" for rank in ranks], ranks[0], cfg.timeout_s)

    @staticmethod
    def _cluster(cfg: RunConfig) -> list[str]:
        """Every worker's address:port, node by node. Ports are picked free at launch; with several
        hosts each node picks its own and the nodes swap them through node 0 before any worker starts."""
        if not cfg.multi_node:
            return [f"{LOOPBACK}:{free_port()}" for _ in range(cfg.devices)]
        local = address_towards(cfg.master_addr)
        mine = {"address": local, "ports": [free_port(local) for _ in range(cfg.devices_per_node)]}
        try:
            nodes = exchange(cfg.master_addr, cfg.master_port, cfg.node_rank, cfg.nnodes, mine,
                             cfg.collective_timeout_s)
        except (TimeoutError, OSError, ValueError) as exc:
            raise RunFailed(f"TF_CONFIG exchange failed: {exc}") from None
        return [f"{node['address']}:{port}" for node in nodes for port in node["ports"]]

    def notes(self, cfg: RunConfig, plan: DevicePlan) -> list[str]:
        mode = mode_of(cfg)
        implementation = all_reduce_implementation(plan.kind, cfg.devices, len(plan.hardware))
        all_reduce = f"CollectiveAllReduce ({implementation})"
        if mode == "mirrored":
            threads = f"intra-op threads {plan.threads_per_device * cfg.devices} (N x threads per device)"
            notes = [f"mode mirrored: one process, {STRATEGY_NAMES[mode]} over {cfg.devices} logical device(s), "
                     f"cross-device all-reduce {all_reduce}, {threads}"]
        else:
            where = f"on {cfg.nnodes} hosts" if cfg.multi_node else f"on {LOOPBACK}"
            notes = [f"mode multi_worker: {cfg.devices} process(es) {where}, {STRATEGY_NAMES[mode]}, "
                     f"cross-process all-reduce {all_reduce} over gRPC, "
                     f"intra-op threads {plan.threads_per_device} per process",
                     "TensorFlow's gRPC servers listen on all interfaces (0.0.0.0) whatever address TF_CONFIG "
                     "gives; TensorFlow has no option to bind them to loopback, so on an untrusted network "
                     "firewall the run's ports or use --tf-mode mirrored"]
        notes += [
            "tf.data feeds common's batches (from_generator, one element per replica piece); the distributed "
            "iterator prefetches one element per device, so data_wait is the wait on that buffer",
            ("--compile: each replica's forward and backward is compiled by XLA (tf.function jit_compile=True) "
             "on its device; the gradient all-reduce and AdamW stay in the plain tf.function step, since one XLA "
             "cluster cannot span the replicas' devices; tracing and compiling fall in the warm-up, timed apart "
             "in backend_metrics.compile_s" if cfg.compile else
             "the training step is a tf.function without XLA; the first (traced) step falls in the warm-up"),
        ]
        if cfg.workload == "cnn":
            notes.append("BatchNorm moving variance is updated with the biased batch variance (torch: unbiased); "
                         "affects evaluation only")
            if cfg.devices > 1 and not cfg.sync_bn:
                notes.append("BatchNorm statistics are per replica (no synchronized BatchNorm), as in DDP")
        elif cfg.workload == "lm":
            notes.append("the decoder is keras-hub's LlamaBackbone with its token embedding's untied reverse "
                         "projection as the output layer, from common's initial weights; trainable parameters equal "
                         "the spec (backend_metrics.trainable_params)")
        else:
            notes.append("BERT from keras-hub's BertBackbone + MaskedLMHead with common's initial weights; the model "
                         "ends at the sequence output, so the pooler (h*h+h parameters) is excluded, not frozen; "
                         "trainable parameters equal the spec (backend_metrics.trainable_params)")
        if cfg.precision == "fp16":
            notes.append("--precision fp16: Keras mixed_float16 with LossScaleOptimizer (dynamic scale from 2^15, "
                         "halved and the step skipped on overflow, decided across all replicas: "
                         "backend_metrics.loss_scale_skipped_steps)")
        if cfg.warmup_steps == 0:
            notes.append("--warmup-steps 0: the timed steps include tf.function tracing")
        return notes

    def measured_notes(self, record: dict) -> list[str]:
        note = communication_note(record, "the strategy's all-reduce, as apply_gradients runs it")
        return [note] if note else []
