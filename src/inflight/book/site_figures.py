"""The book's static figures on its site (issue 32): drawn at twice their size, shown at their own.

A figure 8 inches wide at matplotlib's 100 dpi is 800 px: on a HiDPI screen (a phone's, most
laptops') the browser stretched it and its text went soft. Here each figure is written at
SCALE × its dpi with its display size beside it (IPython's own "retina" convention: the image's
width and height in the output's metadata), and the PNG records the size of the smallest text
that was drawn in it (MIN_TEXT_KEY, in points; the PNG's pHYs chunk holds its dpi). The site's
pages read that record to keep the text legible on a narrow screen (a figure scrolls sideways
rather than shrink its text under 8 CSS px: _ext/site_pages.py), and the browser check
(tests/site_check.py) measures what a reader would see with it.

The book's build runs `install()` in every kernel it starts (an IPython startup file that
_ext/site_pages.py writes); a notebook in Jupyter or Colab keeps its usual figures.
"""
from __future__ import annotations

import io
from contextlib import contextmanager
from typing import Any, Iterator

SCALE = 2
MIN_TEXT_KEY = "inflight:min-text-pt"
QUANTIZE_ERROR = 6  # of 255: the most 256 colours may change all but 1 pixel in 200 (a channel's)


@contextmanager
def _text_sizes(sizes: list[float]) -> Iterator[None]:
    """Record the size in points of every piece of text the Agg renderer draws on its canvas."""
    from matplotlib.backends.backend_agg import RendererAgg

    original = RendererAgg.draw_text

    def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if str(s).strip() and 0 <= x <= self.width and 0 <= y <= self.height:
            sizes.append(prop.get_size_in_points())
        return original(self, gc, x, y, s, prop, angle, ismath, mtext)

    RendererAgg.draw_text = draw_text
    try:
        yield
    finally:
        RendererAgg.draw_text = original


def site_png(fig: Any) -> tuple[bytes, dict] | None:
    """The figure as the site shows it: PNG bytes at SCALE × its dpi, recording its smallest text,
    and the size to show it at (in CSS px). None for an empty figure (IPython shows nothing)."""
    if not fig.axes and not fig.texts and not fig.images:
        return None
    sizes: list[float] = []
    buffer = io.BytesIO()
    with _text_sizes(sizes):
        fig.canvas.print_figure(buffer, format="png", dpi=fig.dpi * SCALE, bbox_inches="tight",
                                facecolor=fig.get_facecolor(), edgecolor=fig.get_edgecolor())
    data = _smaller(buffer.getvalue(), fig.dpi * SCALE, f"{min(sizes):.2f}" if sizes else "")
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # the IHDR chunk
    return data, {"width": width // SCALE, "height": height // SCALE}


def _smaller(png: bytes, dpi: float, min_text: str) -> bytes:
    """The PNG as 256 colours where that leaves all but a few pixels as they were (a plot's flat
    colours and their antialiased edges: a third of the bytes; an image or a gradient keeps its
    colours), else as opaque RGB; its dpi and smallest text recorded."""
    import numpy as np
    from PIL import Image, PngImagePlugin

    image = Image.open(io.BytesIO(png))
    if image.mode == "RGBA" and image.getextrema()[3][0] == 255:
        image = image.convert("RGB")  # opaque: the alpha channel says nothing
    if image.mode == "RGB":
        palette = image.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        error = np.abs(np.asarray(palette.convert("RGB"), dtype=np.int16) - np.asarray(image, dtype=np.int16))
        if np.percentile(error.max(axis=2), 99.5) <= QUANTIZE_ERROR:
            image = palette
    info = PngImagePlugin.PngInfo()
    if min_text:
        info.add_text(MIN_TEXT_KEY, min_text)
    out = io.BytesIO()
    image.save(out, format="png", dpi=(dpi, dpi), pnginfo=info)
    return out.getvalue()


def install(shell: Any = None) -> None:
    """Show this kernel's matplotlib figures with `site_png`. The kernel's backend (the inline one)
    is loaded first: loading it registers its own PNG formatter, and matplotlib would otherwise
    load it lazily, at the first figure, replacing this one."""
    import matplotlib
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    plt.switch_backend(matplotlib.get_backend())

    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["image/png"].for_type(Figure, site_png)
