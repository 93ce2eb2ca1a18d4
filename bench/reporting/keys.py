"""Which fields of the configuration key (common.config_key) a table or a legend must show to tell its rows apart,
and the sentence that says the others once.

A field is shown where it varies between rows of one backend on one machine; host and device kind whenever
there is more than one, since runs on different machines are never comparable. A field that never varies is
said once ("Same in every row"); one that varies only with the backend or the machine is said once per backend.
"""
from __future__ import annotations

import re
from collections import defaultdict

from common.config_key import FIELD_HEADERS, ConfigKey, config_key, describe, sweep_of

# In the order a label names them; `sweep` is not in the key but tells rows of different sweeps apart.
LABEL_FIELDS = ("host", "device_kind", "model_size", "precision", "batch", "micro_batches", "layout", "compile",
                "mode", "threads_per_device", "scaling", "data", "sweep")
HEADERS = {**FIELD_HEADERS, "sweep": "sweep"}
MACHINE = ("host", "device_kind")
UNKNOWN = "?"


def describe_sweep(sweep_id: str) -> str:
    return sweep_id.removeprefix("sweep-") if sweep_id else "no sweep"


def key_cells(key: ConfigKey) -> dict[str, str]:
    """A key's fields as a reader sees them."""
    return {name: describe(key, name) for name in FIELD_HEADERS}


def cells(record: dict) -> dict[str, str]:
    """A record's key fields and sweep as a reader sees them."""
    return {**key_cells(config_key(record)), "sweep": describe_sweep(sweep_of(record))}


def in_label(name: str, value: str) -> str:
    """A field's value in a legend, where no column header says what a bare number is."""
    if name == "micro_batches":
        return f"{value} micro-batch{'' if value == '1' else 'es'}"
    if name in ("threads_per_device", "layout", "sweep"):
        return f"{HEADERS[name]} {value}"
    return value


def order(row: dict[str, str]) -> tuple:
    """Rows sorted by backend, then the label's fields, numbers as numbers ('32 global' before '256 global')."""
    return tuple(tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", row[f]))
                 for f in ("backend", *LABEL_FIELDS))


def row_labels(keys: list[ConfigKey]) -> list[str]:
    """For rows of several keys: the backend and the fields that tell the keys apart, e.g. 'torch_ddp · amp'."""
    rows = [key_cells(k) for k in keys]
    fields = distinguishing(rows, LABEL_FIELDS[:-1])
    return [" · ".join([r["backend"], *(in_label(f, r[f]) for f in fields)]) for r in rows]


def distinguishing(rows: list[dict[str, str]], candidates=LABEL_FIELDS) -> list[str]:
    """The fields among `candidates` that vary between `rows` of one backend and machine (module docstring). An
    unknown value (a run that ended before it was known) tells nothing apart."""
    machine = [f for f in MACHINE if f in candidates and len({r[f] for r in rows if r[f] != UNKNOWN}) > 1]
    chosen = []
    for name in candidates:
        seen: dict[tuple, set] = defaultdict(set)
        for r in rows:
            if r[name] != UNKNOWN:
                seen[tuple(r[f] for f in ("backend", *machine) if f != name)].add(r[name])
        if name in machine or any(len(values) > 1 for values in seen.values()):
            chosen.append(name)
    return chosen


def said_once(rows: list[dict[str, str]], shown: list[str], candidates=LABEL_FIELDS, what: str = "row") -> str:
    """The sentence for the fields not shown: those the same in every row, then those that follow the backend."""
    same, by_backend = [], defaultdict(list)
    for name in (f for f in candidates if f not in shown):
        values = {r[name] for r in rows}
        if len(values) == 1:
            same.append(f"{HEADERS[name]} {next(iter(values))}")
            continue
        for backend in sorted({r["backend"] for r in rows}):
            mine = {r[name] for r in rows if r["backend"] == backend}
            by_backend[backend].append(f"{HEADERS[name]} {' / '.join(sorted(mine))}")
    parts = [f"Same in every {what}: {', '.join(same)}."] if same else []
    parts += [f"{backend}: {', '.join(fields)}." for backend, fields in by_backend.items()]
    return " ".join(parts)
