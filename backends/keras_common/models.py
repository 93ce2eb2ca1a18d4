"""The workload models in Keras 3, built from common.spec: the SimpleCNN, a keras-hub BERT MLM and keras-hub's
Llama decoder (the lm workload, from its model file: common.predict.decoder).

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


def decoder_lm(spec) -> keras.Model:
    """keras-hub's LlamaBackbone and its untied output layer (the token embedding's reverse projection): torch's
    DecoderLM computed the same way (RMSNorm, rotate-half rotary positions, SwiGLU, query head i reading key/value
    head i // (heads / kv_heads), causal attention with a float32 softmax), from a DecoderSpec's own epsilon and
    RoPE wavelength rather than keras-hub's defaults."""
    import keras_hub  # here, as for BERT

    if spec.hidden != spec.heads * spec.head_dim:
        raise ValueError(f"{spec.name}: keras-hub's Llama takes its head size from hidden / heads")
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=spec.vocab, num_layers=spec.layers, num_query_heads=spec.heads,
        num_key_value_heads=spec.kv_heads, hidden_dim=spec.hidden, intermediate_dim=spec.ffn,
        rope_max_wavelength=spec.rope_theta, layer_norm_epsilon=spec.norm_eps, tie_word_embeddings=False)
    logits = backbone.token_embedding(backbone.output, reverse=True)
    return keras.Model(backbone.input, logits, name="decoder_lm")


def decoder_inputs(token_ids) -> dict:
    """The decoder's inputs, as tensors of the Keras backend: LlamaBackbone takes a padding mask and torch's
    DecoderLM none, so every key is kept; only the last row has padding, at its end, where the causal mask already
    hides it from every real position."""
    token_ids = keras.ops.convert_to_tensor(token_ids)
    return {"token_ids": token_ids, "padding_mask": keras.ops.ones_like(token_ids)}


def token_targets(batch: dict) -> tuple:
    """(labels, weights) a token workload's loss reads from common's batch: the masked tokens (mlm) or the next
    tokens (lm), each position weighted (0: no label there)."""
    if "labels" in batch:
        return batch["labels"], batch["label_weights"]
    return batch["mask_ids"], batch["mask_weights"]


def build_model(workload: str, spec, sync_bn: bool = False) -> keras.Model:
    if workload == "cnn":
        return simple_cnn(spec, sync_bn)
    return decoder_lm(spec) if workload == "lm" else bert_mlm(spec)


def trainable_param_count(model: keras.Model) -> int:
    return sum(math.prod(w.shape) for w in model.trainable_weights)
