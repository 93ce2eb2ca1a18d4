"""keras_jax's reference: Keras `model.fit` on the same distribution (the same mesh and LayoutMap).

    python -m backends.keras_jax.bare CONFIG.json RESULT.json   (started by KerasJax.run_bare)

The same devices, threads, model, layout and initial weights as the suite's run; the samples of every step as
NumPy arrays that fit batches to the global batch and lays out over "batch" itself (its JAX trainer, one jitted
train step); the loss Keras' own sparse cross-entropy.
"""
from __future__ import annotations

import sys
from pathlib import Path

from backends.keras_jax.no_tensorflow import keep_tensorflow_out

keep_tensorflow_out()

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from backends.keras_common.models import decoder_inputs, token_targets  # noqa: E402
from backends.keras_common.optimizer import TorchAdamW  # noqa: E402
from backends.keras_jax.worker import KerasJaxWorker  # noqa: E402
from common.calibration import BareClock, bare_result, rank_steps  # noqa: E402
from common.config import RunConfig  # noqa: E402
from common.initial_weights import run_initial_weights  # noqa: E402
from common.results import write_json_atomic  # noqa: E402

IDIOM = ("Keras model.fit (JAX trainer, jit_compile) over NumPy arrays under the same keras.distribution layout "
         "and dtype policy")


# Keras' JAX trainer compiles its train step twice in a fit: for the model's uncommitted variables, then for the
# committed state the first step returns (JAX_LOG_COMPILES=1 logs both: 9.8 s and 9.2 s for the tiny MLM on a
# loaded CPU). The second is fit's warm-up, not a step of it: the window opens after it.
FIT_COMPILES = 2


def clock_warmup(warmup_steps: int, steps: int) -> int:
    """The steps the bare loop leaves out of its window: the run's warm-up, and at least fit's compiles while a
    step is left to time."""
    return max(warmup_steps, min(FIT_COMPILES, steps - 1))


class StepClock(keras.callbacks.Callback):
    def __init__(self, clock: BareClock):
        super().__init__()
        self.clock = clock

    def on_train_begin(self, logs=None):
        self.clock.start()

    def on_train_batch_end(self, batch, logs=None):
        # JAX dispatches asynchronously: wait for the step's logs, outputs of the one jitted step with its new
        # state, so ready when the whole step is. Never self.model here: on JAX, Callback.model syncs the whole
        # training state into the model's variables (jax_state_sync), work fit does not do between its steps
        # (on CPU it made this loop's tiny MLM step 2.7 s against the suite's 0.16 s).
        jax.block_until_ready(logs)
        self.clock.tick()


def fit_arrays(steps: list[dict[str, np.ndarray]]) -> tuple:
    """(x, y, sample_weight) for fit, every step's samples in order."""
    columns = {k: np.concatenate([s[k] for s in steps]) for k in steps[0]}
    if "image" in columns:
        return columns["image"], columns["label"].astype(np.int32), None
    ids = columns["input_ids"]
    if "labels" in columns:  # NumPy again, as the idiom feeds fit
        return {k: np.asarray(v) for k, v in decoder_inputs(ids).items()}, *token_targets(columns)
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": columns["padding_mask"].astype(np.int32),
         "mask_positions": columns["mask_positions"]}
    return x, *token_targets(columns)


def main(config_path: str, result_path: str) -> None:
    cfg = RunConfig.load(Path(config_path))
    suite = KerasJaxWorker()
    suite.start(cfg)  # the suite's own start: the same devices and precision policy
    model, _ = suite.model_on_mesh(cfg, run_initial_weights(cfg))
    x, y, weight = fit_arrays(rank_steps(cfg, 0, 1, cfg.layout.data))
    o = cfg.optim
    model.compile(optimizer=TorchAdamW(learning_rate=o.lr, weight_decay=o.weight_decay, beta_1=o.beta1,
                                       beta_2=o.beta2, epsilon=o.eps),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    clock = BareClock(clock_warmup(cfg.warmup_steps, cfg.total_steps))
    model.fit(x, y, sample_weight=weight, batch_size=cfg.global_batch, epochs=1, shuffle=False,
              callbacks=[StepClock(clock)], verbose=0)
    write_json_atomic(Path(result_path), bare_result([clock.result()], cfg.global_batch, IDIOM))


if __name__ == "__main__":
    main(*sys.argv[1:3])
