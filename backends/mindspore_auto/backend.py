"""MindSpore data / semi-auto / auto parallel: one process per device, launched by a child msrun."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
from pathlib import Path

import mindspore as ms

from backends.base import Backend
from backends.mindspore_auto.parallel_config import ParallelConfig, parallel_config_from
from backends.mindspore_auto.worker import PID_DIR_ENV
from common.config import RunConfig
from common.devices import DevicePlan, cpu_plan
from common.errors import Unsupported
from common.launch import RunFailed, child_env, free_port, log_tail, run_supervised
from common.nodes import LOOPBACK

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
LOG_TAIL_CHARS = 4000
MSRUN_LOG = "msrun.log"


def _accelerators(target: str) -> int:
    return ms.hal.device_count(target) if ms.hal.is_available(target) else 0


def mindspore_device_plan(count: int, kind: str, threads_per_device: int) -> DevicePlan:
    """Ascend, then GPU, when asked for or found by `auto`; else virtual CPU devices."""
    candidates = {"auto": (("Ascend", "ascend"), ("GPU", "cuda")), "cuda": (("GPU", "cuda"),)}.get(kind, ())
    for target, plan_kind in candidates:
        present = _accelerators(target)
        if present and count <= present:
            name = ms.hal.get_device_name(0, target) if plan_kind == "cuda" else "Ascend NPU"
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


def msrun_log_tails(log_dir: Path) -> str:
    """What every msrun worker, the scheduler and msrun itself logged last, labelled, for a failed
    run's record (msrun's own log, beside the folder, says which worker exited with what code)."""
    logs = sorted(log_dir.glob("worker_*.log")) + sorted(log_dir.glob("scheduler.log"))
    logs += [p for p in (log_dir.parent / MSRUN_LOG,) if p.is_file()]
    if not logs:
        return f"(no msrun logs in {log_dir})"
    return " || ".join(f"{p.name}: {_log_summary(p, LOG_TAIL_CHARS // len(logs))}" for p in logs)


def msrun_nodes(cfg: RunConfig) -> list[str]:
    """msrun's cluster arguments: the scheduler on loopback at a free port for one node; on node 0
    (the host of --master-addr) for several, with --node_rank so that ranks are numbered node by node."""
    if not cfg.multi_node:
        return [f"--worker_num={cfg.devices}", f"--local_worker_num={cfg.devices}",
                f"--master_addr={LOOPBACK}", f"--master_port={cfg.master_port or free_port()}"]
    return [f"--worker_num={cfg.devices}", f"--local_worker_num={cfg.devices_per_node}",
            f"--master_addr={cfg.master_addr}", f"--master_port={cfg.master_port}", f"--node_rank={cfg.node_rank}"]


class MindSporeAuto(Backend):
    name = "mindspore_auto"
    framework = "mindspore"
    strategy = "MindSpore auto parallel (msrun)"

    def framework_version(self) -> str:
        return ms.__version__

    def plan_devices(self, count: int, kind: str, threads_per_device: int) -> DevicePlan:
        return mindspore_device_plan(count, kind, threads_per_device)

    @staticmethod
    def layout(cfg: RunConfig) -> ParallelConfig:
        return parallel_config_from(cfg.backend_options, cfg.devices)

    def spans_hosts(self, cfg: RunConfig) -> bool:
        return True

    def check(self, cfg: RunConfig, plan: DevicePlan) -> None:
        pcfg = self.layout(cfg)
        pcfg.validate(cfg.devices, cfg.spec, cfg.global_batch, cfg.grad_accum)
        if plan.kind == "cpu" and pcfg.mode != "data":
            raise Unsupported(f"--parallel-mode {pcfg.mode} (model parallel {pcfg.model_parallel}, pipeline stages "
                              f"{pcfg.pipeline_stage}) requires Ascend or GPU: MindSpore runs only DATA_PARALLEL "
                              "on CPU")
        if cfg.precision != "fp32":
            raise Unsupported(f"--precision {cfg.precision}: mindspore_auto trains in fp32 only")
        if cfg.sync_bn:
            raise Unsupported("--sync-bn: mindspore_auto keeps BatchNorm statistics per rank")
        if plan.kind == "cpu" and cfg.workload == "cnn" and cfg.devices > 1:
            # Observed twice with MindSpore 2.10 on CPU: all steps train, then one worker exits its main
            # thread and the other waits in a collective until --timeout. Refusing beats an hour's hang.
            raise Unsupported("cnn on 2+ MindSpore CPU workers stalls after training (a worker leaves the "
                              "final collectives); known defect, see issue #5")

    def run(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        config_path, result_path = workdir / "config.json", workdir / "result.json"
        log_dir = workdir / "msrun"
        cfg.save(config_path)
        cmd = [sys.executable, "-m", "mindspore.parallel.cluster.run", *msrun_nodes(cfg), f"--log_dir={log_dir}",
               "--join=True", f"--cluster_time_out={int(cfg.collective_timeout_s)}",
               str(WORKER_SCRIPT), str(config_path), str(result_path)]
        timeout = str(int(cfg.collective_timeout_s))
        env = {"OMP_NUM_THREADS": str(max(1, plan.threads_per_device)),
               "GLOG_v": "2",  # warnings and errors: INFO would bury a failure's cause in the logs
               # A dead peer must end the run: without these the scheduler waits for lost nodes
               # and the CPU collectives for their peers far longer than --collective-timeout.
               "MS_NODE_TIMEOUT": timeout, "MS_CPU_COMM_OP_TIMEOUT": timeout}
        env[PID_DIR_ENV] = str(workdir / "worker-pids")
        try:
            rc = run_supervised(cmd, child_env(env), workdir / MSRUN_LOG, cfg.timeout_s)
        except RunFailed as exc:
            raise RunFailed(f"{exc}; {msrun_log_tails(log_dir)}") from None
        finally:
            kill_leftover_workers(workdir / "worker-pids", config_path)
        if rc != 0 or not result_path.is_file():
            raise RunFailed(f"msrun exited with code {rc}: {msrun_log_tails(log_dir)}")
        return json.loads(result_path.read_text())

    def notes(self, cfg: RunConfig, plan: DevicePlan) -> list[str]:
        p = self.layout(cfg)
        notes = [f"MindSpore {p.mode} parallel, graph mode: data {p.data_parallel} x model {p.model_parallel} x "
                 f"pipeline {p.pipeline_stage} (micro-batches {p.micro_batch_num}, optimizer shard "
                 f"{p.optimizer_shard}, recompute {p.recompute}, vocab_emb_dp {p.vocab_emb_dp})",
                 "graph compilation is timed apart (backend_metrics.compile_s, eval_compile_s) and excluded "
                 "from throughput",
                 "cross-entropy is a log-sum-exp of primitives; a prediction counts as correct when the "
                 "label's logit equals the row maximum (ties count, where argmax would pick one)"]
        if p.mode != "data":
            notes.append("every process loads the whole global batch (full_batch) and the compiler splits it")
        if cfg.workload == "cnn" and p.data_parallel > 1:
            notes.append("BatchNorm statistics are per rank (no SyncBatchNorm), as torch_ddp by default")
        if plan.kind == "cpu":
            notes.append("MindSpore on CPU runs DATA_PARALLEL only; gradients all-reduced over mccl between "
                         "msrun processes")
        return notes
