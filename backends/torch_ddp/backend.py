"""PyTorch DistributedDataParallel: one process per device, launched by a child torchrun."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch

from backends.base import refuse_non_data_parallel
from backends.torch_common.backend import TorchBackend
from common.config import RunConfig
from common.devices import DevicePlan, cpu_plan, cuda_plan, shared_cuda_plan
from common.errors import Unsupported
from common.launch import LOOPBACK, RunFailed, child_env, free_port, log_tail, run_supervised
from common.nodes import address_towards, interface_of


def cuda_device_names() -> list[str]:
    """The CUDA devices this process sees, by name (none on a CPU build or without a driver)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [torch.cuda.get_device_name(i) for i in range(gpus)]


def torch_device_plan(count: int, kind: str, threads_per_device: int) -> DevicePlan:
    return plan_over(count, kind, threads_per_device, cuda_device_names())


def plan_over(count: int, kind: str, threads_per_device: int, gpu_names: list[str]) -> DevicePlan:
    """CUDA when asked for or when `auto` finds GPUs, else virtual CPU devices. Fewer GPUs than `count`:
    virtual devices, processes sharing the GPUs round robin (rank r on GPU r mod gpus) and talking over
    gloo, since NCCL refuses two ranks on one GPU ("invalid usage"). The one place torch backends plan;
    `gpu_names` are the GPUs present (a parameter, so that tests can plan for GPUs they do not have)."""
    if kind == "cuda" and not gpu_names:
        raise Unsupported("CUDA devices requested, none present")
    if kind == "cpu" or not gpu_names:
        return cpu_plan(count, threads_per_device)
    if count <= len(gpu_names):
        return cuda_plan(count, len(gpu_names), gpu_names)
    return shared_cuda_plan(count, gpu_names, "processes sharing a GPU, gloo collectives")


def process_group_backend(device_kind: str, virtual: bool) -> str:
    """NCCL between real GPUs; gloo on CPUs and between processes sharing a GPU."""
    return "nccl" if device_kind == "cuda" and not virtual else "gloo"


def failed_rank(log: Path) -> tuple[str, str] | None:
    """(rank, exit code) of torchrun's root-cause report, when it has one."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    cause = text.rpartition("Root Cause")[2]
    rank, code = re.search(r"rank\s*:\s*(\d+)", cause), re.search(r"exitcode\s*:\s*(-?\d+)", cause)
    return (rank[1], code[1]) if rank and code else None


def first_failure(log: Path) -> str:
    """', rank R exited with code C' from torchrun's root-cause report, when it has one."""
    failed = failed_rank(log)
    if failed is None:
        return ""
    rank, code = failed
    signal_note = f" (signal {-int(code)})" if int(code) < 0 else ""
    return f", rank {rank} exited with code {code}{signal_note} first"


# torchrun's agent: its log lines ("E1123 10:41:00.446 4346 torch/distributed/elastic/...") and the
# ChildFailedError traceback and report it ends with.
_AGENT_LINE = re.compile(r"^[DIWEF]\d{4} [\d:.]+ +\d+ torch/distributed/")


def worker_output_tail(log: Path, rank: str | None = None, lines: int = 4) -> str:
    """The workers' last output before torchrun's failure report: where a rank says why it failed (a
    Python exception, "terminate called ...") while the report itself only gives the signal. torch tags
    a rank's Python traceback "[rankR]:"; when the failing rank left such lines, those are the ones."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    before_report = text.rpartition("ChildFailedError")[0].rpartition("Traceback (most recent call last)")[0]
    output = [ln for ln in before_report.splitlines() if ln.strip() and not _AGENT_LINE.match(ln)]
    own = [ln for ln in output if rank is not None and ln.startswith(f"[rank{rank}]:")]
    return " | ".join((own or output)[-lines:])[-1500:]


# A port picked free can still be taken by a process outside parbench before torchrun binds it:
# torchrun then fails at once (is_host is explicit) and the run is started again on another port.
PORT_ATTEMPTS = 3


def rendezvous(cfg: RunConfig) -> tuple[list[str], dict[str, str]]:
    """torchrun's c10d rendezvous arguments and gloo's interface: loopback and a free port for one
    node; node 0's address for several, each node advertising the address it reaches node 0 from.
    is_host is explicit so that a port clash fails at once instead of joining another run's store."""
    if cfg.multi_node:
        local = address_towards(cfg.master_addr)
        endpoint, run_key, iface = f"{cfg.master_addr}:{cfg.master_port}", "parbench", interface_of(local)
    else:
        local = LOOPBACK
        endpoint, run_key, iface = f"{LOOPBACK}:{cfg.master_port or free_port()}", cfg.run_id, "lo"
    args = [f"--nnodes={cfg.nnodes}", f"--nproc-per-node={cfg.devices_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_key}", f"--local-addr={local}",
            f"--rdzv-conf=join_timeout={int(cfg.collective_timeout_s)},is_host={int(cfg.node_rank == 0)}"]
    # gloo otherwise picks the interface of the host name, which may be neither loopback nor the
    # one that reaches the other nodes
    return args, {"GLOO_SOCKET_IFNAME": iface}


