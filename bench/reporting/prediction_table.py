"""The table bench.predict prints: one row per layout and device count, a layout it cannot predict saying why."""
from __future__ import annotations

from collections.abc import Callable

from rich.markup import escape
from rich.table import Table


def prediction_table(title: str, caption: str, columns: tuple[str, ...], rows: list[dict],
                     cells: Callable[[dict], list[str]]) -> Table:
    """`cells(row)` gives a predicted row's cells after its layout and device count; an invalid row has its reason
    in the last column."""
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for column in ("layout", "N", *columns):
        table.add_column(column, overflow="fold")
    for r in rows:
        rest = [""] * (len(columns) - 1) + [escape(r["invalid"])] if "invalid" in r else cells(r)
        table.add_row(r["layout"], str(r["devices"]), *rest)
    return table
