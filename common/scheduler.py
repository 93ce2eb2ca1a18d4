"""A run inside a scheduler's allocation: under SLURM, the world of the job step bench.run was started in, so
that `srun --nodes 2 --ntasks-per-node 1 python -m bench.run ...` needs none of the node options.

The model is one task per node: each node's bench.run starts that node's per-device processes through its
backend's launcher (torchrun, msrun, TF's workers), as when started by hand with --nnodes and --node-rank.

What is taken from where (and the traps other training stacks met):
- nodes: the step's node list (SLURM_STEP_NODELIST) expanded by `scontrol show hostnames`; this node's rank is
  its place in that list (SLURMD_NODENAME). A missing scontrol is an error: falling back to this host alone
  would make every node a world of one, and their peers would wait for each other until the timeout.
- node 0's address: node 0's NodeAddr as slurmctld knows it (`scontrol show node`), resolved on this node.
  Never SLURM_LAUNCH_NODE_IPADDR: that is where srun ran (the login node or the batch host), not node 0.
- devices per node: the GPUs SLURM gave the task (SLURM_GPUS_ON_NODE), else --devices.
- the rendezvous port: the same on every node without their talking to each other, derived from the job and
  step ids (rendezvous_port); node 0 checks that it is free.
- the record's `scheduler` section: name, job id, step id, the step's nodes, the job's restart count.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from common.errors import BadInput
from common.results import SCHEDULER_FIELDS

SLURM = "slurm"
# Ports of the rendezvous: PORT_BASE + (job id mod 1000) x 10 + (step id mod 10). Below Linux's ephemeral
# range (32768-60999), so the kernel never lends one of them to a client socket; consecutive steps of a job
# get consecutive ports, so that a step started while the previous one's port lingers in TIME_WAIT still binds.
PORT_BASE = 20000
PORT_SPAN = 10000
SCONTROL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class World:
    """bench.run's node options as the allocation sets them."""
    nnodes: int
    node_rank: int
    master_addr: str | None
    master_port: int | None
    devices: int


@dataclass(frozen=True)
class SlurmStep:
    job_id: str
    step_id: str | None      # None in the batch script itself (the batch step)
    nodes: tuple[str, ...]   # the step's nodes, in SLURM's order: node 0 first
    node_name: str
    restart_count: int
    gpus_on_node: int | None

    @property
    def node_rank(self) -> int:
        return self.nodes.index(self.node_name)

    @property
    def where(self) -> str:
        step = f" step {self.step_id}" if self.step_id is not None else " (batch script)"
        return f"SLURM job {self.job_id}{step} on {len(self.nodes)} node(s) {','.join(self.nodes)}"

    def record(self) -> dict:
        """The record's `scheduler` section (its schema: common.results.SCHEDULER_FIELDS)."""
        return dict(zip(SCHEDULER_FIELDS, (SLURM, self.job_id, self.step_id, list(self.nodes), self.restart_count),
                        strict=True))

    def run_tag(self) -> str:
        """What names a run started without a run id alike on every node: the job, the step, the requeue."""
        restart = f"r{self.restart_count}" if self.restart_count else ""
        return f"slurm{self.job_id}.{self.step_id or 'batch'}{restart}"

    def rendezvous_port(self) -> int:
        step = int(self.step_id) if (self.step_id or "").isdigit() else 0  # a batch or interactive step: 0
        return PORT_BASE + (int(self.job_id) % 1000) * 10 + step % 10

    def world(self, nnodes: int | None = None, node_rank: int | None = None, master_addr: str | None = None,
              master_port: int | None = None, devices: int | None = None) -> World:
        """The node options from this step; a given one (not None) that contradicts it is bad input."""
        ours = len(self.nodes)
        if nnodes is not None and nnodes != ours:
            raise BadInput(f"--nnodes {nnodes} contradicts {self.where}: drop it")
        if node_rank is not None and node_rank != self.node_rank:
            raise BadInput(f"--node-rank {node_rank} contradicts {self.where}, where {self.node_name} is node "
                           f"{self.node_rank}: drop it")
        if self.gpus_on_node:
            if devices is not None and devices > self.gpus_on_node:
                raise BadInput(f"--devices {devices}: {self.where} gave this task {self.gpus_on_node} GPU(s)")
            devices = devices or self.gpus_on_node
        elif devices is None:
            raise BadInput(f"--devices is needed: {self.where} gave this task no GPUs to count")
        if ours == 1:
            return World(1, 0, master_addr, master_port, devices)
        address = node_address(self.nodes[0])
        if master_addr is not None and master_addr != address:
            raise BadInput(f"--master-addr {master_addr} contradicts {self.where}, whose node 0 {self.nodes[0]} "
                           f"is at {address}: drop it")
        port = master_port or self.rendezvous_port()
        if self.node_rank == 0 and not master_port:
            check_port_free(address, port, self)
        return World(ours, self.node_rank, address, port, devices)


