"""Live explorers for Jupyter and Colab: the knobs of a site explorer (`interactive.Knob`) as
ipywidgets sliders over a function that runs the package's real code and draws the result with
matplotlib at every move (a `Play` button for a knob that is time). They need a kernel; the site
shows each one's precomputed twin (`inflight.book.interactive`).

    explorer = live_explorer(show, knobs)   # show(**values) draws one view on a new figure
    explorer                                # the last line of a cell displays it
    check_redraw(explorer)                  # moves every knob and back; fails if a redraw failed

ipywidgets prints an exception raised while redrawing and carries on, so every redraw is logged
(`explorer.redraws`: the knob values, the seconds it took, the exception if any) and
`check_redraw` turns a failed one into an error: the chapters call it, so the book build and the
Colab-like runtime prove that each explorer builds and redraws.
"""
from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import matplotlib.pyplot as plt

from inflight.book.interactive import Knob

TARGET_S = 0.3  # a redraw that feels live on two CPU cores


@dataclass
class Redraw:
    values: dict
    seconds: float
    error: BaseException | None = None


def live_explorer(show: Callable[..., Any], knobs: Sequence[Knob], *, play_ms: int = 600) -> Any:
    """An `ipywidgets.interactive` with one slider per knob (values as in the site explorer) over
    `show`, which draws one view with matplotlib; a knob with `play=True` also gets a Play button."""
    import ipywidgets as widgets

    sliders = {k.name: widgets.SelectionSlider(options=[(k.fmt.format(v), v) for v in k.values],
                                               value=k.values[k.start_index], description=k.label,
                                               continuous_update=False, style={"description_width": "initial"},
                                               layout=widgets.Layout(width="460px"))
               for k in knobs}
    log: list[Redraw] = []

    def redraw(**values: Any) -> None:
        start = time.perf_counter()
        try:
            show(**values)
            _display_png(plt.gcf())
        except Exception as exc:
            log.append(Redraw(values, time.perf_counter() - start, exc))
            raise
        finally:
            plt.close("all")  # a backend without a display (Agg) keeps every figure otherwise
        log.append(Redraw(values, time.perf_counter() - start))

    explorer = widgets.interactive(redraw, **sliders)
    explorer.redraws = log
    plays = []
    for k in knobs:
        if k.play:
            play = widgets.Play(min=0, max=len(k.values) - 1, value=k.start_index, interval=play_ms,
                                description=f"play {k.label}")
            widgets.jslink((play, "value"), (sliders[k.name], "index"))
            plays.append(widgets.HBox([play, widgets.Label(f"play {k.label}")]))
    explorer.children = tuple(plays) + explorer.children
    return explorer


def _display_png(fig: Any) -> None:
    """The figure as a PNG of its own size, drawn once (the inline backend's default, a tight
    bounding box, draws it twice: a tenth of a second more for every move of a knob)."""
    from IPython.display import Image, display

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    display(Image(buffer.getvalue()))


def check_redraw(explorer: Any) -> str:
    """Move every knob one position and back (each move redraws); raise if any redraw failed.

    Returns a line with every redraw's seconds, against the ~0.3 s that feels live."""
    for slider in explorer.kwargs_widgets:
        before = slider.index
        slider.index = (before + 1) % len(slider.options)
        slider.index = before
    failed = [r for r in explorer.redraws if r.error is not None]
    if failed:
        raise RuntimeError(f"the explorer failed to redraw at {failed[0].values}: {failed[0].error!r}") from failed[0].error
    moves = [r.seconds for r in explorer.redraws[1:]] or [explorer.redraws[0].seconds]
    return (f"{len(explorer.redraws)} redraws ({', '.join(f'{r.seconds:.2f}' for r in explorer.redraws)} s, "
            f"the first when it was built): a move took {min(moves):.2f}-{max(moves):.2f} s, "
            f"{'within' if max(moves) <= TARGET_S else 'over'} the {TARGET_S} s that feels live")
