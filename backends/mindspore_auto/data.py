"""common's batches served through a MindSpore GeneratorDataset.

The samples, their order and the rank sharding all come from common.data.batches.TrainBatches;
MindSpore's dataset pipeline only prefetches them on its own thread, so that loading the next
step overlaps this one, as MindSpore input pipelines are meant to run.
"""
from __future__ import annotations

import numpy as np
from mindspore import dataset

from common.data.batches import StepBatch, TrainBatches

PREFETCH_STEPS = 2


class _StepSource:
    """Random-access source: item i is step first_step + i, this rank's micro-batches stacked."""

    def __init__(self, train: TrainBatches, columns: tuple[str, ...], first_step: int, total_steps: int):
        self.train, self.columns = train, columns
        self.first_step, self.count = first_step, max(0, total_steps - first_step)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        batch = self.train.get(self.first_step + i)
        stacked = [np.stack([m[c] for m in batch.micro]) for c in self.columns]
        # 0-d arrays, not NumPy scalars: MindSpore converts rows with np.array(copy=False).
        return (*stacked, np.array(batch.denominator, np.float64), np.array(batch.epoch, np.int64),
                np.stack(batch.device_ids).astype(np.int64))


class DatasetBatches:
    """A stand-in for TrainBatches in common.loop.run_loop: `get(step)` for consecutive steps.

    The pipeline starts at the first step asked for, so a resumed run continues where it stopped.
    """

    def __init__(self, train: TrainBatches, total_steps: int):
        self.train, self.total_steps = train, total_steps
        self.columns = tuple(train.get(0).micro[0])
        self.next_step = None
        self._items = None

    def _start(self, first_step: int) -> None:
        dataset.config.set_prefetch_size(PREFETCH_STEPS)
        source = _StepSource(self.train, self.columns, first_step, self.total_steps)
        steps = dataset.GeneratorDataset(source, column_names=[*self.columns, "denominator", "epoch", "device_ids"],
                                         shuffle=False, num_parallel_workers=1, python_multiprocessing=False)
        self._items = steps.create_tuple_iterator(num_epochs=1, output_numpy=True, do_copy=False)
        self.next_step = first_step

    def get(self, step: int) -> StepBatch:
        if self._items is None:
            self._start(step)
        if step != self.next_step:
            raise ValueError(f"steps are served in order: expected {self.next_step}, asked for {step}")
        self.next_step += 1
        *stacked, denominator, epoch, device_ids = next(self._items)
        micro = [{c: col[k] for c, col in zip(self.columns, stacked)} for k in range(len(stacked[0]))]
        return StepBatch(micro, float(denominator), int(epoch), list(device_ids))
