"""MindSpore data / semi-auto / auto parallel: one process per device, launched by a child msrun."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import sys
from importlib import metadata
from pathlib import Path

from backends.base import Backend
from backends.mindspore_auto.parallel_config import ParallelConfig, parallel_config_of
from backends.mindspore_auto.pid_registry import FINISHED, PID_DIR_ENV
from common.breakdown import communication_note
from common.calibration import bare_result, refuse_bare_options
from common.config import RunConfig
from common.devices import DevicePlan, accelerator_driver_present, cpu_plan
from common.errors import Unsupported
from common.launch import LOOPBACK, RunFailed, child_env, free_port, launch, log_tail, run_supervised

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
BARE_SCRIPT = Path(__file__).with_name("bare.py")
LOG_TAIL_CHARS = 4000
MSRUN_LOG = "msrun.log"
# On AVX-512 hosts the oneDNN 3.10 inside MindSpore 2.10 runs a plain-layout (NCHW) convolution as
# `jit_uni_ncsp:conv+ref:any`, a reference matmul: 2.1-3.0 s for one 64 x 16->32 x 26x26 3x3 conv,
# against 37 ms with `x64:gemm:jit`, which it picks when the ISA is capped at AVX2 (ONEDNN_VERBOSE,
# 2 threads). The cap halves its AVX-512 brgemm matmul, so only the CNN gets it; a value the user
# set wins.
CPU_CONV_ISA_CAP = "AVX2"


def _accelerators(target: str) -> int:
    if not accelerator_driver_present():
        return 0
    import mindspore as ms  # seconds: only where a driver could show an accelerator

    # is_available logs "Backend GPU is not available" and the plugin's load error as WARNINGs: an
    # expected answer to a probe, which would otherwise come before (and bury) a one-line bad-input error.
    logging.disable(logging.WARNING)
    try:
        return ms.hal.device_count(target) if ms.hal.is_available(target) else 0
    finally:
        logging.disable(logging.NOTSET)


def _device_name(target: str) -> str:
    import mindspore as ms  # a GPU was found: MindSpore is imported already

    return ms.hal.get_device_name(0, target)


def mindspore_device_plan(count: int, kind: str, threads_per_device: int) -> DevicePlan:
    """Ascend, then GPU, when asked for or found by `auto`; else virtual CPU devices."""
    candidates = {"auto": (("Ascend", "ascend"), ("GPU", "cuda")), "cuda": (("GPU", "cuda"),)}.get(kind, ())
    for target, plan_kind in candidates:
        present = _accelerators(target)
        if present and count <= present:
            name = _device_name(target) if plan_kind == "cuda" else "Ascend NPU"
            return DevicePlan(plan_kind, count, False, 0, False, f"{count} of {present} x {name}", (name,) * count)
        if kind == "cuda":
            raise Unsupported(f"{count} CUDA devices requested, MindSpore sees {present}")
    return cpu_plan(count, threads_per_device)


# A Python exception line ("ValueError: ...") or one of MindSpore's [ERROR] lines.
_ERROR_LINE = re.compile(r"^([\w.]*(Error|Exception|Interrupt)\b|\[ERROR\])")


def _log_summary(path: Path, max_chars: int) -> str:
    """A worker log's exception lines when it has any (MindSpore pads them with call stacks and
    INFO chatter), else its last lines."""
    try:
        errors = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if _ERROR_LINE.match(ln)]
    except OSError:
        return "(unreadable)"
    if errors:
        return " | ".join(dict.fromkeys(errors[-6:]))[-max_chars:]
    return log_tail(path, lines=6, max_chars=max_chars)


def kill_leftover_workers(pid_dir: Path, config_path: Path) -> None:
    """SIGKILL every registered worker of this run that is still alive (msrun puts workers in
    sessions of their own, so killing msrun's process group does not reach them)."""
    for entry in pid_dir.glob("*") if pid_dir.is_dir() else ():
        with contextlib.suppress(OSError, ValueError):
            pid = int(entry.name)
            # The id may have been reused since: only a process running this run's worker is ours.
            if str(config_path).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running, not a zombie that msrun has yet to reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _registered_workers(pid_dir: Path) -> dict[int, tuple[str, bool]]:
    """pid -> (rank, finished) of every training worker that registered (the scheduler is left out)."""
    workers = {}
    for entry in pid_dir.glob("*") if pid_dir.is_dir() else ():
        with contextlib.suppress(OSError, ValueError):
            lines = entry.read_text().split("\n")
            role, _, rank = lines[0].partition(" ")
            if role == "MS_WORKER":
                workers[int(entry.name)] = (rank, FINISHED in lines)
    return workers


# msrun's own line when it sees a worker exit badly (it then kills the others).
_MSRUN_WORKER_EXIT = re.compile(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)")


def dead_worker(pid_dir: Path, msrun_log: Path) -> str | None:
    """'rank R (pid P) died ...' once a training worker is gone without finishing, else None.

    msrun notices a worker's bad exit within a second and kills the others, but then waits for its
    scheduler, which waits out MS_NODE_TIMEOUT for the lost nodes and blames whichever timed out
    first (observed: 128 s, naming rank 0 for a killed rank 1). So the harness watches the workers
    itself. When several are gone, msrun's log says which went first."""
    workers = _registered_workers(pid_dir)
    dead = {pid: rank for pid, (rank, finished) in workers.items() if not finished and not _alive(pid)}
    if not dead:
        return None
    try:
        first = _MSRUN_WORKER_EXIT.search(msrun_log.read_text(errors="replace"))
    except OSError:
        first = None
    if first and int(first[1]) in workers:
        pid, code = int(first[1]), int(first[2])
        signal_note = f" (signal {-code})" if code < 0 else ""
        return f"rank {workers[pid][0]} (pid {pid}) exited with code {code}{signal_note} first"
    if len(dead) == 1:
        [(pid, rank)] = dead.items()
        return f"rank {rank} (pid {pid}) died before finishing (killed, or exited without a result)"
    return f"ranks {', '.join(sorted(dead.values()))} died before finishing (which first is not known)"


def msrun_log_tails(log_dir: Path) -> str:
    """What every msrun worker, the scheduler and msrun itself logged last, labelled, for a failed
    run's record (msrun's own log, beside the folder, says which worker exited with what code)."""
    logs = sorted(log_dir.glob("worker_*.log")) + sorted(log_dir.glob("scheduler.log"))
    logs += [p for p in (log_dir.parent / MSRUN_LOG,) if p.is_file()]
    if not logs:
        return f"(no msrun logs in {log_dir})"
    return " || ".join(f"{p.name}: {_log_summary(p, LOG_TAIL_CHARS // len(logs))}" for p in logs)


def caps_conv_isa(cfg: RunConfig, plan: DevicePlan) -> bool:
    return plan.kind == "cpu" and cfg.workload == "cnn" and "ONEDNN_MAX_CPU_ISA" not in os.environ


def msrun_nodes(cfg: RunConfig) -> list[str]:
    """msrun's cluster arguments: the scheduler on loopback at a free port for one node; on node 0
    (the host of --master-addr) for several, with --node_rank so that ranks are numbered node by node."""
    if not cfg.multi_node:
        return [f"--worker_num={cfg.devices}", f"--local_worker_num={cfg.devices}",
                f"--master_addr={LOOPBACK}", f"--master_port={cfg.master_port or free_port()}"]
    return [f"--worker_num={cfg.devices}", f"--local_worker_num={cfg.devices_per_node}",
            f"--master_addr={cfg.master_addr}", f"--master_port={cfg.master_port}", f"--node_rank={cfg.node_rank}"]


def check_msrun_python(env: dict[str, str]) -> None:
    """msrun starts each worker as a bare `python` found on PATH; child_env puts this interpreter's
    folder first, which is enough only where that folder holds a `python` (a venv always does)."""
    found = shutil.which("python", path=env.get("PATH"))
    if found is None or Path(found).parent != Path(sys.executable).parent:
        raise Unsupported(f"msrun starts its workers as `python` from PATH, which is {found or 'missing'}, not this "
                          f"run's {sys.executable}: run from a virtual environment (its bin/ has `python`)")


class MSRun:
    """msrun, one process per device (common.launch.Launcher). The harness watches the workers itself: msrun
    would wait out its scheduler's node timeout for a dead one, and puts them out of reach of a group kill."""

    def __init__(self, cfg: RunConfig, plan: DevicePlan, workdir: Path):
        self.cfg, self.plan, self.workdir = cfg, plan, workdir
        self.log_dir, self.pid_dir, self.log = workdir / "msrun", workdir / "worker-pids", workdir / MSRUN_LOG
        self.cause: str | None = None

    def worker_logs(self) -> str:
        return msrun_log_tails(self.log_dir)

    def start(self, worker: list[str]) -> int:
        cfg = self.cfg
        cmd = [sys.executable, "-m", "mindspore.parallel.cluster.run", *msrun_nodes(cfg), f"--log_dir={self.log_dir}",
               "--join=True", f"--cluster_time_out={int(cfg.collective_timeout_s)}", *worker]
        timeout = str(int(cfg.collective_timeout_s))
        env = {"OMP_NUM_THREADS": str(max(1, self.plan.threads_per_device)),
               "GLOG_v": "2",  # warnings and errors: INFO would bury a failure's cause in the logs
               # A dead peer must end the run: without these the scheduler waits for lost nodes
               # and the CPU collectives for their peers far longer than --collective-timeout.
               "MS_NODE_TIMEOUT": timeout, "MS_CPU_COMM_OP_TIMEOUT": timeout, PID_DIR_ENV: str(self.pid_dir)}
        if caps_conv_isa(cfg, self.plan):
            env["ONEDNN_MAX_CPU_ISA"] = CPU_CONV_ISA_CAP
        env = child_env(env)
        check_msrun_python(env)
        try:
            # The worker argv ends with RESULT (common.launch.launch): msrun's teardown after it took 7-9 s.
            return run_supervised(cmd, env, self.log, cfg.timeout_s, health=lambda: dead_worker(self.pid_dir, self.log),
                                  result=Path(worker[-1]))
        except RunFailed as exc:
            raise RunFailed(f"{exc}; {self.worker_logs()}") from None
        finally:
            self.cause = dead_worker(self.pid_dir, self.log)  # before the leftovers are killed below
            kill_leftover_workers(self.pid_dir, self.workdir / "config.json")

    def failure(self, code: int) -> str:
        if code == 0:
            return f"msrun exited without a result: {self.worker_logs()}"
        because = f", {self.cause}" if self.cause else ""
        return f"msrun exited with code {code}{because}: {self.worker_logs()}"


class MindSporeAuto(Backend):
    name = "mindspore_auto"
    framework = "mindspore"
    strategy = "MindSpore auto parallel (msrun)"

    def framework_version(self) -> str:
        return metadata.version("mindspore")

    def plan_devices(self, count: int, kind: str, threads_per_device: int) -> DevicePlan:
        return mindspore_device_plan(count, kind, threads_per_device)

    @staticmethod
    def layout(cfg: RunConfig) -> ParallelConfig:
        return parallel_config_of(cfg)

    def spans_hosts(self, cfg: RunConfig) -> bool:
        return True

    def mode_name(self, cfg: RunConfig) -> str:
        return f"{parallel_config_of(cfg).mode} parallel"  # --parallel-mode: data, semi_auto or auto

    def check(self, cfg: RunConfig, plan: DevicePlan) -> None:
        pcfg = self.layout(cfg)
        pcfg.validate(cfg.devices, cfg.spec, cfg.global_batch, cfg.grad_accum)
        if cfg.workload == "lm" and cfg.spec.kv_heads % pcfg.model_parallel:
            raise Unsupported(f"mindspore_auto lm --model-parallel {pcfg.model_parallel}: {cfg.spec.name}'s "
                              f"{cfg.spec.kv_heads} key/value heads do not split over it (the strategies split the "
                              "attention by key/value head, each device holding whole groups of query heads)")
        if plan.kind == "cpu" and pcfg.mode != "data":
            raise Unsupported(f"--parallel-mode {pcfg.mode} (model parallel {pcfg.model_parallel}, pipeline stages "
                              f"{pcfg.pipeline_stage}) requires Ascend or GPU: MindSpore runs only DATA_PARALLEL "
                              "on CPU")
        if cfg.precision == "amp":
            raise Unsupported("--precision amp (bfloat16): MindSpore 2.10 has no bfloat16 CPU kernels for the "
                              "models' convolutions and matmuls, and bfloat16 on its GPU and Ascend paths is "
                              "untried here; --precision fp16 is float16 with loss scaling")
        if cfg.compile not in ("", "default"):
            raise Unsupported(f"--compile {cfg.compile} is a torch.compile mode; MindSpore's jit levels have no modes")
        if cfg.sync_bn:
            raise Unsupported("--sync-bn: mindspore_auto keeps BatchNorm statistics per rank")

    def run(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        return launch(cfg, workdir, [str(WORKER_SCRIPT)], MSRun(cfg, plan, workdir))

    def run_bare(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        refuse_bare_options(cfg, self.name)
        msrun = MSRun(cfg, plan, workdir)

        def every_rank(result_path: Path) -> dict:  # each rank times its own loop and writes RESULT.rank<R>.json
            ranks = [json.loads(p.read_text()) for p in sorted(workdir.glob(f"{result_path.name}.rank*.json"))]
            if len(ranks) != cfg.devices:
                raise RunFailed(f"{len(ranks)} of {cfg.devices} bare ranks left a result: {msrun.worker_logs()}")
            return bare_result(ranks, cfg.global_batch, ranks[0]["idiom"])

        return launch(cfg, workdir, [str(BARE_SCRIPT)], msrun, "bare.json", read=every_rank)

    def notes(self, cfg: RunConfig, plan: DevicePlan) -> list[str]:
        p = self.layout(cfg)
        notes = [f"MindSpore {p.mode} parallel, graph mode: data {p.data_parallel} x model {p.model_parallel} x "
                 f"pipeline {p.pipeline_stage} (micro-batches {p.micro_batch_num}, optimizer shard "
                 f"{p.optimizer_shard}, recompute {p.recompute}, vocab_emb_dp {p.vocab_emb_dp})",
                 "graph compilation is timed apart (backend_metrics.compile_s, eval_compile_s) and excluded "
                 "from throughput",
                 ("--compile: the train step is a compiled graph with or without the flag (GRAPH_MODE); the flag "
                  "sets its jit level to O1 (common optimizations and automatic operator fusion, experimental) "
                  "instead of MindSpore's default choice (backend_metrics.jit_level)" if cfg.compile else
                  "the train step is a compiled graph (GRAPH_MODE) at MindSpore's default jit level"),
                 "cross-entropy is a log-sum-exp of primitives; a prediction counts as correct when the "
                 "label's logit equals the row maximum (ties count, where argmax would pick one)"]
        if cfg.precision == "fp16":
            notes.append("--precision fp16: amp.auto_mixed_precision O1 (float16 Conv2D, MatMul, BatchMatMul, Dense; "
                         "the rest float32) with amp.DynamicLossScaler at DynamicLossScaleManager's defaults (from "
                         "2^24, doubled after 2000 finite steps, halved and the update skipped on overflow: "
                         "backend_metrics.loss_scale_skipped_steps)")
        if cfg.workload == "lm":
            notes.append("lm: attention from batched matmuls, a fixed causal bias of -1e9 and a softmax, where torch "
                         "calls scaled_dot_product_attention (MindSpore's fused ops.flash_attention_score runs on "
                         "Ascend only); RMSNorm from primitives (ops.RmsNorm has no CPU kernel)")
        if p.mode != "data":
            notes.append("every process loads the whole global batch (full_batch) and the compiler splits it")
        if cfg.workload == "cnn" and p.data_parallel > 1:
            notes.append("BatchNorm statistics are per rank (no SyncBatchNorm), as torch_ddp by default")
        if caps_conv_isa(cfg, plan):
            notes.append(f"ONEDNN_MAX_CPU_ISA={CPU_CONV_ISA_CAP}: MindSpore 2.10's oneDNN runs NCHW convolutions "
                         "through a reference matmul on AVX-512 (about 80x slower); capped, it uses its jit gemm")
        if plan.kind == "cpu":
            notes.append("MindSpore on CPU runs DATA_PARALLEL only; gradients all-reduced over mccl between "
                         "msrun processes")
        return notes

    def measured_notes(self, record: dict) -> list[str]:
        collective = {"cpu": "mccl", "cuda": "nccl"}.get(record.get("device_kind"), "hccl")
        note = communication_note(record, f"DistributedGradReducer over {collective}, after the backward")
        return [note] if note else []