def port_taken(log: Path, offset: int) -> bool:
    """Whether torchrun's output after `offset` says the rendezvous port was in use."""
    try:
        with open(log, "rb") as fh:
            fh.seek(offset)
            return b"EADDRINUSE" in fh.read()
    except OSError:
        return False


def rendezvous_failure(log: Path, cfg: RunConfig) -> str:
    """A plain reason when the nodes never met (torchrun's own message is a long traceback)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    if "EADDRINUSE" in text:
        return ", the rendezvous port was taken by another process (EADDRINUSE)"
    if "RendezvousTimeoutError" in text:
        return (f", rendezvous timed out: {cfg.nnodes} node(s) did not all join within "
                f"{cfg.collective_timeout_s:g} s (--collective-timeout)")
    return ""


class TorchDDP(TorchBackend):
    name = "torch_ddp"
    strategy = "DistributedDataParallel"
    # The module torchrun starts once per rank; torch_3d shares this launch with its own worker.
    worker_module = "backends.torch_ddp.worker"

    def plan_devices(self, count: int, kind: str, threads_per_device: int) -> DevicePlan:
        return torch_device_plan(count, kind, threads_per_device)

    def spans_hosts(self, cfg: RunConfig) -> bool:
        return True

    def check(self, cfg: RunConfig, plan: DevicePlan) -> None:
        refuse_non_data_parallel(cfg, self.name)
        if cfg.sync_bn and plan.kind == "cpu" and cfg.devices > 1:
            raise Unsupported("--sync-bn: torch's SyncBatchNorm runs on GPU devices only")

    def run(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        return self.torchrun(cfg, plan, workdir, self.worker_module)

    def run_bare(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        return self.torchrun(cfg, plan, workdir, "backends.torch_ddp.bare")

    def torchrun(self, cfg: RunConfig, plan: DevicePlan, workdir: Path, module: str) -> dict:
        """Start `module CONFIG RESULT` under torchrun, one process per device; its result."""
        config_path, result_path = workdir / "config.json", workdir / "result.json"
        cfg.save(config_path)
        log = workdir / "torchrun.log"
        for _ in range(PORT_ATTEMPTS):
            offset = log.stat().st_size if log.exists() else 0
            rdzv_args, rdzv_env = rendezvous(cfg)
            # torchrun, except that the stores it hosts on loopback listen on loopback only
            cmd = [sys.executable, "-m", "backends.torch_ddp.torchrun", *rdzv_args,
                   f"--max-restarts={cfg.max_restarts}",
                   "-m", module, str(config_path), str(result_path)]
            env = {"OMP_NUM_THREADS": str(max(1, plan.threads_per_device)), **rdzv_env,
                   "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
            rc = run_supervised(cmd, child_env(env), log, cfg.timeout_s)
            # A port the user gave, or node 0's, is not ours to change.
            if rc == 0 or cfg.multi_node or cfg.master_port or not port_taken(log, offset):
                break
        if rc != 0 or not result_path.is_file():
            failed = failed_rank(log)
            workers_said = worker_output_tail(log, failed[0] if failed else None)
            raise RunFailed(f"torchrun exited with code {rc}{rendezvous_failure(log, cfg)}{first_failure(log)}: "
                            + (f"last worker output: {workers_said}" if workers_said else log_tail(log)))
        return json.loads(result_path.read_text())

    def notes(self, cfg: RunConfig, plan: DevicePlan) -> list[str]:
        notes = self.precision_notes(cfg)
        if cfg.workload == "cnn" and cfg.devices > 1 and not cfg.sync_bn:
            notes.append("BatchNorm statistics are per rank (no SyncBatchNorm), as DDP does by default")
        if plan.kind == "cpu":
            link = f"TCP between {cfg.nnodes} hosts" if cfg.multi_node else "loopback"
            notes.append(f"gloo all-reduce over {link} between CPU processes")
        if plan.kind == "cuda" and plan.virtual:
            notes.append(f"virtual GPUs: {cfg.devices} processes share {plan.physical_devices} GPU(s) and all-reduce "
                         "CUDA tensors over gloo (NCCL refuses two ranks on one GPU); real GPUs use NCCL")
        return notes
