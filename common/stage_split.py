"""Which encoder layers each pipeline stage holds: evenly, as given, or balanced by a per-stage cost (forward and
backward FLOPs plus the optimizer's work on the parameters it holds). The first stage also holds the embeddings,
the last the head and its copy of the tied token table, so an even cut leaves the last stage the slowest."""
from __future__ import annotations

from itertools import combinations

from common.spec import BertSpec

EVEN, AUTO = "even", "auto"
# The optimizer's (and a dense embedding gradient's) work per parameter per step, in matmul FLOPs that take
# as long: AdamW is memory bound, a handful of reads and writes per parameter. Measured here (one core,
# loaded machine): 13.9 ns per parameter for torch's AdamW over 8.5M parameters against 29.7 ps per FLOP of a
# 512^3 float32 matmul, ~470 FLOPs. On a GPU the ratio is higher (HBM against tensor cores: ~10^4): it moves
# a split only where stages hold very different parameter counts, i.e. the embedding tables.
OPTIMIZER_FLOPS_PER_PARAM = 500


def parse_split(text: str) -> str:
    """A --stage-split value in its canonical form: "even", "auto" or layers per stage ("3,1"); ValueError
    with a one-line reason otherwise."""
    text = text.strip().lower()
    if text in (EVEN, AUTO):
        return text
    parts = text.replace("+", ",").split(",")
    if not all(p.isdigit() and int(p) >= 1 and p == str(int(p)) for p in parts) or len(parts) < 2:
        raise ValueError(f"{text!r} is not even, auto or layers per stage (e.g. 3,1), each >= 1")
    return ",".join(parts)


def stage_costs(spec, counts: list[int], samples: int) -> list[float]:
    """Per stage, the FLOP-equivalents of one step of `samples` sequences (the module's cost), of the BERT MLM or a
    decoder (common.predict.decoder.DecoderSpec: the lm workload)."""
    def cost(flops_per_sample: int, params: int) -> float:
        return 6 * flops_per_sample * samples + OPTIMIZER_FLOPS_PER_PARAM * params

    costs = [cost(n * spec.layer_forward_macs(), n * spec.layer_params()) for n in counts]
    costs[0] += cost(0, spec.embedding_params())  # lookups: no matmul, but a dense gradient and its update
    tied_copy = tied_table(spec) if len(counts) > 1 else 0
    costs[-1] += cost(spec.head_forward_macs(), spec.head_params() + tied_copy)
    return costs


def tied_table(spec) -> int:
    """Elements of the token table whose copy the last stage holds for a tied output layer (the MLM's decoder, a
    tied decoder LM's; an untied one's output layer is in its head_params)."""
    if isinstance(spec, BertSpec):
        return spec.vocab_size * spec.hidden
    return spec.vocab * spec.hidden if spec.tied_embeddings else 0


def balanced_split(spec: BertSpec, stages: int, samples: int) -> list[int]:
    """Layers per stage (contiguous, each >= 1) whose costliest stage costs least; among equals, the one
    nearest to even."""
    layers = spec.layers
    best = None
    for cuts in combinations(range(1, layers), stages - 1):
        counts = [b - a for a, b in zip((0, *cuts), (*cuts, layers))]
        key = (max(stage_costs(spec, counts, samples)), sum((c - layers / stages) ** 2 for c in counts))
        if best is None or key < best[0]:
            best = (key, counts)
    return best[1]


def even_split(layers: int, stages: int) -> list[int]:
    """Contiguous layers per stage, the last stage taking any remainder (the MindSpore tutorial's rule)."""
    per_stage = max((layers + 1) // stages, 1)
    starts = [min(s * per_stage, layers) for s in range(stages)] + [layers]
    return [end - start for start, end in zip(starts, starts[1:])]


def layers_per_stage(split: str, spec: BertSpec, stages: int, samples: int) -> list[int]:
    if split == EVEN:
        return even_split(spec.layers, stages)
    if split == AUTO:
        return balanced_split(spec, stages, samples)
    return [int(n) for n in split.split(",")]
