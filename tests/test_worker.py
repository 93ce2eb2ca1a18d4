"""common.worker.main, the start-up path of every backend's worker: the order in which a run's end happens."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from common import worker
from common.config import RunConfig


class _Backend(worker.Worker):
    """A worker whose feed notes, when it is closed, whether the result was already written."""

    def __init__(self, result, closes: list, fail: bool = False):
        self.result, self.closes, self.fail = result, closes, fail

    def start(self, cfg):
        return worker.data_parallel_process(cfg, 0, 1, keeps_result=True)

    def trainer(self, cfg, process, data, weights):
        backend = self

        class Feed:
            def close(self):
                backend.closes.append(backend.result.is_file())
        return SimpleNamespace(), Feed()


@pytest.fixture
def config(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    RunConfig(run_id="t", backend="torch_ddp", workload="cnn", devices=1, device_kind="cpu", threads_per_device=1,
              scaling="weak", batch_size=8, per_device_batch=8, grad_accum=1, data="synthetic", data_dir="",
              seed=0, total_steps=2, warmup_steps=0, out=str(tmp_path)).save(path)
    monkeypatch.setattr(worker, "load_data", lambda cfg, process: SimpleNamespace(eval=None))
    monkeypatch.setattr(worker, "run_initial_weights", lambda cfg: {})
    return path


def test_the_feed_is_closed_after_the_result_is_written(config, monkeypatch):
    """Deleting TensorFlow's multi-worker iterator has held ranks for up to a minute: it must not hold the result."""
    monkeypatch.setattr(worker, "run_loop", lambda *args, **kwargs: {"backend_metrics": {"a": 1}})
    result, closes = config.parent / "result.json", []
    assert worker.main(_Backend(result, closes), ["worker", str(config), str(result)]) == 0
    assert closes == [True] and json.loads(result.read_text()) == {"backend_metrics": {"a": 1}}


def test_the_feed_is_closed_when_the_loop_fails(config, monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("a collective timed out")
    monkeypatch.setattr(worker, "run_loop", fails)
    result, closes = config.parent / "result.json", []
    with pytest.raises(RuntimeError, match="timed out"):
        worker.main(_Backend(result, closes), ["worker", str(config), str(result)])
    assert closes == [False] and not result.exists()
