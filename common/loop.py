"""The training loop every backend runs: warm-up exclusion, timing, evaluation, early stopping,
checkpoint cadence and cross-rank aggregation live here once; a backend supplies a `Trainer`
that knows how to do one step in its framework."""
from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import numpy as np

from common.achievable import achievable_section, probe_rank
from common.breakdown import grad_comm_summary, kinds_gbps_from_probe, link_gbps_from_probe, summarize_breakdown
from common.config import RunConfig
from common.data.batches import Batch, StepBatch, TrainBatches, eval_batches, eval_samples
from common.data.datasets import SplitData
from common.memory import MemoryWindow, memory_section
from common.nodes import hosts_table, rank_host
from common.profile import profile_steps
from common.sections import Breakdown, GradComm, merged
from common.spec import DEFAULTS, learning_rate
from common.tensorboard import write_run_log
from common.timing import aggregate_ranks

# Fault injection for tests of resume and failure handling: a rank exits hard right after this
# many optimizer steps (and the checkpoint due at that step) have completed; every rank, or only
# the one named in PARBENCH_FAULT_RANK.
FAULT_AFTER_STEP_ENV = "PARBENCH_FAULT_AFTER_STEP"
FAULT_RANK_ENV = "PARBENCH_FAULT_RANK"
# With this set to a path, a rank's fault fires at most once: the rank's first attempt claims
# PATH.rank<R>, and a restarted worker (torchrun --max-restarts) that finds it trains on.
FAULT_MARKER_ENV = "PARBENCH_FAULT_MARKER"
FAULT_EXIT_CODE = 17
MAX_CURVE_POINTS = 1000
PROGRESS_EVERY_S = 30.0  # rank 0 logs a progress line at most this often


class Trainer(Protocol):
    rank: int
    world: int

    def train_step(self, batch: StepBatch, lr: float) -> float:
        """One optimizer step; returns this rank's share of the global mean loss (shares sum to it)."""

    def sync(self) -> None:
        """Wait for the device to finish queued work, so that the clock measures it."""

    def evaluate(self, batches: Iterable[Batch]) -> tuple[float, float, float]:
        """This rank's (loss sum, correct, count) over its evaluation shard."""

    def all_reduce_sum(self, values: list[float]) -> list[float]: ...

    def all_gather(self, obj: dict) -> list[dict]: ...

    def save_checkpoint(self, directory: Path, step: int) -> None: ...

    def load_checkpoint(self, directory: Path) -> int | None:
        """The step to continue from, or None when the directory holds no checkpoint."""

    def peak_memory_bytes(self) -> int:
        """The process's peak: resident set on a CPU, the allocator's peak on a GPU (the record's
        peak_memory_bytes)."""

    def backend_metrics(self) -> dict:
        """What is specific to the strategy (phase times, compile time...), for the record."""

    # Optional: compiled_last_step() -> bool, whether the step just run compiled graphs (torch.compile,
    #   tf.function): such a step is compile time, and leaves the measured window (aggregate_ranks).
    # Optional, for --breakdown-steps (a trainer without them gets no breakdown):
    # probe_step(batch, lr) -> {"forward_backward_s", "grad_comm_s", "optimizer_s", "grad_comm_bytes"}, one
    #   step with the device synchronised between its phases; probe_source: what timed them;
    # link_probe(nbytes) -> (ranks, bytes sent, [seconds of each]): a plain all-reduce of about nbytes on the
#   collective the gradients use, for the link's bandwidth.
    # Optional, for the record's `memory` (common.memory; a trainer without it is measured through /proc):
    # allocator_memory(reset) -> (bytes held now, peak since the last reset) from the framework's allocator over
    #   this process's devices, the peak reset after reading when reset is True; None where the framework keeps
    #   no counters for them (CPUs); allocator_source: the counters it reads, in words.
    # Optional, for the record's `achievable_peak` (common.achievable; a trainer without it gets null):
    # time_matmul(n, repeats) -> (math mode, [seconds]): `repeats` timed n x n x n products at the run's precision on
    #   one of this rank's devices (each of them at once where it drives several), after one untimed, the device
    #   synchronised around each, on the threads one device has.
    # Optional, for --profile (common.profile; a trainer without it gets no attribution):
    # profiler(directory) -> common.profile.StepProfiler, the framework's own profiler writing its trace there.


