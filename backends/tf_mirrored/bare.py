"""tf_mirrored's reference: Keras `model.fit` over a `tf.data` pipeline under the same MirroredStrategy.

    python -m backends.tf_mirrored.bare CONFIG.json RESULT.json   (started by TFMirrored.run_bare)

The same logical devices, all-reduce, model and initial weights as the suite's run; the samples of every
step in a tf.data.Dataset (from_tensor_slices, batched to the global batch, prefetched), which fit
distributes over the replicas itself; the loss Keras' own sparse cross-entropy.
"""
from __future__ import annotations

import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from backends.keras_common.models import build_model, token_targets
from backends.keras_common.optimizer import TorchAdamW
from backends.keras_common.weights import load_initial_weights
from backends.tf_mirrored.data import model_inputs, token_inputs
from backends.tf_mirrored.worker import KerasWorker
from common.calibration import BareClock, bare_result, rank_steps
from common.config import RunConfig
from common.initial_weights import run_initial_weights
from common.results import write_json_atomic

IDIOM = "Keras model.fit over tf.data (from_tensor_slices, batch, prefetch) under the same MirroredStrategy"


class StepClock(keras.callbacks.Callback):
    def __init__(self, clock: BareClock, gpu: bool):
        super().__init__()
        self.clock, self.gpu = clock, gpu

    def on_train_begin(self, logs=None):
        self.clock.start()

    def on_train_batch_end(self, batch, logs=None):
        if self.gpu:
            tf.test.experimental.sync_devices()
        self.clock.tick()


def split_inputs(batch: dict):
    """(x, y, sample_weight) in the model's input names."""
    named = model_inputs(batch)
    if "image" in named:
        return named["image"], named["label"]
    return token_inputs(named), *token_targets(named)


def main(config_path: str, result_path: str) -> None:
    cfg = RunConfig.load(Path(config_path))
    suite = KerasWorker()
    suite.start(cfg)  # the suite's own start: the same logical devices, threads and strategy
    strategy = suite.strategy
    steps = rank_steps(cfg, 0, 1, cfg.devices)
    columns = {k: np.concatenate([s[k] for s in steps]) for k in steps[0]}
    dataset = (tf.data.Dataset.from_tensor_slices(columns).batch(cfg.global_batch, drop_remainder=True)
               .map(split_inputs).prefetch(tf.data.AUTOTUNE))
    o = cfg.optim
    with strategy.scope():
        model = build_model(cfg.workload, cfg.spec, cfg.sync_bn)
        load_initial_weights(model, cfg.spec, run_initial_weights(cfg))
        model.compile(optimizer=TorchAdamW(learning_rate=o.lr, weight_decay=o.weight_decay, beta_1=o.beta1,
                                           beta_2=o.beta2, epsilon=o.eps),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    clock = BareClock(cfg.warmup_steps)
    gpu = cfg.device_kind == "cuda"
    model.fit(dataset, epochs=1, steps_per_epoch=cfg.total_steps, callbacks=[StepClock(clock, gpu)], verbose=0)
    write_json_atomic(Path(result_path), bare_result([clock.result()], cfg.global_batch, IDIOM))


if __name__ == "__main__":
    main(*sys.argv[1:3])
