"""Layout names, as bench.compare --layouts and bench.parity --layouts take them, and the 1-device runs a set of
layouts is measured against.

The grammar is common.layout's, the one every tool reads (docs/layouts.md, "The grammar"). A layout runs at the
devices it implies with the same global batch as every other layout of its sweep; its reference is one device
training that global batch as the same number of accumulated micro-batches (pp<N>-nmb<K> <-> 1 device
--grad-accum K), recomputing where the layout does (-rc). Whether a layout fits a model (heads, hidden size,
vocabulary, layers, batch) is Layout.validate, which bench.run applies to every run.
"""
from __future__ import annotations

import argparse

from common.layout import Layout


def parse_layout(entry: str) -> Layout:
    """One name -> Layout; ValueError with a one-line reason for anything the grammar does not say."""
    return Layout.parse(entry)


def layout_list(text: str) -> list[Layout]:
    """argparse type for --layouts: comma-separated names, each parsed strictly, no layout twice."""
    layouts: list[Layout] = []
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


def reference_accumulations(layouts: list[Layout]) -> list[int]:
    """The 1-device runs a set of layouts is measured against, as the micro-batches each accumulates:
    one per distinct micro-batch count among the layouts."""
    return sorted({lay.accumulation() for lay in layouts})


def one_device_references(layouts: list[Layout]) -> list[tuple[Layout, int]]:
    """The 1-device runs (layout, micro-batches) a set of layouts is measured against for efficiency: one per
    distinct micro-batch count, recomputing where the layout does (common.config_key.reference_key)."""
    return sorted({(Layout(recompute=lay.recompute), lay.accumulation()) for lay in layouts},
                  key=lambda ref: (ref[0].recomputes, ref[1]))
