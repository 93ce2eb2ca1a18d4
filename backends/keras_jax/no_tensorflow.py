"""Keep TensorFlow out of a keras_jax process.

keras-hub imports TensorFlow wherever it is installed (keras_hub/src/utils/tensor_utils.py,
`try_import_tensorflow`), for its tf.data preprocessing only; BertBackbone and MaskedLMHead on JAX never use
it. Measured here (jax 0.10, keras-hub 0.32, TensorFlow 2.21 beside them): importing the worker took 7.0 s with
TensorFlow and 2.6 s without, and the process's memory counted TensorFlow's as keras_jax's.
"""
from __future__ import annotations

import sys


def keep_tensorflow_out() -> None:
    """Make `import tensorflow` raise ImportError in this process (keras-hub's guard then takes its no-TensorFlow
    path), unless something imported it already. Call before Keras or keras-hub is first imported."""
    sys.modules.setdefault("tensorflow", None)  # the import system's documented "not importable" marker
