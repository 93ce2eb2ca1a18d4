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


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$")
_OP = re.compile(r"^\s+(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*.*?\s(?P<op>[a-z][a-z0-9\-_]*)\((?P<rest>.*)$")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_PLUMBING = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "reshape"}


def describe(hlo_text: str) -> dict[str, str]:
    """Every instruction of the program -> `name [opcodes it runs] @name scope`: a fusion's opcodes are those of
    the computations it calls (plumbing left out), its scope the Keras/JAX name scope XLA kept in its metadata.
    What a profile's events name (their `hlo_op`), described for backends.keras_jax.profile.RULES."""
    computations: dict[str, list[tuple[str, str, list[str], str]]] = {}
    current: list | None = None
    for line in hlo_text.splitlines():
        head = _COMPUTATION.match(line)
        if head and not line.startswith(" "):
            current = computations.setdefault(head["name"], [])
            continue
        op = _OP.match(line)
        if op and current is not None:
            scope = _OP_NAME.search(op["rest"])
            current.append((op["name"], op["op"], _CALLS.findall(op["rest"]), scope[1] if scope else ""))

    def opcodes(computation: str, seen: frozenset = frozenset()) -> set[str]:
        out = set()
        for _, opcode, calls, _ in computations.get(computation, []):
            if opcode not in _PLUMBING:
                out.add(opcode)
            out |= set().union(*(opcodes(c, seen | {computation}) for c in calls if c not in seen))
        return out

    described = {}
    for instructions in computations.values():
        for name, opcode, calls, scope in instructions:
            inner = set().union(*(opcodes(c) for c in calls)) if calls else {opcode}
            described[name] = f"{name} [{','.join(sorted(inner))}] @{scope}"
    return described
