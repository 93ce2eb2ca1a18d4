"""Checkpoints a crash cannot make us trust: digests, keep-last-two, fallback past a torn file, and
torch.load(weights_only=True) refusing a payload that would run code."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from backends.torch_common.models import build_model
from backends.torch_common.trainer import CHECKPOINT_EXT, TorchTrainer
from common.checkpoints import DIGEST_SUFFIX, checkpoint_path, commit, sha256_of, valid_checkpoints
from common.config import RunConfig
from common.spec import CNN


def _trainer(tmp_path: Path) -> TorchTrainer:
    cfg = RunConfig(run_id="t", backend="torch_ddp", workload="cnn", devices=1, device_kind="cpu",
                    threads_per_device=1, scaling="weak", batch_size=8, per_device_batch=8, grad_accum=1,
                    data="synthetic", data_dir="", seed=0, total_steps=10, warmup_steps=1, out=str(tmp_path))
    torch.manual_seed(0)
    model = build_model("cnn", CNN)
    return TorchTrainer(model, model, cfg, torch.device("cpu"))


def _fill(trainer: TorchTrainer, value: float) -> None:
    with torch.no_grad():
        for p in trainer.core.parameters():
            p.fill_(value)


def _first_param(trainer: TorchTrainer) -> float:
    return float(next(trainer.core.parameters()).detach().flatten()[0])


@pytest.fixture
def three_saves(tmp_path):
    """Checkpoints after steps 1, 2, 3 with every parameter set to the step number."""
    trainer, directory = _trainer(tmp_path), tmp_path / "ckpt"
    for step in (1, 2, 3):
        _fill(trainer, float(step))
        trainer.save_checkpoint(directory, step)
    _fill(trainer, -1.0)
    return trainer, directory


def test_the_last_two_are_kept_and_the_newest_loads(three_saves):
    trainer, directory = three_saves
    names = sorted(p.name for p in directory.iterdir())
    assert names == ["checkpoint-00000002.pt", f"checkpoint-00000002.pt{DIGEST_SUFFIX}",
                     "checkpoint-00000003.pt", f"checkpoint-00000003.pt{DIGEST_SUFFIX}"]
    assert trainer.load_checkpoint(directory) == 3 and _first_param(trainer) == 3.0
    assert trainer.skipped_checkpoints == []


@pytest.mark.parametrize("damage", ["truncate", "flip a byte", "no digest"])
def test_a_torn_newest_checkpoint_is_skipped_for_the_previous(three_saves, damage):
    trainer, directory = three_saves
    newest = checkpoint_path(directory, 3, CHECKPOINT_EXT)
    if damage == "truncate":
        os.truncate(newest, newest.stat().st_size // 2)
    elif damage == "flip a byte":
        data = bytearray(newest.read_bytes())
        data[len(data) // 2] ^= 0xFF
        newest.write_bytes(bytes(data))
    else:  # the crash came between the payload and its digest
        newest.with_name(newest.name + DIGEST_SUFFIX).unlink()
    assert trainer.load_checkpoint(directory) == 2 and _first_param(trainer) == 2.0
    [note] = trainer.skipped_checkpoints
    assert "checkpoint-00000003.pt skipped" in note
    assert trainer.backend_metrics()["skipped_checkpoints"] == [note]


def test_no_valid_checkpoint_means_a_fresh_start(three_saves):
    trainer, directory = three_saves
    for step in (2, 3):
        os.truncate(checkpoint_path(directory, step, CHECKPOINT_EXT), 10)
    assert trainer.load_checkpoint(directory) is None and len(trainer.skipped_checkpoints) == 2


class _RunsCode:
    """A pickle that, when loaded by plain pickle, creates a file: what a planted checkpoint could do."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (Path.touch, (self.target,))


def test_a_pickle_that_runs_code_is_refused_even_with_a_matching_digest(three_saves, tmp_path):
    trainer, directory = three_saves
    target = tmp_path / "pwned"
    planted = {"model": _RunsCode(target), "optimizer": {}, "step": 9}
    commit(directory, 9, CHECKPOINT_EXT, lambda tmp: tmp.write_bytes(pickle.dumps(planted)), keep=3)
    assert [step for step, _ in valid_checkpoints(directory, CHECKPOINT_EXT, [])] == [9, 3, 2]  # digest is fine
    assert trainer.load_checkpoint(directory) == 3
    assert not target.exists(), "the planted pickle ran"
    [note] = trainer.skipped_checkpoints
    assert "checkpoint-00000009.pt" in note and "weights_only" in note
    with pytest.raises(pickle.UnpicklingError):  # what the trainer relies on
        torch.load(checkpoint_path(directory, 9, CHECKPOINT_EXT), weights_only=True)


def test_commit_writes_the_digest_of_the_payload(tmp_path):
    path = commit(tmp_path, 5, ".bin", lambda tmp: tmp.write_bytes(b"payload"))
    assert path.read_bytes() == b"payload"
    assert path.with_name(path.name + DIGEST_SUFFIX).read_text().split() == [sha256_of(path), path.name]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary files left"


def test_pruning_never_removes_the_checkpoint_just_written(tmp_path):
    for step in (5, 6):  # an earlier run's, further along
        commit(tmp_path, step, ".bin", lambda tmp: tmp.write_bytes(b"old"))
    commit(tmp_path, 2, ".bin", lambda tmp: tmp.write_bytes(b"new"))
    assert checkpoint_path(tmp_path, 2, ".bin").read_bytes() == b"new"
