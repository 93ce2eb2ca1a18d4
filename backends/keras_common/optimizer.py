"""AdamW with epsilon where torch and MindSpore put it.

Keras' Adam divides by sqrt(v) + eps before bias correction (the "epsilon hat" form of Kingma &
Ba); torch.optim.AdamW and mindspore.experimental.optim.AdamW divide by sqrt(v_hat) + eps after
it. The two differ by a factor sqrt(1 - beta2^t) on eps: about 30x at step 1, which moves every
parameter whose gradient is near 1e-7 (the token-embedding rows the tied decoder touches) and
made Keras' loss drift from torch's by ~4e-5 relative within three steps.
"""
from __future__ import annotations

import keras
from keras import ops


class TorchAdamW(keras.optimizers.AdamW):
    def update_step(self, gradient, variable, learning_rate):
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        step = ops.cast(self.iterations + 1, variable.dtype)
        bias_1 = 1 - ops.power(ops.cast(self.beta_1, variable.dtype), step)
        bias_2 = 1 - ops.power(ops.cast(self.beta_2, variable.dtype), step)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2))
        # torch: p -= lr * (m / bias_1) / (sqrt(v / bias_2) + eps)
        denominator = ops.add(ops.sqrt(ops.divide(v, bias_2)), self.epsilon)
        self.assign_sub(variable, ops.divide(ops.multiply(m, lr / bias_1), denominator))