def _evaluate(trainer: Trainer, cfg: RunConfig, data: SplitData) -> dict:
    # Ranks that split one model (tensor, pipeline) evaluate the same shard: the data-parallel
    # replica's; a trainer without a layout is one replica per rank.
    shard = getattr(trainer, "data_rank", trainer.rank), getattr(trainer, "data_world", trainer.world)
    batches = eval_batches(data, cfg.spec, cfg.seed, *shard, DEFAULTS[cfg.workload].eval_batch, cfg.eval_samples)
    loss_sum, correct, count = trainer.all_reduce_sum(list(trainer.evaluate(batches)))
    # count: what the metric is over (the MLM: masked tokens, the LM: every label); split_size: the split's
    # samples, samples_evaluated those --eval-samples took (all by default).
    metric = DEFAULTS[cfg.workload].metric
    value = math.exp(loss_sum / count) if metric == "perplexity" else correct / count
    return {"metric": metric, "split": data.split, "value": value, "loss": loss_sum / count,
            "count": int(round(count)), "split_size": len(data),
            "samples_evaluated": eval_samples(data, cfg.eval_samples)}


def _downsample(curve: list[list[float]]) -> list[list[float]]:
    stride = max(1, math.ceil(len(curve) / MAX_CURVE_POINTS))
    return curve[::stride] if curve[-1:] == curve[::stride][-1:] else curve[::stride] + curve[-1:]


def _fault_step(rank: int) -> int:
    """The step after which this rank is to exit hard, or 0 for none."""
    fault_at = int(os.environ.get(FAULT_AFTER_STEP_ENV, "0"))
    if os.environ.get(FAULT_RANK_ENV, str(rank)) != str(rank):
        return 0
    marker = os.environ.get(FAULT_MARKER_ENV)
    if fault_at and marker:
        try:
            Path(f"{marker}.rank{rank}").touch(exist_ok=False)
        except FileExistsError:
            return 0
    return fault_at


class SampleDigests:
    """SHA-256 per epoch and per local device of the sample ids trained on, in order."""

    def __init__(self):
        self.hashes: dict[int, list] = {}

    def add(self, batch: StepBatch) -> None:
        per_device = self.hashes.setdefault(batch.epoch, [hashlib.sha256() for _ in batch.device_ids])
        for h, ids in zip(per_device, batch.device_ids):
            h.update(np.asarray(ids, np.int64).tobytes())

    def hex(self) -> dict[str, list[str]]:
        return {str(epoch): [h.hexdigest() for h in hs] for epoch, hs in self.hashes.items()}


def _merge_digests(ranks: list[dict]) -> dict[str, list[str]]:
    """Epoch -> one digest per device, ranks in order: device index = rank x local devices + local index."""
    epochs = sorted({e for r in ranks for e in r["sample_digests"]}, key=int)
    return {e: [d for r in ranks for d in r["sample_digests"].get(e, [])] for e in epochs}


def _probe_steps(trainer: Trainer, cfg: RunConfig, train: TrainBatches, first: int, clock) -> list[dict]:
    """cfg.breakdown_steps steps after everything measured (and evaluated), phases timed apart; the first
    probe step, which may compile the probe's own graphs, is not kept."""
    probes = []
    for i in range(cfg.breakdown_steps + 1):
        step = first + i
        t0 = clock()
        batch = train.get(step)
        t1 = clock()
        phases = trainer.probe_step(batch, learning_rate(min(step, cfg.total_steps - 1), cfg.total_steps, cfg.optim))
        trainer.sync()
        if i:
            # instrument_s: time the probe spent only to measure (a phase run twice), not part of a step.
            probes.append({**phases, "data_s": t1 - t0, "step_s": clock() - t0 - phases.get("instrument_s", 0.0)})
    return probes


