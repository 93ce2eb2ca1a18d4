"""The report as one self-contained HTML file: figures inlined as data URIs, CSS inline, no external assets."""
from __future__ import annotations

import base64
import html

from bench.reporting.document import Block, Heading, Image, Table, Text

# Tables fit the window (a browser check holds them to it: bench.reporting.browser): cells wrap, long words
# (run ids, package lists, paths in an error) break anywhere, headers wrap between words.
CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1400px; padding: 0 1rem; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.78rem; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.3rem; text-align: left; vertical-align: top;
         overflow-wrap: break-word; }
th { background: #f2f2f2; }
tr.failed td, tr.unsupported td, tr.invalid td { background: #fff4f4; }
figure { margin: 1rem 0 2rem; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85rem; color: #555; }
code { background: #f5f5f5; padding: 0 0.2rem; }
"""


def _inline(text: str) -> str:
    """The Markdown the blocks use inline (`code` only), as HTML."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _table(block: Table) -> str:
    status = block.columns.index("status") if "status" in block.columns else None
    # A header may break after an underscore (masked_accuracy): a word as wide as the column is not.
    head = "".join(f"<th>{html.escape(c).replace('_', '_<wbr>')}</th>" for c in block.columns)
    rows = []
    for row in block.rows:
        css = f' class="{html.escape(row[status])}"' if status is not None else ""
        rows.append(f"<tr{css}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _image(block: Image) -> str:
    uri = "data:image/png;base64," + base64.b64encode(block.png).decode("ascii")
    return (f'<figure><img alt="{html.escape(block.title)}" src="{uri}">'
            f"<figcaption>{_inline(block.caption)}</figcaption></figure>")


def to_html(blocks: list[Block], title: str) -> str:
    body = []
    for block in blocks:
        if isinstance(block, Heading):
            body.append(f"<h{block.level}>{_inline(block.text)}</h{block.level}>")
        elif isinstance(block, Text):
            body.append(f"<p>{_inline(block.text)}</p>")
        elif isinstance(block, Table):
            body.append(_table(block))
        else:
            body.append(_image(block))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
