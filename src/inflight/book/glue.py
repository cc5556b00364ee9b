"""`glue` for every place a chapter runs: the book build, plain Jupyter and Colab.

In the book build, myst-nb's `glue` stores a value in the notebook's outputs and the page's
`{glue:text}` roles paste it into the prose. Colab and a plain Jupyter install have no myst-nb, so
the chapters import `glue` from here instead: it hands the value to myst-nb when myst-nb is
installed (the book's output is exactly what it was), and in every runtime it also records the
value in `GLUED`, this kernel's registry. The learner notebooks turn each paragraph that quotes a
glued number into a small hidden code cell that calls `show_markdown`, which fills the numbers in
from that registry — so a reader on Colab sees the numbers measured on *their* machine.

Formatting follows myst-nb's `{glue:text}` role to the letter: the value's `text/plain`
representation, read back as a Python literal where it is one, then `format(value, spec)`.
"""
from __future__ import annotations

import re
from ast import literal_eval
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable


@dataclass(frozen=True)
class Glued:
    """One glued value and the `text/plain` form the book formats it from."""

    value: Any
    text: str


GLUED: dict[str, Glued] = {}
"""Every value glued in this kernel so far, by name (the last glue of a name wins)."""

UNKNOWN = "…"
UNKNOWN_NOTE = ("*{mark} marks a number this notebook has not measured yet: it appears here as soon as "
                "the cell that measures it has run (run the cells above, or the ones after this).*")
NOT_RUN_NOTE = "*Each {mark} stands for a number this notebook measures on your machine: run it to fill them in.*"

# `{{name}}` or `{{name:format spec}}` in the learner's text cells; `{{!name}}` on a line of its
# own displays the glued object itself (a figure, say), as the `{glue}` directive does.
PLACEHOLDER = re.compile(r"\{\{(?P<display>!?)(?P<ref>[^{}\s]+)\}\}")


@lru_cache(maxsize=1)
def _myst_nb_glue() -> Callable[..., None] | None:
    try:
        from myst_nb import glue as myst_glue
    except ImportError:  # Colab, plain Jupyter: no book tooling, and none is needed
        return None
    return myst_glue


def _plain_text(value: Any) -> str:
    """The value's `text/plain` representation, as IPython (and so myst-nb) computes it."""
    try:
        from IPython.core.formatters import format_display_data
    except ImportError:
        return repr(value)
    data, _metadata = format_display_data(value)
    return data.get("text/plain", repr(value))


def glue(name: str, value: Any, display: bool = True) -> None:
    """Record `value` under `name` for the text (and for the book's `{glue:text}` roles).

    With `display=True` the value is also shown, as myst-nb's `glue` shows it.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"glue name must be a non-empty string, got {name!r}")
    GLUED[name] = Glued(value, _plain_text(value))
    myst_glue = _myst_nb_glue()
    if myst_glue is not None:
        myst_glue(name, value, display)
    elif display:
        _display(value)
    _update_waiting(name)


def _display(value: Any) -> None:
    try:
        from IPython.display import display as ipy_display
    except ImportError:
        print(_plain_text(value))
    else:
        ipy_display(value)


def format_text(text: str, spec: str) -> str:
    """Format a `text/plain` value with a format spec, exactly as myst-nb's `{glue:text}` does."""
    try:
        value: Any = literal_eval(text)
    except (SyntaxError, ValueError):
        value = text
    if spec == "":
        return str(value)
    kind = spec[-1]
    if kind == "s":
        value = str(value)
    elif kind in "bcdoxX":
        value = int(value)
    elif kind in "eEfFgGn%":
        value = float(value)
    return format(value, spec)


def split_ref(ref: str) -> tuple[str, str]:
    """`"name:.2f"` -> `("name", ".2f")`; a bare name gets myst-nb's default spec, `"s"`."""
    name, sep, spec = ref.rpartition(":")
    return (name, spec) if sep else (ref, "s")


def fill(template: str, glued: dict[str, Glued] | None = None) -> tuple[str, list[str]]:
    """The template with each inline `{{name:spec}}` replaced by its value; also the missing names.

    A name not glued yet (or a value its spec cannot format) becomes `UNKNOWN`.
    """
    glued = GLUED if glued is None else glued
    missing: list[str] = []

    def one(match: re.Match) -> str:
        name, spec = split_ref(match["ref"])
        item = glued.get(name)
        if item is not None:
            try:
                return format_text(item.text, spec)
            except (TypeError, ValueError):
                pass
        missing.append(name)
        return UNKNOWN

    return PLACEHOLDER.sub(one, template), missing


def render(template: str, glued: dict[str, Glued] | None = None,
           note: str | None = UNKNOWN_NOTE) -> list[tuple[str, Any]]:
    """The pieces `show_markdown` displays: ("markdown", text) and ("object", value) in order,
    then `note` (if any) when a value was missing."""
    glued = GLUED if glued is None else glued
    pieces: list[tuple[str, Any]] = []
    missing: list[str] = []
    text_lines: list[str] = []

    def flush() -> None:
        if text_lines:
            text, gone = fill("".join(text_lines), glued)
            missing.extend(gone)
            pieces.append(("markdown", text))
            text_lines.clear()

    for line in template.strip("\n").splitlines(keepends=True):
        block = PLACEHOLDER.fullmatch(line.strip())
        if block and block["display"]:
            flush()
            item = glued.get(block["ref"])
            if item is None:
                missing.append(block["ref"])
                pieces.append(("markdown", UNKNOWN))
            else:
                pieces.append(("object", item.value))
        else:
            text_lines.append(line)
    flush()
    if missing and note:
        pieces.append(("markdown", note.format(mark=UNKNOWN)))
    return pieces


@dataclass
class _Waiting:
    """A text shown before some of its numbers were glued, and the display to update with them."""

    template: str
    handle: Any
    missing: set[str]


_WAITING: list[_Waiting] = []


def show_markdown(template: str) -> None:
    """Display the template as Markdown with this kernel's glued values filled in.

    A number not glued yet shows as `UNKNOWN`, and the text is redrawn in place as soon as a later
    cell glues it (a paragraph may quote a number measured further down, as the book's prose can).
    """
    from IPython.display import Markdown, display

    pieces = render(template)
    if any(kind == "object" for kind, _ in pieces):  # figures: shown as they are, not redrawn
        for kind, item in pieces:
            display(Markdown(item) if kind == "markdown" else item)
        return
    handle = display(Markdown("\n\n".join(item for _, item in pieces)), display_id=True)
    missing = {split_ref(m["ref"])[0] for m in PLACEHOLDER.finditer(template)} - set(GLUED)
    if missing and handle is not None:
        _WAITING.append(_Waiting(template, handle, missing))


def _update_waiting(name: str) -> None:
    """Redraw the texts shown earlier that were waiting for `name`."""
    for waiting in [w for w in _WAITING if name in w.missing]:
        from IPython.display import Markdown

        waiting.missing.discard(name)
        waiting.handle.update(Markdown("\n\n".join(item for _, item in render(waiting.template))))
        if not waiting.missing:
            _WAITING.remove(waiting)