def slurm_step(env: Mapping[str, str] = os.environ) -> SlurmStep | None:
    """The SLURM job step this process runs in; None outside SLURM (no SLURM_JOB_ID). Bad input, in one line
    saying why, where the environment names a job but bench.run cannot take a world from it."""
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not job_id:
        return None
    if not job_id.isdigit():
        raise BadInput(f"SLURM_JOB_ID={job_id!r} is not a job id")
    node_name = env.get("SLURMD_NODENAME", "").strip()
    if not node_name:  # salloc's shell, or a login shell with a job's variables: not on an allocated node
        raise BadInput(f"SLURM job {job_id}: this process runs outside the job's nodes (no SLURMD_NODENAME); "
                       "start bench.run with srun --ntasks-per-node 1")
    step_id = env.get("SLURM_STEP_ID", "").strip() or None
    if step_id is None:  # the batch script: one task on the first node, whatever the job's size
        count = _int(env, "SLURM_JOB_NUM_NODES", job_id) or 1
        if count > 1:
            raise BadInput(f"SLURM job {job_id} has {count} nodes but this is its batch script, on one of them: "
                           "start bench.run with srun --ntasks-per-node 1 to span them")
        node_list = env.get("SLURM_JOB_NODELIST", "").strip() or node_name
    else:
        node_list = env.get("SLURM_STEP_NODELIST", "").strip()
        if not node_list:
            raise BadInput(f"SLURM job {job_id} step {step_id} has no nodes (SLURM_STEP_NODELIST is empty): "
                           "not a usable allocation")
        tasks, count = _int(env, "SLURM_STEP_NUM_TASKS", job_id), _int(env, "SLURM_STEP_NUM_NODES", job_id)
        if tasks is not None and count is not None and tasks != count:
            raise BadInput(f"SLURM job {job_id} step {step_id} runs {tasks} tasks on {count} node(s): bench.run "
                           "takes one task per node (it starts that node's per-device processes itself); use "
                           "srun --ntasks-per-node 1")
    nodes = tuple(hostnames(node_list))
    if node_name not in nodes:
        raise BadInput(f"SLURM job {job_id}: this node {node_name} is not in the step's nodes {node_list}")
    return SlurmStep(job_id, step_id, nodes, node_name, _int(env, "SLURM_RESTART_COUNT", job_id) or 0,
                     _int(env, "SLURM_GPUS_ON_NODE", job_id))


def _int(env: Mapping[str, str], name: str, job_id: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise BadInput(f"SLURM job {job_id}: {name}={raw!r} is not a count")
    return int(raw)


def _scontrol(*args: str) -> str:
    if shutil.which("scontrol") is None:
        raise BadInput("inside a SLURM job but scontrol is not on PATH: the node list and node 0's address come "
                       "from it (never a guess such as localhost, which would leave every node a world of one)")
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BadInput(f"scontrol {' '.join(args)} did not answer within {SCONTROL_TIMEOUT_S:.0f} s") from None
    if done.returncode:
        why = (done.stderr or done.stdout).strip().splitlines()
        raise BadInput(f"scontrol {' '.join(args)} failed: {why[-1] if why else f'exit {done.returncode}'}")
    return done.stdout


def hostnames(node_list: str) -> list[str]:
    """SLURM's compressed node list (e.g. gpu[01-04,07]) as names, in SLURM's order."""
    names = _scontrol("show", "hostnames", node_list).split()
    if not names:
        raise BadInput(f"scontrol show hostnames {node_list} named no node")
    return names


def node_address(name: str) -> str:
    """Node `name`'s IPv4 address: its NodeAddr in slurmctld's table (what slurmd itself is reached at; the
    node name often resolves only in the cluster's own DNS), resolved here."""
    match = re.search(r"\bNodeAddr=(\S+)", _scontrol("show", "node", "--oneliner", name))
    target = match.group(1) if match else name
    try:
        infos = socket.getaddrinfo(target, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise BadInput(f"node 0 {name}: its address {target} does not resolve on this node ({exc.strerror})") \
            from None
    return infos[0][4][0]


def check_port_free(address: str, port: int, step: SlurmStep) -> None:
    """Node 0 hosts the rendezvous at the derived port: taken (another job's run on this node) is one line."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the rendezvous' own listener binds: a previous step's connections in TIME_WAIT do not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError as exc:
            raise BadInput(f"rendezvous port {port} (from {step.where}) is taken on {address} ({exc.strerror}): "
                           "give every node the same free --master-port") from None


def job_node_count(env: Mapping[str, str] = os.environ) -> int:
    """The nodes of the SLURM job this process (a batch script, e.g. bench.slurm's) runs in."""
    job_id = env.get("SLURM_JOB_ID", "").strip()
    count = _int(env, "SLURM_JOB_NUM_NODES", job_id) if job_id else None
    if not count:
        raise BadInput("not inside a SLURM job (no SLURM_JOB_ID and SLURM_JOB_NUM_NODES): submit the script "
                       "with sbatch, or start this from salloc")
    return count


def srun_command(nodes: int, env: Mapping[str, str] = os.environ) -> list[str]:
    """A job step over `nodes` nodes of this job, one task per node, the task given every CPU the job has on
    its node (a site's task/affinity or cgroup plugin would otherwise bind the node's processes to one CPU).
    A task that fails must not take its peers down (srun's --kill-on-bad-exit): node 0 then records the run
    as failed, within the collective timeout, instead of leaving no record."""
    cmd = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=0"]
    cpus = env.get("SLURM_CPUS_ON_NODE", "").strip()
    return cmd + ([f"--cpus-per-task={cpus}"] if cpus.isdigit() else [])
