"""common.initial_weights -> the Keras models: names by variable path, layouts converted here.

Keras stores dense kernels `[in, out]` (canonical `[out, in]`), conv kernels HWIO (canonical
OIHW) and keras-hub's attention projections per head: Q/K/V kernels `[hidden, heads, head_dim]`
with biases `[heads, head_dim]`, the output kernel `[heads, head_dim, hidden]` (the decoder's keys and
values over its kv_heads). The decoder's untied output layer is the token embedding's reverse
projection, `[hidden, vocab]`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from common.initial_weights import check_complete, check_shape
from common.spec import BertSpec, CnnSpec

if TYPE_CHECKING:  # Keras itself is not needed to map names and layouts (tests read the mapping without it)
    import keras

    from common.predict.decoder import DecoderSpec

Convert = Callable[[np.ndarray], np.ndarray]


def _same(a: np.ndarray) -> np.ndarray:
    return a


def _dense_kernel(a: np.ndarray) -> np.ndarray:
    return a.T


def _cnn_map(spec: CnnSpec) -> dict[str, tuple[str, Convert]]:
    names = {}
    for i in range(len(spec.conv_channels)):
        names.update({
            f"conv{i}/kernel": (f"conv{i}.weight", lambda a: a.transpose(2, 3, 1, 0)),  # OIHW -> HWIO
            f"conv{i}/bias": (f"conv{i}.bias", _same),
            f"bn{i}/gamma": (f"bn{i}.gamma", _same), f"bn{i}/beta": (f"bn{i}.beta", _same),
            f"bn{i}/moving_mean": (f"bn{i}.moving_mean", _same),
            f"bn{i}/moving_variance": (f"bn{i}.moving_var", _same)})
    for i in range(len(spec.fc_sizes) + 1):
        # models.simple_cnn flattens in torch's (C, H, W) order, so fc0 needs no row permutation.
        names.update({f"fc{i}/kernel": (f"fc{i}.weight", _dense_kernel), f"fc{i}/bias": (f"fc{i}.bias", _same)})
    return names


def _per_head_in(heads: int, d: int) -> Convert:
    """A projection into the heads: [heads x head_dim, in] -> [in, heads, head_dim]."""
    return lambda a: a.T.reshape(-1, heads, d)


def _per_head_out(heads: int, d: int) -> Convert:
    """The projection out of the heads: [out, heads x head_dim] -> [heads, head_dim, out]."""
    return lambda a: a.T.reshape(heads, d, -1)


def _bert_map(spec: BertSpec) -> dict[str, tuple[str, Convert]]:
    heads, d = spec.heads, spec.head_dim
    qkv_kernel, output_kernel = _per_head_in(heads, d), _per_head_out(heads, d)

    def qkv_bias(a):
        return a.reshape(heads, d)

    names = {"token_embedding/embeddings": ("embeddings.token", _same),
             "position_embedding/embeddings": ("embeddings.position", _same),
             "segment_embedding/embeddings": ("embeddings.segment", _same),
             "embeddings_layer_norm/gamma": ("embeddings.norm.gamma", _same),
             "embeddings_layer_norm/beta": ("embeddings.norm.beta", _same),
             "mlm_head/output_bias": ("head.bias", _same),
             "mlm_head/intermediate_dense/kernel": ("head.dense.weight", _dense_kernel),
             "mlm_head/intermediate_dense/bias": ("head.dense.bias", _same),
             "mlm_head/intermediate_layer_norm/gamma": ("head.norm.gamma", _same),
             "mlm_head/intermediate_layer_norm/beta": ("head.norm.beta", _same)}
    for i in range(spec.layers):
        k, c = f"transformer_layer_{i}", f"layers.{i}"
        for proj in ("query", "key", "value"):
            names[f"{k}/self_attention_layer/{proj}/kernel"] = (f"{c}.attention.{proj}.weight", qkv_kernel)
            names[f"{k}/self_attention_layer/{proj}/bias"] = (f"{c}.attention.{proj}.bias", qkv_bias)
        names.update({
            f"{k}/self_attention_layer/attention_output/kernel": (f"{c}.attention.output.weight", output_kernel),
            f"{k}/self_attention_layer/attention_output/bias": (f"{c}.attention.output.bias", _same),
            f"{k}/self_attention_layer_norm/gamma": (f"{c}.attention_norm.gamma", _same),
            f"{k}/self_attention_layer_norm/beta": (f"{c}.attention_norm.beta", _same),
            f"{k}/feedforward_intermediate_dense/kernel": (f"{c}.ffn.in.weight", _dense_kernel),
            f"{k}/feedforward_intermediate_dense/bias": (f"{c}.ffn.in.bias", _same),
            f"{k}/feedforward_output_dense/kernel": (f"{c}.ffn.out.weight", _dense_kernel),
            f"{k}/feedforward_output_dense/bias": (f"{c}.ffn.out.bias", _same),
            f"{k}/feedforward_layer_norm/gamma": (f"{c}.ffn_norm.gamma", _same),
            f"{k}/feedforward_layer_norm/beta": (f"{c}.ffn_norm.beta", _same)})
    return names


def _decoder_map(spec: DecoderSpec) -> dict[str, tuple[str, Convert]]:
    """keras-hub's LlamaBackbone: the gate projection w1 is its feedforward_gate_dense, the up projection w3 its
    feedforward_intermediate_dense, the down projection w2 its feedforward_output_dense."""
    d = spec.head_dim
    names = {"token_embedding/embeddings": ("embeddings.token", _same),
             "token_embedding/reverse_embeddings": ("head.output.weight", _dense_kernel),
             "sequence_output_layernorm/scale": ("head.norm.gamma", _same)}
    for i in range(spec.layers):
        k, c = f"transformer_layer_{i}", f"layers.{i}"
        names.update({
            f"{k}/self_attention/query/kernel": (f"{c}.attention.wq.weight", _per_head_in(spec.heads, d)),
            f"{k}/self_attention/key/kernel": (f"{c}.attention.wk.weight", _per_head_in(spec.kv_heads, d)),
            f"{k}/self_attention/value/kernel": (f"{c}.attention.wv.weight", _per_head_in(spec.kv_heads, d)),
            f"{k}/self_attention/attention_output/kernel": (f"{c}.attention.wo.weight", _per_head_out(spec.heads, d)),
            f"{k}/self_attention_layernorm/scale": (f"{c}.attention_norm.gamma", _same),
            f"{k}/feedforward_gate_dense/kernel": (f"{c}.ffn.w1.weight", _dense_kernel),
            f"{k}/feedforward_intermediate_dense/kernel": (f"{c}.ffn.w3.weight", _dense_kernel),
            f"{k}/feedforward_output_dense/kernel": (f"{c}.ffn.w2.weight", _dense_kernel),
            f"{k}/feedforward_layernorm/scale": (f"{c}.ffn_norm.gamma", _same)})
    return names


def load_initial_weights(model: keras.Model, spec: CnnSpec | BertSpec | DecoderSpec,
                         weights: dict[str, np.ndarray]) -> None:
    """Assign every canonical tensor to its Keras variable (all replicas of a mirrored one)."""
    mapping = weight_map(spec)
    assigned, unmapped = set(), []
    for variable in model.weights:
        if variable.path not in mapping:
            unmapped.append(variable.path)
            continue
        canon, convert = mapping[variable.path]
        value = convert(weights[canon])
        check_shape(variable.path, value.shape, tuple(variable.shape), "keras")
        variable.assign(value)
        assigned.add(canon)
    check_complete(assigned, weights, "keras", unmapped)


def weight_map(spec: CnnSpec | BertSpec | DecoderSpec) -> dict[str, tuple[str, Convert]]:
    """Keras variable path -> (canonical name, the conversion of a canonical array to the Keras layout)."""
    if isinstance(spec, CnnSpec):
        return _cnn_map(spec)
    return _bert_map(spec) if isinstance(spec, BertSpec) else _decoder_map(spec)


def canonical_names(spec: CnnSpec | BertSpec | DecoderSpec) -> dict[str, str]:
    """Keras variable path -> its canonical name (common.initial_weights)."""
    return {path: canon for path, (canon, _) in weight_map(spec).items()}


def keras_shapes(spec: CnnSpec | BertSpec | DecoderSpec, weights: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Keras variable path -> the shape of its value, known before the model is built (a LayoutMap needs it)."""
    mapping = weight_map(spec)
    return {path: tuple(convert(weights[canon]).shape) for path, (canon, convert) in mapping.items()}
