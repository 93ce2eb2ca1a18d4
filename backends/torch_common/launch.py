"""How the torch backends place and start their workers: the device plan, and torchrun (torch_ddp, torch_3d)."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from common.config import RunConfig
from common.devices import DevicePlan, accelerator_driver_present, cpu_plan, cuda_plan, shared_cuda_plan
from common.errors import Unsupported
from common.launch import LOOPBACK, child_env, free_port, log_tail, run_supervised
from common.nodes import address_towards, interface_of

# Where the parent asks backends.torch_common.torchrun to write its failure report (which rank, which exit).
REPORT_ENV = "PARBENCH_LAUNCH_REPORT"


def cuda_device_names() -> list[str]:
    """The CUDA devices this process sees, by name (none on a CPU build or without a driver)."""
    if not accelerator_driver_present():
        return []
    import torch  # seconds: only where a driver could show a GPU

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


# A port picked free can still be taken by a process outside parbench before torchrun binds it:
# torchrun then fails at once (is_host is explicit) and the run is started again on another port.
PORT_ATTEMPTS = 3
RANK_OUTPUT_LINES = 4


@dataclass
class Torchrun:
    """One process per device of this node under torchrun (common.launch.Launcher). Each rank's output is
    tee'd to its own file under `workdir/ranks` as well as to torchrun.log; how the run ended comes from
    the report backends.torch_common.torchrun writes from torchrun's own exception."""
    cfg: RunConfig
    threads_per_device: int
    workdir: Path
    log: Path = field(init=False)
    report_path: Path = field(init=False)

    def __post_init__(self):
        self.log, self.report_path = self.workdir / "torchrun.log", self.workdir / "torchrun-report.json"

    def start(self, worker: list[str]) -> int:
        for _ in range(PORT_ATTEMPTS):
            self.report_path.unlink(missing_ok=True)
            rdzv_args, rdzv_env = rendezvous(self.cfg)
            cmd = [sys.executable, "-m", "backends.torch_common.torchrun", *rdzv_args,
                   f"--max-restarts={self.cfg.max_restarts}", f"--log-dir={self.workdir / 'ranks'}", "--tee=3",
                   *worker]
            env = {"OMP_NUM_THREADS": str(max(1, self.threads_per_device)), **rdzv_env,
                   "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", REPORT_ENV: str(self.report_path)}
            code = run_supervised(cmd, child_env(env), self.log, self.cfg.timeout_s, result=Path(worker[-1]))
            # A port the user gave, or node 0's, is not ours to change.
            if code == 0 or self.cfg.multi_node or self.cfg.master_port or self.report().get("kind") != "port_taken":
                return code
        return code

    def report(self) -> dict:
        try:
            return json.loads(self.report_path.read_text())
        except (OSError, ValueError):
            return {}

    def failure(self, code: int) -> str:
        report = self.report()
        kind = report.get("kind")
        if kind == "workers_failed":
            return f"torchrun exited with code {code}, " + self._first_failure(report)
        if kind == "port_taken":
            return f"torchrun exited with code {code}, the rendezvous port was taken by another process (EADDRINUSE)"
        if kind == "rendezvous_timeout":
            return (f"torchrun exited with code {code}, rendezvous timed out: {self.cfg.nnodes} node(s) did not all "
                    f"join within {self.cfg.collective_timeout_s:g} s (--collective-timeout)")
        said = f"torchrun: {report['message']}" if kind else log_tail(self.log)
        return f"torchrun exited with code {code}: {said}"

    def _first_failure(self, report: dict) -> str:
        """'rank R exited with code C (signal S) first: what it said', from the report and the rank's own output."""
        first = next(f for f in report["failures"] if f["rank"] == report["first_rank"])
        signal_note = f" (signal {-first['exitcode']})" if first["exitcode"] < 0 else ""
        # A Python exception is in the error file (errors.record); a signal or a C++ abort only in the output.
        said = first["message"] if first["exitcode"] > 0 and "errors.html" not in first["message"] else ""
        output = rank_output(self.workdir / "ranks", first["local_rank"])
        words = " | ".join(part for part in (said, output and f"last output: {output}") if part)
        return (f"rank {first['rank']} exited with code {first['exitcode']}{signal_note} first"
                + (f": {words}" if words else " (no error file, no output)"))


def rank_output(log_dir: Path, local_rank: int, lines: int = RANK_OUTPUT_LINES) -> str:
    """The last lines a local rank wrote to stderr in its newest attempt (torchrun --log-dir --tee):
    where a rank says why it failed (a traceback, "terminate called ...") when its exit is a signal."""
    files = sorted(log_dir.glob(f"*/attempt_*/{local_rank}/stderr.log"), key=lambda p: p.stat().st_mtime)
    if not files:
        return ""
    text = [ln for ln in files[-1].read_text(errors="replace").splitlines() if ln.strip()]
    return " | ".join(text[-lines:])[-1500:]