def _breakdown(trainer: Trainer, probes: list[dict], measured_step_s: float | None) -> dict:
    """backend_metrics.breakdown and .grad_comm from rank 0's probe steps."""
    breakdown = Breakdown(**summarize_breakdown(probes, measured_step_s, trainer.probe_source))
    nbytes = float(np.median([p.get("grad_comm_bytes") or 0 for p in probes]))
    ranks, probe_bytes, times = trainer.link_probe(nbytes) if nbytes else (1, 0, [])
    # Every rank calls the probes (they are collectives); a trainer without kinds_probe costs others as a ring.
    kinds = trainer.kinds_probe(nbytes) if nbytes and hasattr(trainer, "kinds_probe") else (1, 0, {})
    comm = GradComm(**grad_comm_summary(nbytes, breakdown.grad_comm_s, ranks,
                                        link_gbps_from_probe(probe_bytes, times, ranks), trainer.probe_source),
                    link_GBps_by_kind=kinds_gbps_from_probe(kinds[1], kinds[2], kinds[0]))
    return merged(breakdown, comm)


def run_loop(trainer: Trainer, cfg: RunConfig, train: TrainBatches, eval_data: SplitData,
             clock=time.perf_counter, devices_driven: int = 1) -> dict:
    """Train, evaluate and gather; returns the aggregated outcome on every rank. devices_driven: the devices
    one process drives (MirroredStrategy, DataParallel, keras_jax's one process), whose memory its figures hold
    together."""
    ckpt_dir = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    start = 0
    if cfg.resume and ckpt_dir is not None:
        start = trainer.load_checkpoint(ckpt_dir) or 0
    fault_at = _fault_step(trainer.rank)

    step_times, data_wait, losses, history = [], [], [], []
    compiled_steps: list[int] = []  # positions in step_times of measured steps that compiled
    compiled_last_step = getattr(trainer, "compiled_last_step", None)
    digests = SampleDigests()
    # Early stopping compares scores that rise as the metric improves (perplexity falls).
    sign = 1.0 if DEFAULTS[cfg.workload].higher_is_better else -1.0
    best, evals_since_best, stopped_early = -math.inf, 0, False
    # From here to the last step: the training's own memory (common.memory), evaluations left out.
    memory = MemoryWindow(getattr(trainer, "allocator_memory", None), trainer.peak_memory_bytes)
    memory.open()
    began = last_report = clock()
    done = start
    for step in range(start, cfg.total_steps):
        t0 = clock()
        batch = train.get(step)
        t1 = clock()
        losses.append(trainer.train_step(batch, learning_rate(step, cfg.total_steps, cfg.optim)))
        trainer.sync()
        t2 = clock()
        digests.add(batch)
        if step - start >= cfg.warmup_steps:
            if compiled_last_step is not None and compiled_last_step():
                compiled_steps.append(len(step_times))
            step_times.append(t2 - t0)
            data_wait.append(t1 - t0)
        done = step + 1
        if trainer.rank == 0 and (t2 - last_report >= PROGRESS_EVERY_S or done == cfg.total_steps):
            last_report = t2
            # A rank's share times the world size is that rank's own mean loss.
            print(f"step {done}/{cfg.total_steps} rank-0 loss {losses[-1] * trainer.world:.4f} "
                  f"({t2 - began:.0f} s)", flush=True)
        if ckpt_dir and cfg.checkpoint_every and done % cfg.checkpoint_every == 0:
            trainer.save_checkpoint(ckpt_dir, done)
        if done == fault_at:
            os._exit(FAULT_EXIT_CODE)
        if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.total_steps:
            memory.pause()
            result = _evaluate(trainer, cfg, eval_data)
            memory.resume()
            history.append({"step": done, "elapsed_s": clock() - began, "value": result["value"],
                            "loss": result["loss"]})
            # Every rank sees the same all-reduced value, so every rank stops at the same step.
            if sign * result["value"] > best:
                best, evals_since_best = sign * result["value"], 0
            else:
                evals_since_best += 1
            if cfg.patience and evals_since_best >= cfg.patience:
                stopped_early = True
                break
    training_memory = memory.close()
    if ckpt_dir and cfg.checkpoint_every and done % cfg.checkpoint_every:
        trainer.save_checkpoint(ckpt_dir, done)  # the final state, for resume and for comparisons

    final = None
    if not cfg.skip_eval:
        final = _evaluate(trainer, cfg, eval_data)
        history.append({"step": done, "elapsed_s": clock() - began, "value": final["value"],
                        "loss": final["loss"]})
    # After the measured window and the evaluation: the probe steps change neither.
    probing = cfg.breakdown_steps and hasattr(trainer, "probe_step")
    probes = _probe_steps(trainer, cfg, train, done, clock) if probing else []
    process_peak = memory.process_peak()  # read before the matmul probe, whose operands are no training's
    trainer.all_reduce_sum([0.0])  # a barrier: every rank probes its device while the others probe theirs
    achievable = probe_rank(trainer, cfg.device_kind)
    mine = {"step_times": step_times, "data_wait": data_wait, "compiled_steps": compiled_steps,
            "losses": losses, "peak_memory_bytes": process_peak, "sample_digests": digests.hex(),
            "memory": {"process_peak": process_peak, "training": training_memory, "at_start": memory.at_start,
                       "method": memory.description(getattr(trainer, "allocator_source", "its counters"))},
            "backend_metrics": trainer.backend_metrics(), "achievable": achievable,
            "host": rank_host(cfg.nnodes, cfg.node_rank, cfg.master_addr)}
    if cfg.profile_steps and hasattr(trainer, "profiler"):
        # Last of all, after the backend's metrics were read: the profiled steps change no figure but their own.
        first = done + (cfg.breakdown_steps + 1 if probing else 0)
        mine["backend_metrics"] = {**(mine["backend_metrics"] or {}), **profile_steps(
            trainer, cfg, train, first, clock, float(np.median(step_times)) if step_times else None,
            mine["backend_metrics"])}
    # Every rank gets the aggregate: with several hosts, each node's first process writes it locally.
    ranks = trainer.all_gather(mine)

    global_loss = np.sum([r["losses"] for r in ranks], axis=0).tolist()
    curve = [[start + i + 1, loss] for i, loss in enumerate(global_loss)]
    timing = aggregate_ranks(ranks)
    # Every rank takes part in the link probe's collectives.
    probed = _breakdown(trainer, probes, (timing["step_time_s"] or {}).get("p50")) if probes else {}
    outcome = {
        **probed,
        **timing,
        "start_step": start,
        "steps_done": done,
        "total_steps": cfg.total_steps,
        "stopped_early": stopped_early,
        "loss": {"first": global_loss[0] if global_loss else None,
                 "last": global_loss[-1] if global_loss else None,
                 "curve": _downsample(curve) if curve else []},
        "eval": final,
        "eval_history": history,
        "sample_digests": _merge_digests(ranks),
        "peak_memory_bytes": max(r["peak_memory_bytes"] for r in ranks),
        "peak_memory_per_rank": [r["peak_memory_bytes"] for r in ranks],
        "memory": memory_section([r["memory"] for r in ranks], processes_share=devices_driven > 1),
        "achievable_peak": achievable_section([r["achievable"] for r in ranks], cfg.device_kind,
                                              cfg.threads_per_device),
        "backend_metrics": ranks[0]["backend_metrics"] or None,
        "train_wall_s": clock() - began,
        "hosts": hosts_table([r["host"] for r in ranks]),
    }
    if cfg.tensorboard_dir and trainer.rank == 0:
        write_run_log(cfg, outcome)
    return outcome
