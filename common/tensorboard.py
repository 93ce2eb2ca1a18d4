"""--tensorboard DIR: the run's TensorBoard log, the same for every backend.

Written once, by the first rank, after training and evaluation from what common.loop already holds,
so that logging costs nothing inside the measured steps and shows the global loss (every rank's
share summed), not one rank's. The writer is TensorBoard's own framework-neutral one
(`tensorboard.summary.Writer`, numpy only), so no backend needs its framework's summary API.
Each run writes to DIR/<run id>, so that several runs (a sweep) sit side by side in one DIR.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from common.config import RunConfig
from common.errors import Unsupported
from common.spec import DEFAULTS, learning_rate


def check_available() -> None:
    """Before training, not after it: the package is an ordinary dependency, but a trimmed install may lack it."""
    if importlib.util.find_spec("tensorboard") is None:
        raise Unsupported("--tensorboard needs the tensorboard package: pip install tensorboard")


def write_run_log(cfg: RunConfig, outcome: dict) -> Path:
    """train/loss and train/learning_rate per logged step, perf/step_time_s and perf/samples_per_s per measured
    step (x: the measured step's index, warm-up and compiling steps left out as in the record), and every
    evaluation's metric and loss at its step."""
    from tensorboard.summary import Writer  # imported here: only a run that asks for a log needs the package

    log_dir = Path(cfg.tensorboard_dir) / cfg.run_id
    writer = Writer(str(log_dir))
    try:
        for step, loss in outcome["loss"]["curve"]:
            writer.add_scalar("train/loss", loss, step=step)
            writer.add_scalar("train/learning_rate", learning_rate(step - 1, cfg.total_steps, cfg.optim), step=step)
        for i, seconds in enumerate(outcome.get("step_times_s") or []):
            writer.add_scalar("perf/step_time_s", seconds, step=i)
            writer.add_scalar("perf/samples_per_s", cfg.global_batch / seconds, step=i)
        metric = DEFAULTS[cfg.workload].metric
        for point in outcome.get("eval_history") or []:
            writer.add_scalar(f"eval/{metric}", point["value"], step=point["step"])
            writer.add_scalar("eval/loss", point["loss"], step=point["step"])
    finally:
        writer.close()
    return log_dir
