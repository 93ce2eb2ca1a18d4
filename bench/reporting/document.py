"""The report as a list of blocks, and its Markdown rendering; html.py renders the same blocks."""
from __future__ import annotations

from dataclasses import dataclass

PLOTS_DIR = "plots"  # the figures' folder, relative to the report


@dataclass(frozen=True)
class Heading:
    text: str
    level: int


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Table:
    columns: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Image:
    path: str      # relative to the report, e.g. plots/cnn-throughput.png
    title: str
    caption: str
    png: bytes


Block = Heading | Text | Table | Image


def _cell(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def markdown_table(columns: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def to_markdown(blocks: list[Block]) -> str:
    parts = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"{'#' * block.level} {block.text}")
        elif isinstance(block, Text):
            parts.append(block.text)
        elif isinstance(block, Table):
            parts.append(markdown_table(block.columns, block.rows))
        else:
            parts.append(f"![{block.title}]({block.path})\n\n*{block.caption}*")
    return "\n\n".join(parts) + "\n"
