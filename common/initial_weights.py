"""The initial weights of every workload, drawn once in NumPy from the seed, in one framework-neutral layout.

Every backend loads these (backends/<framework>/weights.py maps names and layouts), so every run
of a seed starts from the same numbers whatever the framework: a difference in a comparison
table then comes from the framework and the strategy, not from the initial draw.

Canonical layout (torch's, which is also MindSpore's):
- dense weights `[out, in]`; conv kernels `[out_channels, in_channels, kh, kw]` (OIHW);
- attention Q, K, V and output projections separate, each `[hidden, hidden]`, heads contiguous
  along `out` (head h owns rows h*head_dim .. (h+1)*head_dim);
- embeddings `[rows, hidden]`; LayerNorm and BatchNorm `gamma`/`beta`; BatchNorm running
  statistics `moving_mean`/`moving_var` (not trained, but part of the starting state).

Distributions: the CNN follows torch's default Conv/Linear init, U(+-1/sqrt(fan_in)) for kernel
and bias; BERT follows keras-hub/BERT, truncated normal (std 0.02, cut at 2 std) for kernels and
embeddings, zero biases; the decoder LM the same truncated normal (its model file's init_stddev) for every
weight, its RMSNorm weights ones. Each tensor has its own generator, seeded by (seed, crc32(name)), so a
tensor's values do not depend on which other tensors exist or in which order they are drawn.

A run may ask for its trainable tensors to be perturbed, each value scaled by (1 + rel x N(0, 1))
from a generator of its own: bench.parity uses that to measure how far float32-sized differences
carry a backend's loss curve, the yardstick for how far two frameworks' curves may lie apart.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from common.spec import BertSpec, CnnSpec

if TYPE_CHECKING:
    from common.config import RunConfig

# Keeps the perturbation's generators apart from the ones that draw the weights.
PERTURBATION_STREAM = 0x5E45
# Names of tensors that are state, not trainable parameters.
NON_TRAINABLE_SUFFIXES = (".moving_mean", ".moving_var")


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    init: str            # "uniform" | "truncated_normal" | "zeros" | "ones"
    scale: float = 0.0   # the uniform bound or the normal's std

    @property
    def trainable(self) -> bool:
        return not self.name.endswith(NON_TRAINABLE_SUFFIXES)


def _cnn_layout(spec: CnnSpec) -> list[Tensor]:
    tensors, cin = [], spec.in_channels
    for i, cout in enumerate(spec.conv_channels):
        bound = (cin * spec.kernel ** 2) ** -0.5
        tensors += [Tensor(f"conv{i}.weight", (cout, cin, spec.kernel, spec.kernel), "uniform", bound),
                    Tensor(f"conv{i}.bias", (cout,), "uniform", bound),
                    Tensor(f"bn{i}.gamma", (cout,), "ones"), Tensor(f"bn{i}.beta", (cout,), "zeros"),
                    Tensor(f"bn{i}.moving_mean", (cout,), "zeros"), Tensor(f"bn{i}.moving_var", (cout,), "ones")]
        cin = cout
    dims = (spec.flat_features, *spec.fc_sizes, spec.num_classes)
    for i, (fin, fout) in enumerate(zip(dims, dims[1:])):
        tensors += [Tensor(f"fc{i}.weight", (fout, fin), "uniform", fin ** -0.5),
                    Tensor(f"fc{i}.bias", (fout,), "uniform", fin ** -0.5)]
    return tensors


def _norm(name: str, size: int) -> list[Tensor]:
    return [Tensor(f"{name}.gamma", (size,), "ones"), Tensor(f"{name}.beta", (size,), "zeros")]


def _dense(name: str, fin: int, fout: int, std: float) -> list[Tensor]:
    return [Tensor(f"{name}.weight", (fout, fin), "truncated_normal", std), Tensor(f"{name}.bias", (fout,), "zeros")]


def _bert_layout(spec: BertSpec) -> list[Tensor]:
    h, std = spec.hidden, spec.init_stddev
    tensors = [Tensor("embeddings.token", (spec.vocab_size, h), "truncated_normal", std),
               Tensor("embeddings.position", (spec.seq_len, h), "truncated_normal", std),
               Tensor("embeddings.segment", (spec.type_vocab_size, h), "truncated_normal", std),
               *_norm("embeddings.norm", h)]
    for layer in range(spec.layers):
        p = f"layers.{layer}"
        for proj in ("query", "key", "value", "output"):
            tensors += _dense(f"{p}.attention.{proj}", h, h, std)
        tensors += [*_norm(f"{p}.attention_norm", h), *_dense(f"{p}.ffn.in", h, spec.intermediate, std),
                    *_dense(f"{p}.ffn.out", spec.intermediate, h, std), *_norm(f"{p}.ffn_norm", h)]
    # The decoder is tied to embeddings.token: only its output bias is a tensor of its own.
    tensors += [*_dense("head.dense", h, h, std), *_norm("head.norm", h),
                Tensor("head.bias", (spec.vocab_size,), "zeros")]
    return tensors


def _decoder_layout(spec) -> list[Tensor]:
    """The decoder LM (a common.predict.decoder.DecoderSpec): its linear layers by the description's own names
    (wq, wk, wv, wo; w1 the gate, w3 the up, w2 the down projection), RMSNorm weights as `gamma`."""
    h, std = spec.hidden, spec.init_stddev
    if (spec.biases or spec.norm != "rmsnorm" or spec.position != "rope" or spec.tied_embeddings
            or spec.qk_norm or spec.norm_position != "input"):
        raise ValueError(f"{spec.name}: the lm workload trains Llama-style decoders (rmsnorm before each "
                         "sublayer, no QK-norm, rope, no biases, untied output)")
    tensors = [Tensor("embeddings.token", (spec.vocab, h), "truncated_normal", std)]
    for layer in range(spec.layers):
        p = f"layers.{layer}"
        tensors.append(Tensor(f"{p}.attention_norm.gamma", (h,), "ones"))
        tensors += [Tensor(f"{p}.attention.{lin.name}.weight", (lin.outputs, lin.inputs), "truncated_normal", std)
                    for lin in spec.linears() if lin.name in ("wq", "wk", "wv", "wo")]
        tensors.append(Tensor(f"{p}.ffn_norm.gamma", (h,), "ones"))
        tensors += [Tensor(f"{p}.ffn.{lin.name}.weight", (lin.outputs, lin.inputs), "truncated_normal", std)
                    for lin in spec.linears() if lin.name in ("w1", "w2", "w3")]
    return [*tensors, Tensor("head.norm.gamma", (h,), "ones"),
            Tensor("head.output.weight", (spec.vocab, h), "truncated_normal", std)]


def layout(spec) -> list[Tensor]:
    """Every tensor of the model's starting state, in a fixed order."""
    if isinstance(spec, CnnSpec):
        return _cnn_layout(spec)
    return _bert_layout(spec) if isinstance(spec, BertSpec) else _decoder_layout(spec)


