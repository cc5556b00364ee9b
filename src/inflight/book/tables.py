"""Small result tables for the chapters. A fixed-width `print` runs off the right edge of the page
at 1280 px; a table wraps to the column. `show_table` displays one that renders as HTML on the
website (myst-nb renders Markdown outputs as CommonMark, which has no tables), in Jupyter and on
Colab, and as Markdown text anywhere else."""
from __future__ import annotations

import html
from typing import Any, Sequence

__all__ = ["Table", "markdown_table", "show_table"]


def _cell(value: Any, fmt: str | None) -> str:
    if value is None:
        return "–"
    if fmt and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, fmt)
    return str(value).replace("\n", " ")


def _alignment(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None) -> str:
    if any(len(r) != len(header) for r in rows):
        raise ValueError("every row needs one value per column")
    if align is None:  # text left, numbers right, judged from the first row
        first = rows[0] if rows else [""] * len(header)
        align = "".join("r" if isinstance(v, (int, float)) and not isinstance(v, bool) else "l" for v in first)
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"align needs one letter, 'l' or 'r', per column; got {align!r}")
    return align


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], formats: Sequence[str | None] | None = None,
                   align: str | None = None) -> str:
    """A Markdown (GFM) table; `formats[i]` formats numbers of column i (e.g. ".2f"); `align` is one
    letter per column, "l" or "r" (default: text left, numbers right)."""
    align = _alignment(header, rows, align)
    formats = list(formats or [None] * len(header))
    rule = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(_cell(v, f).replace("|", "\\|") for v, f in zip(r, formats)) + " |" for r in rows]
    return "\n".join(lines)


class Table:
    """A table that notebooks display as HTML (website, Jupyter, Colab) and print as Markdown."""

    def __init__(self, header: Sequence[str], rows: Sequence[Sequence[Any]],
                 formats: Sequence[str | None] | None = None, align: str | None = None):
        self.header = list(header)
        self.rows = [list(r) for r in rows]
        self.align = _alignment(self.header, self.rows, align)
        self.formats = list(formats or [None] * len(self.header))

    def _repr_html_(self) -> str:
        style = {"l": "text-align: left", "r": "text-align: right"}
        head = "".join(f'<th style="{style[a]}">{html.escape(h)}</th>' for h, a in zip(self.header, self.align))
        body = "".join("<tr>" + "".join(f'<td style="{style[a]}">{html.escape(_cell(v, f))}</td>'
                                        for v, f, a in zip(r, self.formats, self.align)) + "</tr>"
                       for r in self.rows)
        return f'<table class="table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'

    def _repr_markdown_(self) -> str:
        return markdown_table(self.header, self.rows, self.formats, self.align)

    def __repr__(self) -> str:
        return self._repr_markdown_()


def show_table(header: Sequence[str], rows: Sequence[Sequence[Any]], formats: Sequence[str | None] | None = None,
               align: str | None = None) -> None:
    """Display a `Table` in a notebook (its Markdown text elsewhere)."""
    table = Table(header, rows, formats, align)
    try:
        from IPython.display import display
    except ImportError:  # pragma: no cover - outside IPython
        print(table)
        return
    display(table)
