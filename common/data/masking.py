"""BERT masked-LM masking, vectorized and deterministic in (seed, epoch).

Per sequence, round(15% of its maskable tokens) positions are chosen (at least one, at most
`max_predictions`, as BERT's create_pretraining_data does); each chosen token becomes [MASK]
80% of the time, a random word 10%, itself 10%. Labels exist only at chosen positions.
"""
from __future__ import annotations

import numpy as np

from common.spec import CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS, BertSpec

_UNMASKABLE = np.array([PAD_ID, CLS_ID, SEP_ID, MASK_ID], dtype=np.int32)
EVAL_EPOCH = -1  # the masking of evaluation splits is fixed, not re-drawn per epoch


def mask_tokens(tokens: np.ndarray, spec: BertSpec, seed: int, epoch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, epoch + 1, 0x4D4C4D])  # +1 keeps EVAL_EPOCH non-negative
    n, length = tokens.shape
    p = spec.max_predictions
    maskable = ~np.isin(tokens, _UNMASKABLE)
    n_real = maskable.sum(axis=1)
    k = np.where(n_real > 0, np.clip(np.rint(spec.mask_rate * n_real), 1, p), 0).astype(np.int64)

    keys = rng.random((n, length))
    keys[~maskable] = 2.0  # never before a maskable token
    chosen = np.argsort(keys, axis=1, kind="stable")[:, :p]
    valid = np.arange(p)[None, :] < k[:, None]
    # Sorted positions read better in a debugger and match keras-hub's layout; padding goes last.
    chosen = np.sort(np.where(valid, chosen, length), axis=1)
    valid = chosen < length
    positions = np.where(valid, chosen, 0).astype(np.int32)

    rows = np.arange(n)[:, None]
    labels = np.where(valid, tokens[rows, positions], 0).astype(np.int32)
    roll = rng.random((n, p))
    random_words = rng.integers(len(SPECIAL_TOKENS), spec.vocab_size, size=(n, p), dtype=np.int32)
    replacement = np.where(roll < 0.8, MASK_ID, np.where(roll < 0.9, random_words, labels))

    input_ids = tokens.copy()
    r, c = np.nonzero(valid)
    input_ids[r, positions[r, c]] = replacement[r, c]
    return {
        "input_ids": input_ids,
        "padding_mask": (tokens != PAD_ID).astype(np.int32),
        "mask_positions": positions,
        "mask_ids": labels,
        "mask_weights": valid.astype(np.float32),
    }
