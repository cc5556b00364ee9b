"""Live explorers for Jupyter and Colab: the knobs of a site explorer (`interactive.Knob`) as
ipywidgets sliders over a function that runs the package's real code and draws the result with
matplotlib at every move (a `Play` button for a knob that is time). They need a kernel; the site
shows each one's precomputed twin (`inflight.book.interactive`).

    explorer = live_explorer(show, knobs)   # show(**values) draws one view and returns its figure
    explorer                                # the last line of a cell displays it
    check_redraw(explorer)                  # moves every knob and back; fails if a redraw failed

A redraw should take under ~0.3 s on two CPU cores to feel live, and matplotlib spends most of a
new figure's time creating axes and ticks and drawing text. So an explorer keeps one `LiveFigure`
(which pyplot does not know about: the notebook never shows it by itself), updates its moving
artists at every move — line data, collections, an image, a title's text — and `show` returns
`LiveFigure.png()`, which redraws only those over a picture of the rest.

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
import numpy as np

from inflight.book.interactive import Knob

TARGET_S = 0.3  # a redraw that feels live on two CPU cores
DPI = 100  # figures 8 inches wide fill the text column (~800 px), as the book's static figures


@dataclass
class Redraw:
    values: dict
    seconds: float
    error: BaseException | None = None


class LiveFigure:
    """A matplotlib figure an explorer keeps from move to move (pyplot never sees it).

    Its fixed parts — axes, ticks, legends, labels: most of a draw's time is their text — are drawn
    once and kept as a picture; at each move only the artists marked `moving` are drawn over a copy
    of it (blitting). `png(key)` draws the whole figure anew when `key` — whatever the fixed parts
    show that may change: axis limits, the figure's size — is new; the pictures of the last
    `KEEP` keys are kept, so a knob moved back (or a Play loop) draws only what moves."""

    KEEP = 16  # pictures of ~1-3 MB each

    def __init__(self, width: float, height: float):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.fig = Figure(figsize=(width, height), dpi=DPI)
        FigureCanvasAgg(self.fig)
        self.moving: list = []
        self._backgrounds: dict = {}  # key -> the picture of the fixed parts
        # the figure's title line(s), which every explorer changes at each move
        self.title = self.move(self.fig.text(0.5, 0.985, "", ha="center", va="top", fontsize=10))

    def move(self, artist: Any) -> Any:
        """Mark `artist` as one that changes from move to move; returns it."""
        artist.set_animated(True)  # the full draw leaves it out: it is drawn over the picture
        self.moving.append(artist)
        return artist

    def png(self, key: Any = None) -> bytes:
        """The figure now, as PNG bytes (compressed lightly: zlib's level 1 is several times faster
        than the default, for a slightly larger file)."""
        from PIL import Image

        canvas = self.fig.canvas
        size = canvas.get_width_height()
        kept = self._backgrounds.get(key)
        if kept is None or kept[0] != size:  # (a picture of another size is of no use)
            canvas.draw()
            if len(self._backgrounds) >= self.KEEP:
                self._backgrounds.pop(next(iter(self._backgrounds)))  # the oldest
            self._backgrounds[key] = (size, canvas.copy_from_bbox(self.fig.bbox))
        else:
            canvas.get_renderer()  # (sized to the figure now)
            canvas.restore_region(kept[1])
        for artist in self.moving:
            self.fig.draw_artist(artist)
        width, height = canvas.get_width_height()
        buffer = io.BytesIO()
        Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1).convert("RGB").save(
            buffer, format="png", compress_level=1)
        return buffer.getvalue()


def nice_ceil(x: float) -> float:
    """The smallest of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k at least `x`: an axis limit that
    stays put while the data moves a little (so the fixed parts of a LiveFigure can be kept)."""
    if x <= 0:
        return 1.0
    scale = 10.0 ** np.floor(np.log10(x))
    return float(next(m * scale for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * scale >= x * (1 - 1e-9)))


def live_explorer(show: Callable[..., Any], knobs: Sequence[Knob], *, play_ms: int = 600) -> Any:
    """An `ipywidgets.interactive` with one slider per knob (values as in the site explorer) over
    `show`, which draws one view with matplotlib and returns it: PNG bytes (`LiveFigure.png`), a
    figure, or None for pyplot's current figure; a knob with `play=True` also gets a Play button."""
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
            _display_png(show(**values))
        except Exception as exc:
            log.append(Redraw(values, time.perf_counter() - start, exc))
            raise
        finally:
            plt.close("all")  # pyplot's figures (a LiveFigure's is not one of them)
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


def _display_png(view: Any) -> None:
    """Show a view: PNG bytes as they are; a figure (pyplot's current one if None) as a PNG of its
    own size, drawn once (the inline backend's default, a tight bounding box, draws it twice)."""
    from IPython.display import Image, display

    if not isinstance(view, bytes):
        buffer = io.BytesIO()
        (view or plt.gcf()).savefig(buffer, format="png", pil_kwargs={"compress_level": 1})
        view = buffer.getvalue()
    display(Image(view))


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
