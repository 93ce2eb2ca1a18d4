"""The one start-up path of every backend's worker process: `<worker> CONFIG.json RESULT.json`.

A backend's worker module supplies only what is its own, as a `Worker`: how this process joins its
group (`start`), the trainer and its feed (`trainer`), and how it leaves (`finish`, `stop`). This
module does the rest, the same for every backend: the config, which samples the process is dealt,
the initial weights, common.loop, the result file, and a refusal found only by trying (exit
EXIT_UNSUPPORTED with the reason in UNSUPPORTED_FILE, which common.launch turns into Unsupported).
"""
from __future__ import annotations

import gc
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.config import RunConfig
from common.data.batches import TrainBatches
from common.data.datasets import TRAIN_SPLIT, SplitData, load_split
from common.errors import EXIT_OK, EXIT_UNSUPPORTED, Unsupported
from common.initial_weights import run_initial_weights
from common.launch import UNSUPPORTED_FILE
from common.loop import Trainer, run_loop
from common.results import write_json_atomic


@dataclass(frozen=True)
class Process:
    """Where this process stands in its run, as the backend's start-up found it."""
    rank: int                 # among the run's processes
    processes: int
    # Writes the run's outcome: every rank holds the aggregate, each node's first process keeps it.
    keeps_result: bool
    replica: int              # the data-parallel replica whose samples this process is dealt ...
    replicas: int             # ... among this many
    samples: int              # samples per micro-batch this process is dealt, all its devices together
    local_devices: int = 1    # devices one process feeds (MirroredStrategy, DataParallel): piece d to device d
    device: object = None     # the framework's device, for the backend's own use
    # Devices this process drives where they are more than it feeds pieces to: one process over a tensor-parallel
    # mesh (keras_jax) takes one piece for all its devices. Its memory figures hold them all.
    drives: int | None = None

    @property
    def devices_driven(self) -> int:
        return self.drives or self.local_devices


def data_parallel_process(cfg: RunConfig, rank: int, processes: int, keeps_result: bool, device: object = None,
                          local_devices: int = 1, drives: int | None = None) -> Process:
    """A process that is one data-parallel replica of `processes`, feeding `local_devices` devices (and driving
    `drives` in all, where more)."""
    return Process(rank, processes, keeps_result=keeps_result, replica=rank, replicas=processes,
                   samples=cfg.per_device_batch * local_devices, local_devices=local_devices, device=device,
                   drives=drives)


@dataclass(frozen=True)
class Data:
    train: TrainBatches
    eval: SplitData


def load_data(cfg: RunConfig, process: Process) -> Data:
    """This process's training batches (common's order, its replica's slice) and the evaluation split."""
    data_dir = Path(cfg.data_dir)
    split = load_split(cfg.workload, TRAIN_SPLIT, cfg.data, data_dir, cfg.spec, cfg.seed)
    # The micro-batches of a step are what the global batch leaves: a process dealt a whole pipeline
    # batch (MindSpore's full_batch) is dealt fewer, larger ones than a process that feeds its stages itself.
    micro_batches, rest = divmod(cfg.global_batch, process.samples * process.replicas)
    if rest:
        raise ValueError(f"global batch {cfg.global_batch} is not {process.replicas} replicas x "
                         f"{process.samples} samples x micro-batches")
    train = TrainBatches(split, cfg.spec, cfg.seed, per_device_batch=process.samples, world=process.replicas,
                         rank=process.replica, micro_batches=micro_batches, local_devices=process.local_devices)
    return Data(train, load_split(cfg.workload, cfg.eval_split, cfg.data, data_dir, cfg.spec, cfg.seed))


class Worker:
    """What a backend's worker process does in its own framework; the rest is `main`'s."""
    workdir: Path  # the run's folder, beside the config (set by main): for a worker's own scratch files

    def config(self, cfg: RunConfig) -> RunConfig:
        """The config this process runs (e.g. set to resume when its launcher restarted it)."""
        return cfg

    def start(self, cfg: RunConfig) -> Process:
        """Join the run's group (process group, strategy, device, threads); raise Unsupported to refuse."""
        raise NotImplementedError

    def trainer(self, cfg: RunConfig, process: Process, data: Data,
                weights: dict[str, np.ndarray]) -> tuple[Trainer, Iterable | TrainBatches]:
        """(the trainer, what feeds it: `data.train` or a framework's pipeline over it, closed after the loop
        when it has close()). May raise Unsupported after trying (e.g. a probe of the strategy)."""
        raise NotImplementedError

    def metrics(self, process: Process) -> dict:
        """What the strategy says of itself, merged into the kept outcome's backend_metrics."""
        return {}

    def finish(self, process: Process) -> None:
        """After the result is written, on the way out of a run that went well (e.g. ranks finish together)."""

    def stop(self, process: Process) -> None:
        """Always, last (e.g. leave the process group)."""


def main(worker: Worker, argv: list[str] | None = None) -> int:
    config_path, result_path = (Path(a) for a in (argv or sys.argv)[1:3])
    worker.workdir = config_path.parent
    cfg = worker.config(RunConfig.load(config_path))
    process = None
    feeds: list = []
    try:
        process = worker.start(cfg)
        outcome = _train(worker, cfg, process, feeds)
        if process.keeps_result:
            outcome["backend_metrics"] = {**(outcome["backend_metrics"] or {}), **worker.metrics(process)}
            write_json_atomic(result_path, outcome)
        # What the training held is freed here, while the interpreter is whole: DDP's reducer and the
        # Python futures of its hooks, freed at interpreter shutdown instead, abort the process.
        gc.collect()
        worker.finish(process)
    except Unsupported as exc:
        (config_path.parent / UNSUPPORTED_FILE).write_text(str(exc))
        return EXIT_UNSUPPORTED
    finally:
        # The feed is closed after the result is out: deleting TensorFlow's multi-worker distributed iterator
        # has held both ranks for 30-60 s under load (py-spy: ReplicaBatches.close), which here holds up only
        # the exit, and the launcher stops a rank still tearing down 0.5 s after the result is complete.
        for feed in feeds:
            close = getattr(feed, "close", None)
            if close is not None:
                close()
        if process is not None:
            worker.stop(process)
    return EXIT_OK


def _train(worker: Worker, cfg: RunConfig, process: Process, feeds: list) -> dict:
    """The run on this process; its trainer and model live only inside this call (see main). What feeds the
    trainer is appended to `feeds`, for main to close."""
    data = load_data(cfg, process)
    trainer, feed = worker.trainer(cfg, process, data, run_initial_weights(cfg))
    feeds.append(feed)
    return run_loop(trainer, cfg, feed, data.eval, devices_driven=process.devices_driven)
