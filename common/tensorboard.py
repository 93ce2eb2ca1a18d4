"""--tensorboard DIR: the run's TensorBoard log, the same for every backend.

Written once, by the first rank, after training and evaluation from what common.loop already holds,
so that logging costs nothing inside the measured steps and shows the global loss (every rank's
share summed), not one rank's. The events are TensorBoard's own protocol buffers (a scalar as a tensor with the
scalars plugin's metadata, as TensorBoard's UI and `tensorboard.summary.Writer` write it), framed by TensorBoard's
RecordWriter into a plain Python file. Not through `tensorboard.summary.Writer` itself: its event file opens the
file with `tf.io.gfile`, which imports TensorFlow wherever it is installed (measured: 9.2 s and 609 MB on a
torch or MindSpore rank 0 that never needed it). Each run writes to DIR/<run id>, so that several runs (a sweep)
sit side by side in one DIR.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import time
from pathlib import Path

import numpy as np

from common.config import RunConfig
from common.errors import Unsupported
from common.spec import DEFAULTS, learning_rate


def check_available() -> None:
    """Before training, not after it: the package is an ordinary dependency, but a trimmed install may lack it."""
    if importlib.util.find_spec("tensorboard") is None:
        raise Unsupported("--tensorboard needs the tensorboard package: pip install tensorboard")


class EventFile:
    """One TensorBoard event file in a directory, written with TensorBoard's record framing and no TensorFlow."""

    def __init__(self, log_dir: Path):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter
        from tensorboard.util.tensor_util import make_tensor_proto

        log_dir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        self._file = open(log_dir / name, "wb")  # noqa: SIM115 (closed by close())
        self._records = RecordWriter(self._file)
        self._event, self._tensor = event_pb2.Event, make_tensor_proto
        # Every scalar carries the scalars plugin's metadata, as TensorBoard's own writer gives it.
        self._metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
            data_class=summary_pb2.DataClass.DATA_CLASS_SCALAR)
        self._write(self._event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event) -> None:
        self._records.write(event.SerializeToString())

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        event = self._event(wall_time=time.time(), step=step)
        event.summary.value.add(tag=tag, tensor=self._tensor(np.float32(value)), metadata=self._metadata)
        self._write(event)

    def close(self) -> None:
        self._file.close()


def write_run_log(cfg: RunConfig, outcome: dict) -> Path:
    """train/loss and train/learning_rate per logged step, perf/step_time_s and perf/samples_per_s per measured
    step (x: the measured step's index, warm-up and compiling steps left out as in the record), and every
    evaluation's metric and loss at its step."""
    log_dir = Path(cfg.tensorboard_dir) / cfg.run_id
    writer = EventFile(log_dir)
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
