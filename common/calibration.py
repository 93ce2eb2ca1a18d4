"""Holding each backend's throughput against its framework's own bare loop (bench.calibrate).

A bare loop (backends/<name>/bare.py) trains the same model from the same initial weights on the same
samples, batch, threads and devices in its framework's plainest idiom, and times its steps with
BareClock, the same window common.loop measures: from the end of the warm-up to the end of the last step.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from common.config import RunConfig
from common.data.batches import TrainBatches
from common.data.datasets import TRAIN_SPLIT, load_split
from common.errors import Unsupported

BARE_RESULTS = "bare"  # OUT/bare/<run id>.json: a bare loop's result (not a run record)
HARNESS_BOUND_BELOW = 0.95  # suite / bare throughput under this: the harness, not the framework, sets the pace


class BareClock:
    """Reads the clock before the first step and after each one (the caller synchronises the device)."""

    def __init__(self, warmup_steps: int):
        self.warmup = warmup_steps
        self.marks: list[float] = []

    def start(self) -> None:
        self.marks = [time.perf_counter()]

    def tick(self) -> None:
        self.marks.append(time.perf_counter())

    def result(self) -> dict:
        """This rank's measured window; bare_result combines the ranks."""
        measured = len(self.marks) - 1 - self.warmup
        return {"measured_steps": measured, "window_s": self.marks[-1] - self.marks[self.warmup]}


def bare_result(ranks: list[dict], global_batch: int, idiom: str) -> dict:
    """Throughput over every rank's samples and the longest window of any rank, as common.timing counts it."""
    steps = min(r["measured_steps"] for r in ranks)
    window = max(r["window_s"] for r in ranks)
    return {"samples_per_s": global_batch * steps / window if steps and window > 0 else None,
            "measured_steps": steps, "window_s": window, "idiom": idiom}


def check_bare(cfg: RunConfig) -> None:
    """What a bare loop does not do: accumulation and resumption are the suite's features, not the idiom's."""
    if cfg.grad_accum != 1:
        raise Unsupported("the bare loops take one micro-batch per step: calibrate with --grad-accum 1")
    if cfg.resume or cfg.checkpoint_every:
        raise Unsupported("the bare loops neither checkpoint nor resume")


def refuse_bare_options(cfg: RunConfig, backend: str) -> None:
    """A bare loop that trains float32 and uncompiled refuses to be held against a suite run that is not:
    the ratio would compare precisions or compilers, not loops."""
    if cfg.precision != "fp32" or cfg.compile:
        flag = f"--precision {cfg.precision}" if cfg.precision != "fp32" else "--compile"
        raise Unsupported(f"{flag}: {backend}'s bare loop trains float32 without compiling; calibrate it with "
                          "--precision fp32 and no --compile")


def rank_steps(cfg: RunConfig, rank: int, world: int, local_devices: int = 1) -> list[dict[str, np.ndarray]]:
    """The samples rank `rank` trains on in each step of the run (what TrainBatches deals the suite's run),
    drawn before any clock starts: the bare loops feed them the framework's way."""
    split = load_split(cfg.workload, TRAIN_SPLIT, cfg.data, Path(cfg.data_dir), cfg.spec, cfg.seed)
    train = TrainBatches(split, cfg.spec, cfg.seed, cfg.per_device_batch * local_devices, world, rank, 1,
                         local_devices)
    return [train.get(step).micro[0] for step in range(cfg.total_steps)]


def calibration_entry(suite_sps: list[float], bare_sps: list[float], idiom: str) -> dict:
    """The record's `calibration`: medians of the alternated repeats, their ratio and its spread (max - min
    of the per-repeat ratios, suite run i over bare run i, relative to the ratio)."""
    suite, bare = float(np.median(suite_sps)), float(np.median(bare_sps))
    pairs = [s / b for s, b in zip(suite_sps, bare_sps) if b]
    ratio = suite / bare if bare else None
    return {"bare_samples_per_s": bare, "ratio": ratio, "idiom": idiom, "repeats": len(pairs),
            "spread": (max(pairs) - min(pairs)) / ratio if pairs and ratio else None,
            "paired_ratios": pairs, "suite_samples_per_s": list(suite_sps), "bare_runs_samples_per_s": list(bare_sps),
            "harness_bound": ratio is not None and ratio < HARNESS_BOUND_BELOW}
