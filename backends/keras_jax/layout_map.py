"""How keras_jax lays the Keras models' weights out on its ("batch", "model") DeviceMesh: the one place that
turns common.layout.Layout into keras.distribution's LayoutMap.

The tensor-parallel plan is Megatron's, as torch_3d's and mindspore_auto's (a test holds the three against each
other): query, key, value and the first FFN matmul split by output columns (keras-hub keeps Q/K/V per head,
[hidden, heads, head_dim]: the heads axis), the attention output and the second FFN matmul by input rows; the
decoder's (keras-hub's Llama) the same, its gate and up projections both by columns. With --vocab-split the token
table (and the tied decoder with it, or the decoder LM's untied output layer) and the decoder bias split by
vocabulary rows.
--fsdp adds the data axis to every weight (ZeRO-3/FSDP as GSPMD does it). Which collectives follow
is XLA's decision, not written here.

Pure Python: the axes of every weight are decided from its path and shape, so tests check the plan without JAX.
"""
from __future__ import annotations

import re

from common.layout import Layout

MESH_AXES = ("batch", "model")
# keras-hub variable path within transformer_layer_<i>/ -> the axis of its value split over "model".
LAYER_SPLITS = {
    "self_attention_layer/query/kernel": 1, "self_attention_layer/query/bias": 0,
    "self_attention_layer/key/kernel": 1, "self_attention_layer/key/bias": 0,
    "self_attention_layer/value/kernel": 1, "self_attention_layer/value/bias": 0,
    "self_attention_layer/attention_output/kernel": 0,
    "feedforward_intermediate_dense/kernel": 1, "feedforward_intermediate_dense/bias": 0,
    "feedforward_output_dense/kernel": 0,
}
# The same within keras-hub's LlamaTransformerDecoder (the lm workload): Q [hidden, heads, head_dim] and K, V
# [hidden, kv_heads, head_dim] by heads, the output [heads, head_dim, hidden] by its heads rows; w1 (gate) and w3
# (up) [hidden, ffn] by columns, w2 [ffn, hidden] by rows.
DECODER_LAYER_SPLITS = {
    "self_attention/query/kernel": 1, "self_attention/key/kernel": 1, "self_attention/value/kernel": 1,
    "self_attention/attention_output/kernel": 0,
    "feedforward_gate_dense/kernel": 1, "feedforward_intermediate_dense/kernel": 1,
    "feedforward_output_dense/kernel": 0,
}
# The vocabulary rows, split over "model" when the embedding is not replicated (--vocab-split); the decoder LM's
# output layer, the token embedding's reverse projection [hidden, vocab], by its vocabulary columns.
VOCAB_SPLITS = {"token_embedding/embeddings": 0, "mlm_head/output_bias": 0, "token_embedding/reverse_embeddings": 1}
_LAYER = re.compile(r"transformer_layer_[0-9]+/(.+)")


def model_axis(path: str, layout: Layout) -> int | None:
    """The axis of weight `path` that tensor parallelism splits, or None (replicated over "model")."""
    if layout.tp == 1:
        return None
    match = _LAYER.fullmatch(path)
    if match:  # a block weight of BERT or of the decoder (the two share only the FFN names, split alike)
        return LAYER_SPLITS.get(match.group(1), DECODER_LAYER_SPLITS.get(match.group(1)))
    return VOCAB_SPLITS.get(path) if layout.vocab_split else None


def weight_axes(path: str, shape: tuple[int, ...], layout: Layout) -> tuple[str | None, ...]:
    """Per axis of the weight, the mesh axis it is split over (None: whole on every device)."""
    axes: list[str | None] = [None] * len(shape)
    split = model_axis(path, layout)
    if split is not None:
        axes[split] = "model"
    if layout.sharded:
        # The largest free axis that divides: every device then holds 1/dp of the weight and its moments.
        free = sorted((i for i in range(len(shape)) if axes[i] is None and shape[i] % layout.fsdp == 0),
                      key=lambda i: -shape[i])
        if free:
            axes[free[0]] = "batch"
    return tuple(axes)


def weight_plan(shapes: dict[str, tuple[int, ...]], layout: Layout) -> dict[str, tuple[str | None, ...]]:
    """Every weight (keras path -> shape) -> its axes, for the LayoutMap and for checking the built model."""
    return {path: weight_axes(path, shape, layout) for path, shape in shapes.items()}


def layout_map_keys(plan: dict[str, tuple[str | None, ...]]) -> dict[str, tuple[str | None, ...]]:
    """The LayoutMap's entries: Keras matches a key against a variable's path with re.fullmatch, so a key is the
    escaped path itself (a key that matched nothing would leave its weight replicated without a word)."""
    return {re.escape(path): axes for path, axes in plan.items()}


def unsplit(plan: dict[str, tuple[str | None, ...]], placed: dict[str, tuple[str | None, ...]]) -> list[str]:
    """The weights the built model did not lay out as planned (path: planned vs placed): empty when every split
    reached its variable."""
    return [f"{path}: planned {axes}, placed {placed.get(path)}" for path, axes in plan.items()
            if tuple(placed.get(path) or ()) != axes]
