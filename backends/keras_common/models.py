"""The two workload models in Keras 3, built from common.spec: the SimpleCNN and a keras-hub BERT MLM.

Their initial values come from common.initial_weights (weights.py loads them), not from Keras' initializers."""
from __future__ import annotations

import math

import keras

from common.spec import BertSpec, CnnSpec


def simple_cnn(spec: CnnSpec, sync_bn: bool = False) -> keras.Model:
    """torch's SimpleCNN layer for layer: 3x3 valid convs + BatchNorm + ReLU, max-pools, three FCs."""
    image = keras.Input((spec.image_size, spec.image_size), name="image")
    x = keras.layers.Reshape((spec.image_size, spec.image_size, spec.in_channels))(image)  # NHWC
    for i, (cout, pool) in enumerate(zip(spec.conv_channels, spec.pool_after)):
        x = keras.layers.Conv2D(cout, spec.kernel, name=f"conv{i}")(x)
        # Keras' momentum weighs the old moving average: torch's 0.1 is Keras' 0.9.
        x = keras.layers.BatchNormalization(momentum=1 - spec.bn_momentum, epsilon=spec.bn_eps,
                                            synchronized=sync_bn, name=f"bn{i}")(x)
        x = keras.layers.ReLU()(x)
        if pool:
            x = keras.layers.MaxPooling2D(2)(x)
    # Flatten in torch's (C, H, W) order, so fc0's weights correspond one to one with torch's.
    x = keras.layers.Flatten()(keras.layers.Permute((3, 1, 2))(x))
    sizes = (*spec.fc_sizes, spec.num_classes)
    for i, size in enumerate(sizes):
        x = keras.layers.Dense(size, activation=None if i == len(sizes) - 1 else "relu", name=f"fc{i}")(x)
    return keras.Model(image, x, name="simple_cnn")


def bert_mlm(spec: BertSpec) -> keras.Model:
    """keras-hub's BertBackbone and MaskedLMHead (decoder tied to the token embedding).

    The model ends at the backbone's sequence output, so the pooler, which the MLM loss never
    reaches, is not part of it: no weights, no compute, no optimizer state.
    """
    import keras_hub  # here, not at the top: ~1 s a process that builds the CNN would spend for nothing

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=spec.vocab_size, num_layers=spec.layers, num_heads=spec.heads, hidden_dim=spec.hidden,
        intermediate_dim=spec.intermediate, dropout=spec.dropout, max_sequence_length=spec.seq_len,
        num_segments=spec.type_vocab_size)
    # BertMaskedLM's own head keeps MaskedLMHead's LayerNorm epsilon of 1e-5; the spec (and torch) use 1e-12.
    head = keras_hub.layers.MaskedLMHead(
        token_embedding=backbone.token_embedding,
        intermediate_activation=lambda x: keras.activations.gelu(x, approximate=spec.head_gelu_approximate),
        layer_norm_epsilon=spec.layer_norm_eps, name="mlm_head")
    mask_positions = keras.Input((None,), dtype="int32", name="mask_positions")
    logits = head(backbone.output["sequence_output"], mask_positions)
    return keras.Model({**backbone.input, "mask_positions": mask_positions}, logits, name="bert_mlm")


def build_model(workload: str, spec: CnnSpec | BertSpec, sync_bn: bool = False) -> keras.Model:
    return simple_cnn(spec, sync_bn) if workload == "cnn" else bert_mlm(spec)


def trainable_param_count(model: keras.Model) -> int:
    return sum(math.prod(w.shape) for w in model.trainable_weights)
