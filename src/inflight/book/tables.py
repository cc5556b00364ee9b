"""Small result tables for the chapters, shown as Markdown so they wrap to the page's column
(a fixed-width `print` runs off the right edge at 1280 px) and render the same in Jupyter and Colab."""
from __future__ import annotations

from typing import Any, Sequence

__all__ = ["markdown_table", "show_table"]


def _cell(value: Any, fmt: str | None) -> str:
    if value is None:
        return "–"
    if fmt and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, fmt)
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], formats: Sequence[str | None] | None = None,
                   align: str | None = None) -> str:
    """A Markdown table; `formats[i]` formats numbers of column i (e.g. ".2f"); `align` is one letter per
    column, "l" or "r" (default: text left, numbers right, judged from the first row)."""
    if any(len(r) != len(header) for r in rows):
        raise ValueError("every row needs one value per column")
    formats = list(formats or [None] * len(header))
    if align is None:
        first = rows[0] if rows else [""] * len(header)
        align = "".join("r" if isinstance(v, (int, float)) and not isinstance(v, bool) else "l" for v in first)
    rule = ["---:" if a == "r" else ":---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(_cell(v, f) for v, f in zip(r, formats)) + " |" for r in rows]
    return "\n".join(lines)


def show_table(header: Sequence[str], rows: Sequence[Sequence[Any]], formats: Sequence[str | None] | None = None,
               align: str | None = None) -> None:
    """Display `markdown_table(...)` in a notebook (plain text elsewhere)."""
    text = markdown_table(header, rows, formats, align)
    try:
        from IPython.display import Markdown, display
    except ImportError:  # pragma: no cover - outside IPython
        print(text)
        return
    display(Markdown(text))
