"""common.initial_weights -> the MindSpore models. Layouts are the canonical ones (OIHW, [out, in]),
so only names are mapped; BatchNorm's moving statistics are loaded as well."""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn

from common.initial_weights import check_complete, check_shape, layout
from common.spec import BertSpec, CnnSpec


def _cnn_names(spec: CnnSpec) -> dict[str, str]:
    names = {}
    for i in range(len(spec.conv_channels)):
        names.update({f"blocks.{i}.weight": f"conv{i}.weight", f"blocks.{i}.bias": f"conv{i}.bias",
                      f"blocks.{i}.norm.gamma": f"bn{i}.gamma", f"blocks.{i}.norm.beta": f"bn{i}.beta",
                      f"blocks.{i}.norm.moving_mean": f"bn{i}.moving_mean",
                      f"blocks.{i}.norm.moving_variance": f"bn{i}.moving_var"})
    hidden = len(spec.fc_sizes)
    for i in range(hidden):
        names.update({f"hidden.{i}.0.weight": f"fc{i}.weight", f"hidden.{i}.0.bias": f"fc{i}.bias"})
    names.update({"classifier.weight": f"fc{hidden}.weight", "classifier.bias": f"fc{hidden}.bias"})
    return names


def _bert_names(spec: BertSpec) -> dict[str, str]:
    names = {"embedding.token_table": "embeddings.token", "embedding.position_table": "embeddings.position",
             "embedding.segment_table": "embeddings.segment", "head.bias": "head.bias"}
    modules = {"embedding.norm": "embeddings.norm", "head.dense": "head.dense", "head.norm": "head.norm"}
    for i in range(spec.layers):
        m, c = f"layers.{i}", f"layers.{i}"
        modules.update({f"{m}.{p}": f"{c}.attention.{p}" for p in ("query", "key", "value", "output")})
        modules.update({f"{m}.ffn_in": f"{c}.ffn.in", f"{m}.ffn_out": f"{c}.ffn.out",
                        f"{m}.attention_norm": f"{c}.attention_norm", f"{m}.ffn_norm": f"{c}.ffn_norm"})
    for ms_name, canon in modules.items():
        for leaf in ("weight", "bias", "gamma", "beta"):
            names[f"{ms_name}.{leaf}"] = f"{canon}.{leaf}"
    return names


def _decoder_names(spec) -> dict[str, str]:
    """models.DecoderLM's cells carry the canonical names: each maps to itself ([out, in] weights as they are)."""
    return {t.name: t.name for t in layout(spec)}


def _names(spec) -> dict[str, str]:
    """MindSpore parameter name -> canonical name (common.initial_weights)."""
    if isinstance(spec, CnnSpec):
        return _cnn_names(spec)
    return _bert_names(spec) if isinstance(spec, BertSpec) else _decoder_names(spec)


def load_initial_weights(model: nn.Cell, spec, weights: dict[str, np.ndarray]) -> None:
    """Set every parameter of `model` (trainable or not) from the canonical tensors; fails on any gap."""
    names = _names(spec)
    assigned, unmapped = set(), []
    for name, param in model.parameters_and_names():
        canon = names.get(name)
        if canon not in weights:
            unmapped.append(name)
            continue
        check_shape(name, weights[canon].shape, tuple(param.shape), "mindspore")
        param.set_data(Tensor(weights[canon]))
        assigned.add(canon)
    check_complete(assigned, weights, "mindspore", unmapped)
