"""Keras 3 on JAX: keras.distribution's DataParallel / ModelParallel (a LayoutMap on a DeviceMesh), XLA's
GSPMD partitioning the step and placing its collectives. One process over N devices (`single_process`, the
default), or one process per device joined by jax.distributed (`multi_process`, across hosts too)."""
from __future__ import annotations

from importlib import metadata
from pathlib import Path

from backends.base import Backend
from backends.keras_jax.devices import jax_env
from backends.keras_jax.modes import mode_of
from common.config import RunConfig
from common.devices import DevicePlan, accelerator_driver_present, cpu_plan, cuda_plan
from common.errors import Unsupported
from common.launch import LOOPBACK, Launcher, OneProcess, ProcessGroup, free_port, launch

WORKER = "backends.keras_jax.worker"


def gpu_names() -> list[str]:
    """The CUDA devices JAX sees (none with a CPU-only jaxlib)."""
    if not accelerator_driver_present():
        return []
    import jax  # only where a driver could show a GPU: the parent plans without JAX

    try:
        return [d.device_kind for d in jax.devices("gpu")]
    except RuntimeError:  # no GPU backend in this jaxlib, or no GPU
        return []


class KerasJax(Backend):
    name = "keras_jax"
    framework = "jax"
    strategy = "keras.distribution (GSPMD)"

    def framework_version(self) -> str:
        versions = {name: metadata.version(name) for name in ("jax", "keras", "keras-hub")}
        return f"{versions['jax']} (keras {versions['keras']}, keras-hub {versions['keras-hub']})"

    def strategy_name(self, cfg: RunConfig) -> str:
        lay = cfg.layout
        kind = "ModelParallel" if lay.tp > 1 or lay.sharded else "DataParallel"
        parts = [f"dp{lay.data}" + (" sharded state" if lay.sharded else ""), f"tp{lay.tp}"]
        return f"keras_jax {kind} {' x '.join(parts)} ({mode_of(cfg)})"

    def mode_name(self, cfg: RunConfig) -> str:
        return mode_of(cfg)  # Data- or ModelParallel and the dimensions follow from the layout

    def plan_devices(self, count: int, kind: str, threads_per_device: int) -> DevicePlan:
        gpus = gpu_names() if kind != "cpu" else []
        if kind == "cuda" and not gpus:
            raise Unsupported("no GPU visible to JAX (a CPU-only jaxlib, or no CUDA driver): pip install 'jax[cuda12]'")
        if not gpus:
            return cpu_plan(count, threads_per_device)
        if count > len(gpus):
            raise Unsupported(f"{count} devices asked for, JAX sees {len(gpus)} GPU(s); keras_jax offers no virtual "
                              "GPU devices (XLA gives each process its whole GPUs)")
        return cuda_plan(count, len(gpus), gpus)

    def spans_hosts(self, cfg: RunConfig) -> bool:
        return mode_of(cfg) == "multi_process"

    def check(self, cfg: RunConfig, plan: DevicePlan) -> None:
        lay = cfg.layout
        if cfg.workload == "cnn" and (lay.tp > 1 or lay.recomputes):
            flag = "--model-parallel" if lay.tp > 1 else "--recompute"
            raise Unsupported(f"keras_jax cnn {flag}: the CNN runs data parallel (and sharded state) only; its "
                              "convolutions dominate and do not split by tensor")
        if cfg.workload == "lm" and cfg.spec.kv_heads % lay.tp:
            spec = cfg.spec
            raise Unsupported(f"keras_jax lm --model-parallel {lay.tp}: {spec.name}'s {spec.kv_heads} key/value heads "
                              "do not split over it (its LayoutMap splits wk and wv by heads, replicating none)")
        if cfg.precision == "fp16":
            raise Unsupported("--precision fp16: keras_jax has no loss scaling in its stateless step; --precision "
                              "amp (bfloat16) needs none")
        if cfg.checkpoint_every or cfg.resume:
            raise Unsupported("--checkpoint-every/--resume: keras_jax writes no checkpoints (sharded arrays would "
                              "need orbax)")
        if cfg.compile:
            raise Unsupported("--compile: keras_jax's step is always one XLA program (jax.jit); there is no "
                              "uncompiled mode to switch from, and compile time is always recorded apart")

    def run(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        return launch(cfg, workdir, ["-m", WORKER], self._launcher(cfg, plan, workdir))

    def run_bare(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        if mode_of(cfg) != "single_process":
            raise Unsupported("the bare Keras loop runs model.fit in one process (--jax-mode single_process)")
        # No precision refused: the bare loop starts as the suite does (its dtype policy, mixed_bfloat16 under amp)
        # and fit compiles with XLA as the suite's step does.
        return launch(cfg, workdir, ["-m", "backends.keras_jax.bare"], self._launcher(cfg, plan, workdir))

    def _launcher(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> Launcher:
        if mode_of(cfg) == "single_process":
            env = jax_env(plan.kind, cfg.devices, plan.threads_per_device, first_core=0)
            return OneProcess(env, workdir / "worker.log", cfg.timeout_s)
        # JAX's coordinator service runs in process 0 (node 0): on loopback for one node, else at
        # --master-addr:--master-port, which every node was given.
        coordinator = (f"{cfg.master_addr}:{cfg.master_port}" if cfg.multi_node
                       else f"{LOOPBACK}:{cfg.master_port or free_port()}")
        ranks = range(cfg.first_rank_on_node, cfg.first_rank_on_node + cfg.devices_per_node)
        envs = [{**jax_env(plan.kind, 1, plan.threads_per_device, first_core=local * plan.threads_per_device,
                           gpu=local),
                 "PARBENCH_JAX_COORDINATOR": coordinator, "PARBENCH_JAX_PROCESS_ID": str(rank),
                 "PARBENCH_JAX_PROCESSES": str(cfg.devices)}
                for local, rank in enumerate(ranks)]
        return ProcessGroup(envs, [workdir / f"worker-{rank}.log" for rank in ranks], ranks[0], cfg.timeout_s)

    def notes(self, cfg: RunConfig, plan: DevicePlan) -> list[str]:
        lay, mode = cfg.layout, mode_of(cfg)
        where = (f"one process over {cfg.devices} device(s)" if mode == "single_process" else
                 f"{cfg.devices} processes, one device each, joined by jax.distributed"
                 + (f" across {cfg.nnodes} hosts" if cfg.multi_node else " on loopback"))
        notes = [f"mode {mode}: {where}; mesh (batch {lay.data}, model {lay.tp}); the global batch is one array "
                 "sharded over 'batch', and XLA's GSPMD partitions the jitted step and inserts its collectives",
                 "the step is a stateless jax.jit of Keras' stateless_call and the optimizer's stateless_apply, "
                 "compiled ahead of time on the first step (backend_metrics.compile_s); evaluation is a second "
                 "jitted program over the whole split",
                 "backend_metrics.comm_per_step: the collectives of the compiled step, read from its HLO (bytes: "
                 "the larger buffer of each, per device; counted, not timed)"]
        if lay.sharded:
            notes.append("--fsdp: every weight (and so its AdamW moments, which Keras lays out like it) "
                         "sharded over 'batch' along its largest dimension that divides, gradients constrained to "
                         "the same layout: GSPMD's ZeRO-3/FSDP (all-gather before use, reduce-scatter after)")
        if lay.recomputes:
            notes.append("--recompute: each transformer layer under keras.RematScope (jax.checkpoint)")
        if cfg.workload == "cnn" and lay.data > 1:
            notes.append("BatchNorm statistics per data-parallel replica as in DDP (the step vmaps the model over the "
                         "replicas' slices of the batch), synchronised over the whole batch with --sync-bn; "
                         "evaluation uses replica 0's moving statistics")
        if cfg.breakdown_steps:
            notes.append("--breakdown-steps: GSPMD puts the data-parallel reduction inside the step, so the probe runs "
                         "the gradients per replica (vmapped, unreduced) and the reduction as programs of their own; "
                         "tensor-parallel and sharded-state collectives stay in forward+backward")
        if mode == "multi_process":
            notes.append("JAX's coordinator service listens at the address given; its CPU collectives (gloo) bind "
                         "to the address this host's name resolves to (JAX offers no option to choose it)")
        if plan.kind == "cpu":
            notes.append("XLA's CPU threads: the process is pinned to devices x threads-per-device cores "
                         "(all of them when oversubscribed)")
        return notes
