"""Learnable synthetic stand-ins for MNIST and WikiText-2, used when the real files are absent.

They have the real shapes, sizes and vocabulary, so models, FLOPs and step times are those
of the real workload, and a model that trains on them shows it: loss falls, accuracy rises.
"""
from __future__ import annotations

import numpy as np

from common.spec import CLS_ID, SPECIAL_TOKENS

MNIST_SIZES = {"train": 60000, "test": 10000}
WIKITEXT_SEQUENCES = {"train": 16384, "valid": 1024, "test": 1024}
_SPLIT_STREAM = {"train": 0, "test": 1, "valid": 2}


def synthetic_mnist(split: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Ten fixed random prototypes (shared by all splits), each shifted by up to 2 pixels, plus noise."""
    prototypes = (np.random.default_rng([seed, 0xC1A55]).random((10, 28, 28)) > 0.7) * np.int16(200)
    shifted = np.stack([np.roll(prototypes, (dy, dx), axis=(1, 2))
                        for dy in range(-2, 3) for dx in range(-2, 3)], axis=1)  # [10, 25, 28, 28]
    rng = np.random.default_rng([seed, _SPLIT_STREAM[split], 0x1D9])
    n = MNIST_SIZES[split]
    labels = rng.integers(0, 10, size=n).astype(np.uint8)
    images = shifted[labels, rng.integers(0, 25, size=n)]
    images += rng.integers(-60, 61, size=images.shape, dtype=np.int16)
    return np.clip(images, 0, 255).astype(np.uint8), labels


def synthetic_wikitext(split: str, seq_len: int, seed: int, words: int = 2000,
                       causal: bool = False) -> np.ndarray:
    """Sequences from a fixed successor table over `words` ids: token t+1 = next[token t] 90% of the
    time, else random. A masked token is predictable from its left neighbour, so MLM can learn it, and so is
    the next token. The MLM's rows ([N, seq_len]) start with [CLS]; the decoder LM's (`causal`: [N, seq_len + 1],
    inputs and labels) do not."""
    first = len(SPECIAL_TOKENS)
    successor = first + np.random.default_rng([seed, 0x5EC]).permutation(words)
    rng = np.random.default_rng([seed, _SPLIT_STREAM[split], 0x7E7])
    n, length = WIKITEXT_SEQUENCES[split], seq_len + 1 if causal else seq_len
    tokens = np.empty((n, length), dtype=np.int32)
    start = 0 if causal else 1
    tokens[:, 0] = CLS_ID
    tokens[:, start] = first + rng.integers(0, words, size=n)
    jumps = rng.random((n, length)) < 0.1
    randoms = first + rng.integers(0, words, size=(n, length))
    for t in range(start + 1, length):
        tokens[:, t] = np.where(jumps[:, t], randoms[:, t], successor[tokens[:, t - 1] - first])
    return tokens