def _draw(t: Tensor, seed: int) -> np.ndarray:
    if t.init == "zeros":
        return np.zeros(t.shape, np.float32)
    if t.init == "ones":
        return np.ones(t.shape, np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    if t.init == "uniform":
        return rng.uniform(-t.scale, t.scale, t.shape).astype(np.float32)
    values = rng.normal(0.0, t.scale, t.shape)
    outside = np.abs(values) > 2 * t.scale
    while outside.any():  # redraw what falls outside +-2 std, which is what truncation means
        values[outside] = rng.normal(0.0, t.scale, int(outside.sum()))
        outside = np.abs(values) > 2 * t.scale
    return values.astype(np.float32)


def _perturbed(t: Tensor, values: np.ndarray, seed: int, relative: float, perturbation_seed: int) -> np.ndarray:
    if not relative or not t.trainable:
        return values
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode()), PERTURBATION_STREAM, perturbation_seed])
    return (values * (1.0 + relative * rng.standard_normal(values.shape))).astype(np.float32)


def initial_weights(spec: CnnSpec | BertSpec, seed: int, perturbation: float = 0.0,
                    perturbation_seed: int = 1) -> dict[str, np.ndarray]:
    """Canonical name -> float32 array, for the model of `spec` and the run's seed; trainable tensors
    scaled by (1 + perturbation x N(0, 1)) when `perturbation` is not 0."""
    return {t.name: _perturbed(t, _draw(t, seed), seed, perturbation, perturbation_seed) for t in layout(spec)}


def run_initial_weights(cfg: RunConfig) -> dict[str, np.ndarray]:
    """The initial weights a run starts from: its seed, and its perturbation if it asked for one."""
    return initial_weights(cfg.spec, cfg.seed, cfg.init_perturbation, cfg.init_perturbation_seed)


def trainable_count(spec: CnnSpec | BertSpec) -> int:
    """Trainable parameters of the layout; tests hold it equal to the spec's formula."""
    return sum(int(np.prod(t.shape)) for t in layout(spec) if t.trainable)


def check_complete(assigned: set[str], weights: dict[str, np.ndarray], framework: str,
                   unmapped: list[str]) -> None:
    """Fail loudly when a loader left a canonical tensor unused or a model parameter unassigned."""
    unused = sorted(set(weights) - assigned)
    if unused or unmapped:
        raise RuntimeError(f"{framework}: initial weights do not cover the model: "
                           f"unused {unused[:5]}{'...' if len(unused) > 5 else ''}, "
                           f"unassigned {unmapped[:5]}{'...' if len(unmapped) > 5 else ''}")


def check_shape(name: str, expected: tuple[int, ...], got: tuple[int, ...], framework: str) -> None:
    if tuple(expected) != tuple(got):
        raise RuntimeError(f"{framework}: {name} has shape {tuple(got)}, the initial weights give {tuple(expected)}")
