"""common.initial_weights -> the torch models: names mapped here, layouts already torch's (OIHW, [out, in])."""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from backends.torch_common.models import BertMLM, DecoderLM, SimpleCNN, build_model
from common.final_params import summarise
from common.initial_weights import check_complete, check_shape

# BatchNorm's batch counter is bookkeeping, not state a forward or an update reads (momentum is fixed).
_NOT_STATE = ("num_batches_tracked",)


def _cnn_names(model: SimpleCNN) -> dict[str, str]:
    names = {}
    convs = [i for i, m in enumerate(model.features) if isinstance(m, nn.Conv2d)]
    norms = [i for i, m in enumerate(model.features) if isinstance(m, nn.BatchNorm2d)]
    for n, (c, b) in enumerate(zip(convs, norms)):
        names.update({f"conv{n}.weight": f"features.{c}.weight", f"conv{n}.bias": f"features.{c}.bias",
                      f"bn{n}.gamma": f"features.{b}.weight", f"bn{n}.beta": f"features.{b}.bias",
                      f"bn{n}.moving_mean": f"features.{b}.running_mean",
                      f"bn{n}.moving_var": f"features.{b}.running_var"})
    linears = [i for i, m in enumerate(model.classifier) if isinstance(m, nn.Linear)]
    for n, i in enumerate(linears):
        names.update({f"fc{n}.weight": f"classifier.{i}.weight", f"fc{n}.bias": f"classifier.{i}.bias"})
    return names


def _bert_names(model: BertMLM) -> dict[str, str]:
    names = {"embeddings.token": "token_embedding.weight", "embeddings.position": "position_embedding.weight",
             "embeddings.segment": "segment_embedding.weight", "head.bias": "head_bias"}
    norms = {"embeddings.norm": "embeddings_norm", "head.norm": "head_norm"}
    dense = {"head.dense": "head_dense"}
    for i in range(model.spec.layers):  # all of them, also where a pipeline stage holds a few
        p = f"layers.{i}"
        dense.update({f"{p}.attention.{q}": f"{p}.attention.{q}" for q in ("query", "key", "value", "output")})
        dense.update({f"{p}.ffn.in": f"{p}.ffn_in", f"{p}.ffn.out": f"{p}.ffn_out"})
        norms.update({f"{p}.attention_norm": f"{p}.attention_norm", f"{p}.ffn_norm": f"{p}.ffn_norm"})
    for canon, mod in dense.items():
        names.update({f"{canon}.weight": f"{mod}.weight", f"{canon}.bias": f"{mod}.bias"})
    for canon, mod in norms.items():
        names.update({f"{canon}.gamma": f"{mod}.weight", f"{canon}.beta": f"{mod}.bias"})
    return names


def _decoder_names(model: DecoderLM) -> dict[str, str]:
    names = {"embeddings.token": "token_embedding.weight", "head.norm.gamma": "norm.weight",
             "head.output.weight": "output.weight"}
    for i in range(model.spec.layers):
        p = f"layers.{i}"
        names.update({f"{p}.attention_norm.gamma": f"{p}.attention_norm.weight",
                      f"{p}.ffn_norm.gamma": f"{p}.ffn_norm.weight"})
        names.update({f"{p}.attention.{w}.weight": f"{p}.attention.{w}.weight" for w in ("wq", "wk", "wv", "wo")})
        names.update({f"{p}.ffn.{w}.weight": f"{p}.ffn.{w}.weight" for w in ("w1", "w2", "w3")})
    return names


def _names(model: nn.Module) -> dict[str, str]:
    """Canonical name (common.initial_weights) -> torch name in `model`."""
    if isinstance(model, SimpleCNN):
        return _cnn_names(model)
    return _decoder_names(model) if isinstance(model, DecoderLM) else _bert_names(model)


def canonical_names(model: nn.Module) -> dict[str, str]:
    """torch name (of `model`'s parameters and buffers) -> canonical name (common.initial_weights)."""
    return {key: canon for canon, key in _names(model).items()}


@torch.no_grad()
def final_params(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]] | None = None) -> dict:
    """common.final_params' summary of the trainable weights under their canonical names. `weights`: the
    (name in `model`, whole tensor) pairs where they are not `model`'s own parameters (a sharded stage)."""
    canonical = canonical_names(model)
    pairs = model.named_parameters() if weights is None else weights
    return summarise((canonical[name], tensor.detach().double().cpu().numpy()) for name, tensor in pairs)


@torch.no_grad()
def load_initial_weights(model: nn.Module, weights: dict[str, np.ndarray]) -> None:
    """Copy every canonical tensor into `model` (before it is wrapped); fails if anything is left over."""
    names = _names(model)
    state = model.state_dict()
    assigned = set()
    for canon, key in names.items():
        if canon not in weights or key not in state:
            continue
        check_shape(canon, weights[canon].shape, tuple(state[key].shape), "torch")
        state[key].copy_(torch.from_numpy(weights[canon]))
        assigned.add(canon)
    loaded = {names[c] for c in assigned}
    unmapped = [k for k in state if k not in loaded and not k.endswith(_NOT_STATE)]
    check_complete(assigned, weights, "torch", unmapped)


def initialised_model(workload: str, spec, weights: dict[str, np.ndarray]) -> nn.Module:
    """The workload's model holding `weights` (common.initial_weights)."""
    model = build_model(workload, spec)
    load_initial_weights(model, weights)
    return model
