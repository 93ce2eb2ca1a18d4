"""PyTorch DistributedDataParallel: one process per device, launched by a child torchrun."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch

from backends.torch_common.backend import TorchBackend
from common.config import RunConfig
from common.devices import DevicePlan, cpu_plan, cuda_plan
from common.errors import Unsupported
from common.launch import LOOPBACK, RunFailed, child_env, free_port, log_tail, run_supervised
from common.nodes import address_towards, interface_of


def torch_device_plan(count: int, kind: str, threads_per_device: int) -> DevicePlan:
    """CUDA when asked for or when `auto` finds enough GPUs, else virtual CPU devices."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "cuda" or (kind == "auto" and gpus):
        if count > gpus:
            raise Unsupported(f"{count} CUDA devices requested, {gpus} present")
        names = [torch.cuda.get_device_name(i) for i in range(gpus)]
        return cuda_plan(count, gpus, names)
    return cpu_plan(count, threads_per_device)


def first_failure(log: Path) -> str:
    """', rank R exited with code C' from torchrun's root-cause report, when it has one."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    cause = text.rpartition("Root Cause")[2]
    rank, code = re.search(r"rank\s*:\s*(\d+)", cause), re.search(r"exitcode\s*:\s*(-?\d+)", cause)
    if not (rank and code):
        return ""
    signal_note = f" (signal {-int(code[1])})" if int(code[1]) < 0 else ""
    return f", rank {rank[1]} exited with code {code[1]}{signal_note} first"


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

    def plan_devices(self, count: int, kind: str, threads_per_device: int) -> DevicePlan:
        return torch_device_plan(count, kind, threads_per_device)

    def spans_hosts(self, cfg: RunConfig) -> bool:
        return True

    def check(self, cfg: RunConfig, plan: DevicePlan) -> None:
        if cfg.sync_bn and plan.kind == "cpu" and cfg.devices > 1:
            raise Unsupported("--sync-bn: torch's SyncBatchNorm runs on GPU devices only")

    def run(self, cfg: RunConfig, plan: DevicePlan, workdir: Path) -> dict:
        config_path, result_path = workdir / "config.json", workdir / "result.json"
        cfg.save(config_path)
        log = workdir / "torchrun.log"
        for _ in range(PORT_ATTEMPTS):
            offset = log.stat().st_size if log.exists() else 0
            rdzv_args, rdzv_env = rendezvous(cfg)
            # torchrun, except that the stores it hosts on loopback listen on loopback only
            cmd = [sys.executable, "-m", "backends.torch_ddp.torchrun", *rdzv_args,
                   f"--max-restarts={cfg.max_restarts}",
                   "-m", "backends.torch_ddp.worker", str(config_path), str(result_path)]
            env = {"OMP_NUM_THREADS": str(max(1, plan.threads_per_device)), **rdzv_env,
                   "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
            rc = run_supervised(cmd, child_env(env), log, cfg.timeout_s)
            # A port the user gave, or node 0's, is not ours to change.
            if rc == 0 or cfg.multi_node or cfg.master_port or not port_taken(log, offset):
                break
        if rc != 0 or not result_path.is_file():
            raise RunFailed(f"torchrun exited with code {rc}{rendezvous_failure(log, cfg)}{first_failure(log)}: "
                            f"{log_tail(log)}")
        return json.loads(result_path.read_text())

    def notes(self, cfg: RunConfig, plan: DevicePlan) -> list[str]:
        notes = []
        if cfg.workload == "cnn" and cfg.devices > 1 and not cfg.sync_bn:
            notes.append("BatchNorm statistics are per rank (no SyncBatchNorm), as DDP does by default")
        if plan.kind == "cpu":
            link = f"TCP between {cfg.nnodes} hosts" if cfg.multi_node else "loopback"
            notes.append(f"gloo all-reduce over {link} between CPU processes")
        return notes
