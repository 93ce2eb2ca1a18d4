"""Batches for every backend: one global order per (seed, epoch), sliced the same way by rank.

A global batch is `per_device_batch * world * micro_batches` samples. Micro-batch k of step s
on rank r holds global positions [k*b*world + r*b, ... + b) of that step, so a run on N devices
sees exactly the samples a 1-device run with the same global batch sees, in the same steps.
Training drops the last incomplete global batch of an epoch; evaluation covers every sample once.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from common.data.datasets import SplitData
from common.data.masking import EVAL_EPOCH, mask_tokens
from common.errors import BadInput
from common.spec import PAD_ID, BertSpec, CnnSpec

Batch = dict[str, np.ndarray]


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, 0x0D5]).permutation(n)


def _select(workload: str, arrays: dict[str, np.ndarray], idx: np.ndarray) -> Batch:
    if workload == "cnn":
        # Scaling happens here, once, so every framework sees bit-identical float32 inputs.
        return {"image": arrays["image"][idx].astype(np.float32) * np.float32(1 / 255),
                "label": arrays["label"][idx].astype(np.int32)}
    return {k: v[idx] for k, v in arrays.items()}


# The per-position weights the loss is averaged over: the MLM's selected tokens, the decoder LM's real labels.
TOKEN_WEIGHTS = {"mlm": "mask_weights", "lm": "label_weights"}


def batch_weight(workload: str, batch: Batch) -> float:
    """What the loss is averaged over: samples (cnn) or weighted tokens (mlm, lm)."""
    return float(batch[TOKEN_WEIGHTS[workload]].sum()) if workload in TOKEN_WEIGHTS else float(len(batch["label"]))


def next_token_inputs(tokens: np.ndarray) -> dict[str, np.ndarray]:
    """Rows of seq_len + 1 tokens -> the inputs (all but the last), the labels (all but the first) and a weight
    of 1 at every real label (0 where the last row's padding is the label)."""
    labels = tokens[:, 1:]
    return {"input_ids": tokens[:, :-1], "labels": labels, "label_weights": (labels != PAD_ID).astype(np.float32)}


def _model_inputs(data: SplitData, spec, seed: int, epoch: int) -> dict[str, np.ndarray]:
    if data.workload == "mlm":
        return mask_tokens(data.arrays["tokens"], spec, seed, epoch)
    if data.workload == "lm":
        return next_token_inputs(data.arrays["tokens"])
    return data.arrays


@dataclass
class StepBatch:
    micro: list[Batch]       # this rank's micro-batches of the step
    denominator: float       # the global batch's loss weight, over all ranks and micro-batches
    epoch: int
    # The sample ids each of this process's devices trains on in the step, micro-batches in order:
    # what the loop hashes per epoch to prove that every backend feeds every device the same data.
    device_ids: list[np.ndarray] = field(default_factory=list)


class TrainBatches:
    """Stateless in the step: `get(step)` needs no history, so a resumed run continues exactly."""

    def __init__(self, data: SplitData, spec: CnnSpec | BertSpec, seed: int, per_device_batch: int,
                 world: int, rank: int, micro_batches: int = 1, local_devices: int = 1):
        """`per_device_batch` is per rank (process); a rank driving `local_devices` devices in one
        process (MirroredStrategy, DataParallel) hands device d the d-th contiguous piece of it."""
        self.data, self.spec, self.seed = data, spec, seed
        self.b, self.world, self.rank, self.k = per_device_batch, world, rank, micro_batches
        self.local_devices = local_devices
        self.global_batch = per_device_batch * world * micro_batches
        if self.global_batch > len(data):
            raise BadInput(f"global batch {self.global_batch} exceeds the {len(data)} samples of "
                           f"{data.workload}/{data.split}")
        self.steps_per_epoch = len(data) // self.global_batch
        self._cached_epoch: int | None = None
        self._order = self._inputs = None

    def _load_epoch(self, epoch: int) -> None:
        if self._cached_epoch != epoch:
            self._order = epoch_order(len(self.data), self.seed, epoch)
            self._inputs = _model_inputs(self.data, self.spec, self.seed, epoch)
            self._cached_epoch = epoch

    def global_indices(self, step: int) -> np.ndarray:
        epoch, i = divmod(step, self.steps_per_epoch)
        self._load_epoch(epoch)
        return self._order[i * self.global_batch:(i + 1) * self.global_batch]

    def rank_indices(self, step: int) -> list[np.ndarray]:
        return self._rank_slices(self.global_indices(step))

    def _rank_slices(self, glob: np.ndarray) -> list[np.ndarray]:
        shaped = glob.reshape(self.k, self.world, self.b)
        return [shaped[m, self.rank] for m in range(self.k)]

    def get(self, step: int) -> StepBatch:
        glob = self.global_indices(step)
        slices = self._rank_slices(glob)
        micro = [_select(self.data.workload, self._inputs, idx) for idx in slices]
        weights = TOKEN_WEIGHTS.get(self.data.workload)
        denominator = float(self._inputs[weights][glob].sum()) if weights else float(len(glob))
        return StepBatch(micro, denominator, step // self.steps_per_epoch, self._device_ids(slices))

    def _device_ids(self, slices: list[np.ndarray]) -> list[np.ndarray]:
        pieces = [s.reshape(self.local_devices, -1) for s in slices]
        return [np.concatenate([p[d] for p in pieces]) for d in range(self.local_devices)]

    def epoch_digest(self, epoch: int) -> str:
        """SHA-256 of the sample ids this rank is dealt in `epoch`, in order; the loop measures the same
        digest from the ids it actually trains on (tests hold the two equal)."""
        first = epoch * self.steps_per_epoch
        ids = [i for s in range(first, first + self.steps_per_epoch) for i in self.rank_indices(s)]
        return hashlib.sha256(np.concatenate(ids).astype(np.int64).tobytes()).hexdigest()


def eval_indices(n: int, rank: int, world: int) -> np.ndarray:
    """Contiguous, possibly uneven shards: every sample exactly once, none duplicated as padding."""
    return np.array_split(np.arange(n), world)[rank]


def eval_samples(data: SplitData, limit: int = 0) -> int:
    """How many of the split's samples an evaluation takes: its first `limit` (0: all)."""
    return min(len(data), limit) if limit else len(data)


def eval_batches(data: SplitData, spec: CnnSpec | BertSpec, seed: int, rank: int, world: int,
                 batch_size: int, limit: int = 0) -> Iterator[Batch]:
    inputs = _model_inputs(data, spec, seed, EVAL_EPOCH)
    idx = eval_indices(eval_samples(data, limit), rank, world)
    for start in range(0, len(idx), batch_size):
        yield _select(data.workload, inputs, idx[start:start + batch_size])
