"""mindspore_auto's reference: MindSpore's `Model.train` under msrun, same parallel mode, MindSpore's own dataset.

    msrun ... backends/mindspore_auto/bare.py CONFIG.json RESULT.json   (started by MindSporeAuto.run_bare)

The same model cells and initial weights as the suite's run, wrapped the documented way: a loss cell
(mean over the batch), the suite's AdamW (mindspore.experimental.optim), nn.TrainOneStepCell (which adds,
in DATA_PARALLEL, the gradient all-reduce) trained by Model, and each rank's samples in a GeneratorDataset
batched by MindSpore. Each rank writes its window to RESULT.rank<R>.json; the backend combines them.
"""
from __future__ import annotations

import sys
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import dataset, nn
from mindspore.experimental.optim import AdamW

from backends.mindspore_auto.models import INPUT_COLUMNS, build_loss_net
from backends.mindspore_auto.pid_registry import mark_finished
from backends.mindspore_auto.worker import start_worker
from common.calibration import BareClock, rank_steps
from common.config import RunConfig
from common.initial_weights import run_initial_weights
from common.results import write_json_atomic

IDIOM = ("MindSpore Model.train (TrainOneStepCell, torch-equivalent experimental.optim.AdamW) over a "
         "GeneratorDataset of samples, batched by MindSpore, same parallel mode, dataset_sink_mode=False")


class MeanLoss(nn.Cell):
    """The suite's loss cell returns (weighted loss sum, correct); Model wants one scalar to minimise."""

    def __init__(self, loss_net: nn.Cell):
        super().__init__(auto_prefix=False)
        self.loss_net = loss_net

    def construct(self, *columns):
        loss_sum, _ = self.loss_net(*columns)
        return loss_sum / columns[-1].sum()  # the last column weighs each sample or masked token


class Samples:
    """Random-access rows for GeneratorDataset. (NumpySlicesDataset would be the shorter idiom, but MindSpore
    2.10 hands its scalar rows to np.array(copy=False), which NumPy 2 refuses for a scalar label.)"""

    def __init__(self, columns: list[np.ndarray]):
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns[0])

    def __getitem__(self, i: int):
        return tuple(np.asarray(c[i]) for c in self.columns)  # 0-d arrays, not NumPy scalars


class StepClock(ms.train.Callback):
    def __init__(self, clock: BareClock):
        super().__init__()
        self.clock = clock

    def on_train_begin(self, run_context):
        self.clock.start()

    def on_train_step_end(self, run_context):
        run_context.original_args().net_outputs.asnumpy()  # the step's loss: waits for the step
        self.clock.tick()


def main(config_path: str, result_path: str) -> None:
    cfg, pcfg, rank, processes = start_worker(RunConfig.load(Path(config_path)))
    columns = INPUT_COLUMNS[cfg.workload]
    steps = rank_steps(cfg, rank, processes)
    if cfg.workload == "cnn":
        steps = [{**s, "weight": np.ones(len(s["label"]), np.float32)} for s in steps]
    data = dataset.GeneratorDataset(Samples([np.concatenate([s[c] for s in steps]) for c in columns]),
                                    column_names=list(columns), shuffle=False)
    data = data.batch(cfg.per_device_batch, drop_remainder=True)
    net = MeanLoss(build_loss_net(cfg.workload, cfg.spec, pcfg, run_initial_weights(cfg)))
    o = cfg.optim
    optimizer = AdamW(net.trainable_params(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                      weight_decay=o.weight_decay)
    clock = BareClock(cfg.warmup_steps)
    # Model(net, optimizer=...) takes nn.Optimizer subclasses only; a TrainOneStepCell is its documented
    # way to train with any other optimizer (it adds the DATA_PARALLEL gradient all-reduce itself).
    model = ms.train.Model(nn.TrainOneStepCell(net, optimizer))
    model.train(1, data, callbacks=[StepClock(clock)], dataset_sink_mode=False)
    write_json_atomic(Path(f"{result_path}.rank{rank}.json"), {**clock.result(), "idiom": IDIOM})
    mark_finished()


if __name__ == "__main__":
    main(*sys.argv[1:3])
