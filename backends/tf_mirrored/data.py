"""common's batches through tf.data, each replica fed exactly the micro-batches of its rank.

A process with L local replicas and worker index w (of W workers) reads the TrainBatches of rank w
with world W and a per-device batch of L x b. Micro-batch k of that rank holds global positions
[k*b*N + w*L*b, + L*b) with N = W*L, so its L contiguous pieces of b are exactly the slices of
global ranks w*L .. w*L+L-1: a MirroredStrategy replica r gets what DDP rank r gets.
"""
from __future__ import annotations

import tensorflow as tf

from backends.keras_common.models import decoder_inputs
from common.data.batches import Batch, StepBatch, TrainBatches

MLM_INPUTS = ("token_ids", "segment_ids", "padding_mask", "mask_positions")
DECODER_INPUTS = ("token_ids", "padding_mask")


def model_inputs(batch: dict) -> dict:
    """common's arrays -> the model's input names, plus the targets.

    Masks become int32: Keras 3 fails on bool inputs (AddN over bool) under MirroredStrategy with
    two or more replicas, and keras-hub declares padding_mask int32 anyway.
    """
    if "image" in batch:
        return {"image": batch["image"], "label": batch["label"]}
    ids = batch["input_ids"]
    if "labels" in batch:
        return {**decoder_inputs(ids), "labels": batch["labels"], "label_weights": batch["label_weights"]}
    return {"token_ids": ids, "segment_ids": tf.zeros_like(ids),  # one segment, as in torch
            "padding_mask": tf.cast(batch["padding_mask"], tf.int32), "mask_positions": batch["mask_positions"],
            "mask_ids": batch["mask_ids"], "mask_weights": batch["mask_weights"]}


def token_inputs(named: dict) -> dict:
    """The token model's own inputs among model_inputs' arrays (the others are its loss's targets)."""
    return {k: named[k] for k in (DECODER_INPUTS if "labels" in named else MLM_INPUTS)}


def _signature(batch: Batch, rows: int) -> dict[str, tf.TensorSpec]:
    return {k: tf.TensorSpec((rows, *v.shape[1:]), tf.as_dtype(v.dtype)) for k, v in batch.items()}


class ReplicaBatches:
    """The `train` object run_loop reads: `get(step)` returns a StepBatch whose micro-batches are
    per-replica values from a distributed tf.data iterator."""

    def __init__(self, batches: TrainBatches, strategy: tf.distribute.Strategy, local_replicas: int,
                 total_steps: int):
        self.batches, self.strategy, self.local, self.total = batches, strategy, local_replicas, total_steps
        self.rows = batches.b // local_replicas
        self._signature = _signature(batches.get(0).micro[0], self.rows)
        self._iterator = None
        self._next_step = -1
        # Filled by the generator, read by get(): what the step's batch carries besides the tensors.
        self._denominators: dict[int, float] = {}
        self._device_ids: dict[int, list] = {}

    def _pieces(self, start: int):
        """Every local replica's piece of every micro-batch, step after step, in replica order:
        the distributed iterator hands element i to local replica i mod L."""
        for step in range(start, self.total):
            sb = self.batches.get(step)
            self._denominators[step] = sb.denominator
            self._device_ids[step] = sb.device_ids
            for micro in sb.micro:
                for r in range(self.local):
                    yield {k: v[r * self.rows:(r + 1) * self.rows] for k, v in micro.items()}

    def _start(self, step: int) -> None:
        def dataset_fn(_context: tf.distribute.InputContext) -> tf.data.Dataset:
            ds = tf.data.Dataset.from_generator(lambda: self._pieces(step), output_signature=self._signature)
            return ds.map(model_inputs)
        options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
        self._iterator = iter(self.strategy.distribute_datasets_from_function(dataset_fn, options))
        self._next_step = step

    def close(self) -> None:
        """Stop the iterator's prefetch threads now: left to interpreter shutdown, they call back
        into a finalising Python (the generator) and can stall the exit."""
        self._iterator = None
        self._next_step = -1

    def get(self, step: int) -> StepBatch:
        if step != self._next_step:
            self._start(step)
        micro = [next(self._iterator) for _ in range(self.batches.k)]
        self._next_step = step + 1
        return StepBatch(micro, self._denominators.pop(step), step // self.batches.steps_per_epoch,
                         self._device_ids.pop(step))

