"""The collectives of a compiled XLA program, read from its HLO text: what GSPMD decided to send.

Each collective instruction is counted once per execution of the program (the step has no loops: its
micro-batches are unrolled). Bytes follow torch_common.comm's convention, so the two frameworks' columns
compare: the larger buffer of the instruction on one device (an all-reduce's tensor, a reduce-scatter's
whole input, an all-gather's gathered output, a collective-permute's tensor).
"""
from __future__ import annotations

import re
from collections import defaultdict

KINDS = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
         "collective-permute": "send_recv", "all-to-all": "all_to_all"}
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_INSTRUCTION = re.compile(r"=\s*(?P<result>.*?)\s(?P<op>" + "|".join(KINDS) + r")(?P<start>-start)?\((?P<args>.*?)\)"
                          r"(?:,|$)")
_SHAPE = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")


def _bytes(text: str) -> int:
    total = 0
    for dtype, dims in _SHAPE.findall(text):
        size = _BYTES.get(dtype)
        if size is None:
            continue
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        total += size * count
    return total


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """{kind: {"bytes", "calls"}} of one execution of the program, kinds as common.sections.COMM_KINDS."""
    found: dict[str, dict[str, int]] = defaultdict(lambda: {"bytes": 0, "calls": 0})
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.search(line)
        if not match:
            continue
        result, operands = _bytes(match["result"]), _bytes(match["args"])
        if match["start"]:
            # An asynchronous start returns its operands with its outputs; the outputs are the rest.
            result = max(result - operands, 0)
        kind = found[KINDS[match["op"]]]
        kind["bytes"] += max(result, operands)
        kind["calls"] += 1
    return dict(found)
