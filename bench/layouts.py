"""Layout names, as bench.compare --layouts and bench.parity --layouts take them, and their bench.run flags.

A name is DIMS[-OPTION]..., no spaces:

  DIMS     dp<N>, fsdp<N>, tp<N>, pp<N> joined by 'x', each dimension at most once, N >= 2
           dp<N>    N data-parallel replicas (gradients all-reduced)
           fsdp<N>  the same replicas with parameters, gradients and optimizer state sharded (--optimizer-shard)
           tp<N>    tensor parallel over N devices (--model-parallel N)
           pp<N>    N pipeline stages (--pipeline-stages N)
  OPTION   mb<K>    K micro-batches per step (pipelines only; default 2 x stages)
           gpipe    all forwards, then all backwards (pipelines only; the default)
           1f1b     one forward, one backward (--pipeline-schedule 1f1b; pipelines only)
           rc       recompute layer activations in the backward pass (--recompute)
           vocab    split the token embedding and the tied MLM head over the vocabulary (--no-vocab-emb-dp;
                    needs tp)

e.g. dp2, tp2, pp2, fsdp2, dp2xtp2, pp2-mb4-1f1b, tp2-vocab-rc, fsdp2xtp2xpp2-mb8.

A layout runs at the devices it implies (dp x tp x pp) with the same global batch as every other layout
of its sweep; its reference is one device training that global batch as the same number of accumulated
micro-batches (pp<N>-mb<K> <-> 1 device --grad-accum K). This module only reads names: whether a layout
fits a model (heads, hidden size, vocabulary, layers, batch) is common/layout.py's one validation, which
bench.run applies to every run.
"""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from common.layout import SCHEDULES, Layout

DIMENSION = re.compile(r"(fsdp|dp|tp|pp)([0-9]+)")
MICRO_BATCHES = re.compile(r"mb([0-9]+)")


@dataclass(frozen=True)
class LayoutName(Layout):
    """A layout as the sweeps name it: common.layout's Layout with its canonical name and bench.run flags."""

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step: what the 1-device reference accumulates."""
        return self.micro_batches

    @property
    def name(self) -> str:
        """The canonical name: dimensions in the order dp, tp, pp, a pipeline's micro-batches, then the other
        options that differ from the defaults. A layout on one device (a reference run) is '1 device'."""
        dims = [f"{'fsdp' if self.optimizer_shard else 'dp'}{self.dp}" if self.dp > 1 or self.optimizer_shard
                else "", f"tp{self.tp}" if self.tp > 1 else "", f"pp{self.pp}" if self.pp > 1 else ""]
        options = [f"mb{self.micro_batches}" if self.pp > 1 else "",
                   "1f1b" if self.schedule == "1f1b" else "", "rc" if self.recompute else "",
                   "" if self.vocab_emb_dp else "vocab"]
        head = "x".join(d for d in dims if d) or "1 device"
        return "-".join([head, *(o for o in options if o)])

    def run_flags(self) -> list[str]:
        """bench.run's layout flags for this layout (the defaults left out; --devices is the caller's)."""
        return [token for flag in self.non_default_flags() for token in flag.split()]

    @classmethod
    def from_record(cls, layout: dict) -> LayoutName:
        """The layout a run record's `layout` object describes."""
        return cls(**{k: layout[k] for k in cls.__dataclass_fields__ if k in layout})


def _size(text: str, what: str, entry: str, low: int) -> int:
    value = int(text)
    if value < low or text != str(value):
        raise ValueError(f"{entry!r}: {what} must be an integer >= {low} without leading zeros, got {text}")
    return value


def _option(entry: str, option: str) -> tuple[str, object]:
    """One option -> (LayoutName field, value)."""
    match = MICRO_BATCHES.fullmatch(option)
    if match:
        return "micro_batches", _size(match.group(1), "mb", entry, 1)
    if option in SCHEDULES:
        return "schedule", option
    if option in ("rc", "vocab"):
        return ("recompute", True) if option == "rc" else ("vocab_emb_dp", False)
    raise ValueError(f"{entry!r}: unknown option {option!r}; choose from mb<K>, gpipe, 1f1b, rc, vocab")


def parse_layout(entry: str) -> LayoutName:
    """One name -> LayoutName; ValueError with a one-line reason for anything the grammar does not say."""
    head, *options = entry.split("-")
    dims: dict[str, int] = {}
    for part in head.split("x"):
        match = DIMENSION.fullmatch(part)
        if not match:
            raise ValueError(f"{entry!r}: {part!r} is not dp<N>, fsdp<N>, tp<N> or pp<N>")
        kind, size = match.group(1), _size(match.group(2), f"{match.group(1)} size", entry, 2)
        dim = "dp" if kind == "fsdp" else kind
        if dim in dims:
            raise ValueError(f"{entry!r}: the {dim} dimension is given twice")
        dims[dim] = size
        if kind == "fsdp":
            dims["fsdp"] = 1
    fields = {"dp": dims.get("dp", 1), "tp": dims.get("tp", 1), "pp": dims.get("pp", 1),
              "optimizer_shard": "fsdp" in dims}
    for option in options:
        key, value = _option(entry, option)
        if key in fields:
            raise ValueError(f"{entry!r}: {option!r} repeats an option already given")
        if key in ("micro_batches", "schedule") and fields["pp"] == 1:
            raise ValueError(f"{entry!r}: {option!r} needs a pipeline (pp<N>)")
        if key == "vocab_emb_dp" and fields["tp"] == 1:
            raise ValueError(f"{entry!r}: 'vocab' splits the vocabulary over tensor parallel: it needs tp<N>")
        fields[key] = value
    if fields["pp"] > 1:
        fields.setdefault("micro_batches", 2 * fields["pp"])
    return LayoutName(**fields)


def layout_list(text: str) -> list[LayoutName]:
    """argparse type for --layouts: comma-separated names, each parsed strictly, no layout twice."""
    layouts: list[LayoutName] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            raise argparse.ArgumentTypeError(f"empty entry in {text!r}")
        try:
            layout = parse_layout(entry)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if layout in layouts:
            raise argparse.ArgumentTypeError(f"{entry!r} is the same layout as {layout.name!r}, given before")
        layouts.append(layout)
    return layouts


layout_list.__name__ = "layout list"  # argparse names the type in its error: "invalid layout list value"


def reference_accumulations(layouts: list[LayoutName]) -> list[int]:
    """The 1-device runs a set of layouts is measured against, as the micro-batches each accumulates:
    one per distinct micro-batch count among the layouts."""
    return sorted({lay.accumulation for lay in layouts})
