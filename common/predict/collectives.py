"""The cost of one collective on one link level (Hockney's alpha-beta model, nccl-tests' bus-bandwidth factors:
doc/PERFORMANCE.md), and the link a group crosses in common.layout's rank order; docs/prediction.md, "Communication"."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from common.layout import Layout
from common.predict.hardware import GB, Link

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv")


def bus_factor(kind: str, ranks: int) -> float:
    """Bytes through each rank's link per byte of the collective's buffer (nccl-tests' busbw factor)."""
    if kind == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if kind in ("reduce_scatter", "all_gather", "all_to_all"):
        return (ranks - 1) / ranks
    if kind in ("broadcast", "send_recv"):
        return 1.0
    raise ValueError(f"unknown collective kind {kind!r}")


def message_steps(kind: str, ranks: int) -> int:
    """Latency-bound message steps of a ring (one for a point-to-point send)."""
    if kind == "all_reduce":
        return 2 * (ranks - 1)
    if kind in ("reduce_scatter", "all_gather", "all_to_all", "broadcast"):
        return ranks - 1
    return 1


def cost_s(kind: str, nbytes: float, ranks: int, link: Link) -> float:
    """Seconds for one collective of `nbytes` (the whole buffer) over `ranks` on `link`."""
    if ranks < 2 or nbytes <= 0:
        return 0.0
    return message_steps(kind, ranks) * link.latency_s + bus_factor(kind, ranks) * nbytes / (link.busbw(kind) * GB)


def group_stride(layout: Layout, dim: str) -> int:
    """Rank distance between neighbours along a dimension of common.layout's RANK_ORDER (tp innermost, then cp,
    fsdp, dp, pp outermost); `data` is every rank that splits the batch (dp x fsdp, contiguous)."""
    tp, cp = layout.tp, layout.cp
    return {"tp": 1, "cp": tp, "fsdp": tp * cp, "data": tp * cp, "dp": tp * cp * layout.fsdp,
            "pp": tp * cp * layout.data}[dim]


def crosses_nodes(layout: Layout, dim: str, devices_per_node: int, ranks: int | None = None) -> bool:
    """Whether a group of `ranks` (default: the whole dimension) along `dim` spans more than one node."""
    if ranks is None:
        ranks = layout.data if dim == "data" else getattr(layout, dim)
    return ranks > 1 and ranks * group_stride(layout, dim) > devices_per_node


@dataclass(frozen=True)
class Collective:
    """One kind of collective a rank issues per step: bytes of each call's whole buffer and how many calls,
    over which mesh dimension; `exposed`: on the step's critical path (not hidden behind compute)."""
    kind: str
    dim: str            # its group's mesh dimension: tp, dp or pp ("tie": the tied embedding's pair; "all": every
                        # device, for collectives a compiler placed, whose groups a record does not say)
    nbytes: float       # per call
    calls: int
    ranks: int
    exposed: bool
    what: str

    @property
    def total_bytes(self) -> float:
        return self.nbytes * self.calls


def per_kind(collectives: Iterable[Collective]) -> dict[str, dict[str, int]]:
    """Per kind, the calls and bytes in a step of these collectives, summed as a run's comm_per_step sums what
    one rank issued (backends/torch_common/comm.py's CommCounter)."""
    found: dict[str, dict[str, int]] = {}
    for c in collectives:
        kind = found.setdefault(c.kind, {"bytes": 0, "calls": 0})
        kind["bytes"] += int(round(c.total_bytes))
        kind["calls"] += c.calls
    return found
