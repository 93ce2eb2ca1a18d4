"""Every layout of N devices that a backend can execute: the space bench.plan searches for the executed workloads,
each kept as the layout grammar, Layout.validate and the backend decide (docs/plan.md, "What is enumerated")."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from itertools import combinations, product

from common.errors import BadInput
from common.layout import Layout
from common.plan.fit import stage_split_of
from common.spec import BertSpec, CnnSpec
from common.stage_split import AUTO, EVEN

Refuse = Callable[[Layout], "str | None"]
MAX_PLACEMENTS = 16


@dataclass
class Space:
    valid: list[Layout] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)          # why -> candidates refused for it
    auto: dict[Layout, list[int]] = field(default_factory=dict)    # layouts whose split is what auto picks

    def refuse(self, why: str) -> None:
        self.refused[why] = self.refused.get(why, 0) + 1


def meshes(devices: int) -> list[tuple[int, int, int]]:
    """Every (data ranks, tp, pp) with their product = devices."""
    return [(dp, tp, devices // (dp * tp)) for dp in divisors(devices) for tp in divisors(devices // dp)]


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@lru_cache(maxsize=64)
def placements(layers: int, stages: int) -> tuple[str, ...]:
    """Every contiguous placement of `layers` on `stages`, each stage >= 1 layer, as --stage-split counts."""
    return tuple(",".join(str(b - a) for a, b in zip((0, *cuts), (*cuts, layers)))
                 for cuts in combinations(range(1, layers), stages - 1))


def _bases(mesh: tuple[int, int, int], global_batch: int, micro_batches: Sequence[int] | None) -> Iterator[Layout]:
    """Every combination for one mesh of the options the executed workloads' step model costs
    (common.predict.executed.MODELLED), but the stage split (placed after)."""
    data, tp, pp = mesh
    domain: dict[str, Sequence] = {
        "micro_batches": sorted(set(micro_batches or divisors(global_batch))) if pp > 1 else (1,),
        "schedule": ("gpipe", "1f1b") if pp > 1 else ("gpipe",),
        "recompute": ("none", "full"),
        "vocab_split": (False, True) if tp > 1 else (False,)}
    for fsdp in sorted({1, data}):
        for zero2, combo in product((False, True) if fsdp > 1 else (False,), product(*domain.values())):
            yield Layout(dp=data // fsdp, fsdp=fsdp, tp=tp, pp=pp, zero2=zero2, **dict(zip(domain, combo)))


def splits(spec: BertSpec | CnnSpec, pp: int) -> list[str]:
    """The stage splits tried for `pp` stages: even, auto, and every contiguous placement while there are at most
    MAX_PLACEMENTS of them (base BERT's 12 layers on 4 stages have 165: then even and auto only)."""
    if pp == 1 or not isinstance(spec, BertSpec) or pp > spec.layers:
        return [EVEN]
    few = math.comb(spec.layers - 1, pp - 1) <= MAX_PLACEMENTS
    return [EVEN, AUTO, *(placements(spec.layers, pp) if few else ())]


def nameable(layout: Layout) -> bool:
    """Whether a layout name says exactly this layout (so bench.compare --layouts runs it)."""
    try:
        return Layout.parse(layout.name) == layout
    except ValueError:
        return False


def placement(spec: BertSpec | CnnSpec, layout: Layout, global_batch: int) -> tuple[int, ...] | None:
    split = stage_split_of(spec, layout, global_batch)
    return tuple(split) if split else None


def _preference(layout: Layout) -> int:
    """Among splits placing the same layers: even (no option in the name), then counts, then auto."""
    return 0 if layout.stage_split == EVEN else 2 if layout.stage_split == AUTO else 1


def enumerate_layouts(spec: BertSpec | CnnSpec, devices: int, global_batch: int,
                      micro_batches: Sequence[int] | None = None, refuse: Refuse | None = None) -> Space:
    """The valid layouts of `devices` for the model and global batch, the refused ones with the reason."""
    kept: dict[tuple, Layout] = {}
    space = Space()
    for mesh in meshes(devices):
        for base in _bases(mesh, global_batch, micro_batches):
            for split in splits(spec, base.pp):
                layout = replace(base, stage_split=split)
                if not nameable(layout):
                    continue
                try:
                    layout.validate(spec, global_batch)
                except BadInput as exc:
                    space.refuse(str(exc))
                    if split == EVEN:  # nothing in the layout but its split: no other split helps
                        break
                    continue
                placed = placement(spec, layout, global_batch)
                key = (*(getattr(layout, f.name) for f in fields(Layout) if f.name != "stage_split"), placed)
                if split == AUTO:
                    space.auto[key] = list(placed or ())
                if key not in kept or _preference(layout) < _preference(kept[key]):
                    kept[key] = layout
    for layout in kept.values():
        why = refuse(layout) if refuse else None
        if why:
            space.refuse(why)
        else:
            space.valid.append(layout)
    space.auto = {kept[key]: split for key, split in space.auto.items() if kept[key] in space.valid}
    return space
