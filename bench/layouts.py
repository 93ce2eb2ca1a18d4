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
           split<S> encoder layers per pipeline stage (--stage-split; pipelines only): splitauto balances the
                    stages by cost, split3+1 gives the counts ('+' for the flag's ',')

e.g. dp2, tp2, pp2, fsdp2, dp2xtp2, pp2-mb4-1f1b, pp2-mb4-1f1b-splitauto, tp2-vocab-rc, fsdp2xtp2xpp2-mb8.

A layout runs at the devices it implies (dp x tp x pp) with the same global batch as every other layout
of its sweep; its reference is one device training that global batch as the same number of accumulated
micro-batches (pp<N>-mb<K> <-> 1 device --grad-accum K), recomputing where the layout does (-rc). This
module only reads names: whether a layout fits a model (heads, hidden size, vocabulary, layers, batch) is
common/layout.py's one validation, which bench.run applies to every run. The words and flags themselves are
declared once, in common.layout.OPTIONS.
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
                  key=lambda ref: (ref[0].recompute, ref[1]))
