"""Layout names at a device count, for bench.predict: common.layout's grammar (Layout.parse), plus a bare `dp`
or `fsdp` dimension meaning "the devices the other dimensions leave" (dp, fsdp, tp2xdp, fsdpxtp8xpp4-1f1b).
A name with no data-parallel dimension at all gets the devices left as plain data parallel (pp4-1f1b at 8
devices: dp2 x pp4)."""
from __future__ import annotations

from dataclasses import replace

from common.layout import Layout

BARE = ("dp", "fsdp")


def check_name(entry: str) -> None:
    """ValueError (one line, Layout.parse's) when a name breaks the grammar, whatever the device count."""
    head, sep, options = entry.partition("-")
    Layout.parse("x".join(f"{p}2" if p in BARE else p for p in head.split("x")) + sep + options)


def at_devices(entry: str, devices: int) -> Layout:
    """The layout `entry` names at `devices` devices; ValueError in one line when it cannot fill them."""
    head, sep, options = entry.partition("-")
    bare = [p for p in head.split("x") if p in BARE]
    shard = "fsdp" in bare
    if bare:
        rest = [p for p in head.split("x") if p not in BARE]
        if not rest:  # dp or fsdp alone: Layout.parse needs one dimension, and a size >= 2
            layout = Layout(dp=devices, optimizer_shard=shard)
            return _checked(entry, replace(layout, **_options(options)), devices)
        head = "x".join(rest)
    layout = Layout.parse(head + sep + options)
    if bare or layout.dp == 1:
        taken = layout.tp * layout.pp
        if devices % taken:
            raise ValueError(f"{entry!r} at {devices} devices: tp x pp = {taken} does not divide them")
        layout = replace(layout, dp=devices // taken, optimizer_shard=layout.optimizer_shard or shard)
    return _checked(entry, layout, devices)


def _options(options: str) -> dict:
    """The options part of a name with no other dimension (dp-rc): parsed through a one-dimension name."""
    if not options:
        return {}
    probe = Layout.parse("dp2-" + options)
    return {k: getattr(probe, k) for k in ("recompute",)}


def _checked(entry: str, layout: Layout, devices: int) -> Layout:
    if layout.devices != devices:
        raise ValueError(f"{entry!r} uses {layout.devices} devices, not {devices}")
    return layout
