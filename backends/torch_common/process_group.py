"""A torch worker's place in a torchrun job: its rank, device and process group (torch_ddp, torch_3d)."""
from __future__ import annotations

import dataclasses
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from backends.torch_common.launch import process_group_backend
from common import worker
from common.config import RunConfig
from common.devices import process_cores


@dataclasses.dataclass(frozen=True)
class Rank:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    restarts: int  # torchrun --max-restarts: how many times the worker group was started again


def restart_count() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def attempt_store(rank: int, world: int, attempt: int, timeout: timedelta) -> dist.Store:
    """torchrun's store, under a prefix of its own per restart: a restarted group otherwise can read the
    gloo addresses its dead predecessors left there and fail with "Connection refused" (seen in CI)."""
    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent_hosts_it, timeout=timeout)
    return dist.PrefixStore(f"parbench/attempt{attempt}", store)


def resumed(cfg: RunConfig) -> RunConfig:
    """torchrun --max-restarts: a restarted worker group carries on from the newest valid checkpoint."""
    return dataclasses.replace(cfg, resume=True) if restart_count() and cfg.checkpoint_dir else cfg


def pin_to_cores(local_rank: int, threads_per_device: int) -> None:
    """Each rank of a node on its own threads-per-device cores, as keras_jax's processes and Intel's torch CPU
    launcher place them, where the node's ranks fit its cores side by side. Unpinned, the kernel moves ranks
    between cores and now and then stacks two on one: dp2 of the tiny MLM on the 2-core VM took a median 374 ms
    a step unpinned and 362 ms pinned (5 and 4 runs, docs/prediction.md). A lone rank is left where it is: two
    1-device runs side by side would otherwise both take the first core."""
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    allowed = sorted(os.sched_getaffinity(0))
    if ranks > 1 and ranks * threads_per_device <= len(allowed):
        os.sched_setaffinity(0, process_cores(allowed, local_rank * threads_per_device, threads_per_device))


def join_process_group(cfg: RunConfig) -> Rank:
    """Join torchrun's group on this rank's device and threads. Every collective inherits
    --collective-timeout: a dead peer ends the run, it does not hang it."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = cfg.device_kind == "cuda"
    # Virtual GPUs: local rank r on GPU r mod the GPUs present (torch_device_plan's round robin).
    device = torch.device("cuda", local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        pin_to_cores(local_rank, cfg.threads_per_device)
        torch.set_num_threads(cfg.threads_per_device)
    timeout = timedelta(seconds=cfg.collective_timeout_s)
    group_backend = process_group_backend(cfg.device_kind, cfg.virtual)
    restarts = restart_count()
    dist.init_process_group(group_backend, timeout=timeout, device_id=device if group_backend == "nccl" else None,
                            store=attempt_store(rank, world, restarts, timeout), rank=rank, world_size=world)
    return Rank(rank, world, local_rank, device, restarts)


def finish_together() -> None:
    """Gloo aborts a process whose peer tears down while it still holds work objects ("terminate called
    without an active exception"): the ranks finish together."""
    dist.barrier()


def leave_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class RankWorker(worker.Worker):
    """A worker that is one rank of a torchrun job (torch_ddp, torch_3d): the ranks finish together, then
    leave the process group, whatever happened."""

    def metrics(self, process: worker.Process) -> dict:
        return {"cores": sorted(os.sched_getaffinity(0))}

    def finish(self, process: worker.Process) -> None:
        finish_together()

    def stop(self, process: worker.Process) -> None:
        leave_process_group()
