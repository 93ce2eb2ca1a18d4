"""The final parameters as bench.parity holds a layout against one device: per canonical weight name
(common.initial_weights), the L2 norm and the sum of the whole, unsharded weight. Two numbers per weight
keep a record small whatever the model, and a lost shard, a doubled gradient or a wrong split moves both."""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

FIELD = "final_params"  # the key in a record's backend_metrics
# A weight whose reference L2 norm is below this is not compared: e.g. the attention key biases, whose
# gradient is zero in exact arithmetic (softmax ignores a shift shared by every key), so that only rounding
# moves them (AdamW turns rounding-sized gradients into lr-sized steps): their change is pure noise.
NOISE_NORM = 1e-3


def summarise(weights: Iterable[tuple[str, np.ndarray]]) -> dict[str, dict[str, float]]:
    """(canonical name, whole weight) pairs -> {name: {"norm": L2 norm, "sum": sum of elements, "size"}},
    in float64."""
    out = {}
    for name, weight in weights:
        flat = np.asarray(weight, dtype=np.float64).ravel()
        out[name] = {"norm": float(np.linalg.norm(flat)), "sum": float(flat.sum()), "size": int(flat.size)}
    return out


def compared(reference: dict[str, float]) -> bool:
    """Whether training set this weight (not only rounding): see NOISE_NORM."""
    return reference["norm"] >= NOISE_NORM


def deviation(reference: dict[str, float], other: dict[str, float]) -> float:
    """How far one weight's summary is from the reference's, relative to the weight's norm. The sum's
    difference is divided by sqrt(size) x norm, a bound on |d sum| for a relative L2 change of 1
    (Cauchy-Schwarz): relative to the sum itself, a large matrix whose elements nearly cancel would turn
    rounding into a large relative error."""
    scale = reference["norm"]
    worst = abs(other["norm"] - reference["norm"]) / scale
    if reference.get("size"):
        worst = max(worst, abs(other["sum"] - reference["sum"]) / (np.sqrt(reference["size"]) * scale))
    return float(worst)
