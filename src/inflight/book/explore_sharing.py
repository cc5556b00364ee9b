"""Chapter 5's sharing explorer: how many samples of one prompt (`n`), how long the prompt → the
samples' block tables and the blocks in use, with sharing and without.

One request of `n` samples (an output of `OUTPUT` tokens each, blocks of `BLOCK` tokens) runs
alone through the engine's own scheduler over a simulated pool (`inflight.sim.sample_sharing`):
one prefill, then samples that share the prompt's blocks and copy the last, partly filled one on
their first write. Left, the samples' block tables when they hold the most, block by block: a
block every sample shares, the prompt's last block (copied on write, or kept by the last sample to
write it), a block of the sample's own. Right, the blocks in use at every step, against the blocks
the same samples' tables add up to — what they would hold without sharing, as `n` separate requests.

In Jupyter, `sharing_live` reruns the scheduler at every move (sliders for `n` and the prompt
length); on the site, `sharing_site` holds a grid of them."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from matplotlib.colors import ListedColormap

from inflight.book.interactive import TAB10, Explorer, Knob, View, explorer, panels
from inflight.book.widgets import LiveFigure, live_explorer, nice_ceil
from inflight.sim.sample_sharing import SharingRun, sample_run

BLOCK, OUTPUT = 16, 64
NS = (1, 2, 4, 8, 16)                   # the site's samples per prompt; the live slider has more
PROMPTS = (16, 40, 100, 250, 500)       # the site's prompt lengths (tokens); ditto
LIVE_NS = (1, 2, 3, 4, 6, 8, 12, 16)
LIVE_PROMPTS = (8, 16, 40, 64, 100, 160, 250, 500, 1000)
EMPTY, SHARED, LAST, OWN = 0, 1, 2, 3   # a cell's code in the table picture
COLORS = ("#f7f7f7", TAB10[0], TAB10[1], TAB10[2])
NAMES = {SHARED: "shared by every sample", LAST: "prompt's last block (copied on write)", OWN: "the sample's own"}


def table_codes(run: SharingRun, prompt_len: int, rows: int, cols: int) -> np.ndarray:
    """The samples' block tables at their peak as codes, padded to `rows` × `cols` with EMPTY."""
    codes = np.full((rows, cols), EMPTY, dtype=np.int8)
    last = prompt_len // run.block_size if prompt_len % run.block_size else None
    for r, table in enumerate(run.tables[:rows]):
        for i, b in enumerate(table[:cols]):
            codes[r, i] = SHARED if run.refs[b] > 1 else LAST if i == last and run.n > 1 else OWN
    return codes


def caption(run: SharingRun, prompt_len: int) -> str:
    saved = 1 - run.peak_in_use / run.peak_without
    return (f"n = {run.n}, a prompt of {prompt_len} tokens: at most {run.peak_in_use} blocks in use with sharing, "
            f"{run.peak_without} without ({saved:.0%} saved); {run.copies} block(s) copied on write")


# -- in Jupyter: matplotlib, one figure updated in place --------------------------------------

class LiveSharing:
    """The live explorer's figure: the samples' block tables (left), blocks in use per step (right)."""

    def __init__(self, ns: Sequence[int], prompts: Sequence[int]):
        self.rows, self.cols = max(ns), -(-(max(prompts) + OUTPUT - 1) // BLOCK)  # the largest picture
        self.live = LiveFigure(8, 4.2)
        move, fig = self.live.move, self.live.fig
        self.ax_t, self.ax = fig.subplots(1, 2, width_ratios=(1.5, 1))
        fig.subplots_adjust(left=0.06, right=0.98, top=0.8, bottom=0.27, wspace=0.22)
        self.image = move(self.ax_t.imshow(np.zeros((self.rows, self.cols)), cmap=ListedColormap(COLORS), vmin=-0.5,
                                           vmax=len(COLORS) - 0.5, interpolation="nearest", aspect="auto"))
        self.ax_t.set_xlabel("block of the sample's table")
        self.ax_t.set_ylabel("sample")
        self.ax_t.yaxis.get_major_locator().set_params(integer=True)
        self.with_line = move(self.ax.plot([], [], lw=2, color=TAB10[0], label="blocks in use, with sharing")[0])
        self.without_line = move(self.ax.plot([], [], lw=1.5, ls="--", color=TAB10[3], label="without sharing")[0])
        self.ax.set_xlim(0, OUTPUT + 1)
        self.ax.set_xlabel("step")
        self.ax.set_title("blocks in use", loc="left", fontsize=10)
        squares = [self.ax.plot([], [], "s", ms=9, color=COLORS[code], label=name)[0] for code, name in NAMES.items()]
        fig.legend(handles=squares + [self.with_line, self.without_line], loc="lower center", ncol=3, fontsize=8,
                   frameon=False)

    def __call__(self, n: int, prompt_len: int) -> Any:
        run = sample_run(prompt_len, OUTPUT, n, BLOCK)  # the engine's scheduler and allocator, at every move
        cols = -(-(prompt_len + OUTPUT - 1) // BLOCK)
        self.image.set_data(table_codes(run, prompt_len, self.rows, self.cols))
        self.ax_t.set_xlim(-0.5, cols - 0.5)
        self.ax_t.set_ylim(n - 0.5, -0.5)
        steps = np.arange(1, run.steps + 1)
        self.with_line.set_data(steps, run.in_use)
        self.without_line.set_data(steps, run.without)
        top = nice_ceil(run.peak_without * 1.05)
        self.ax.set_ylim(0, top)
        self.live.title.set_text(caption(run, prompt_len).replace(": ", ":\n", 1))
        return self.live.png(key=(n, cols, top))  # (new axis limits: the fixed parts are drawn anew)


def sharing_live(ns: Sequence[int] = LIVE_NS, prompts: Sequence[int] = LIVE_PROMPTS) -> Any:
    """Sliders for the samples per prompt and the prompt length; each move reruns the scheduler."""
    figure = LiveSharing(ns, prompts)
    knobs = [Knob("n", "samples n", tuple(ns), start=4 if 4 in ns else ns[0]),
             Knob("prompt_len", "prompt tokens", tuple(prompts), start=100 if 100 in prompts else prompts[0])]
    return live_explorer(figure, knobs)


# -- on the site: plotly, the grid of n × prompt length ---------------------------------------

def _view(runs: dict, n: int, prompt_len: int, rows: int, cols: int) -> View:
    run = runs[n, prompt_len]
    codes = table_codes(run, prompt_len, rows, cols)
    steps = list(range(1, run.steps + 1))
    data = [{"type": "heatmap", "z": codes, "zmin": 0, "zmax": len(COLORS) - 1, "showscale": False, "xgap": 1,
             "ygap": 1, "hoverinfo": "skip",
             "colorscale": [[(i + d) / len(COLORS), c] for i, c in enumerate(COLORS) for d in (0, 1)]},
            {"type": "scatter", "mode": "lines", "x": steps, "y": run.in_use.astype(np.int16), "name": "with sharing",
             "xaxis": "x2", "yaxis": "y2", "line": {"width": 2.5, "color": TAB10[0]}},
            {"type": "scatter", "mode": "lines", "x": steps, "y": run.without.astype(np.int16), "name": "without",
             "xaxis": "x2", "yaxis": "y2", "line": {"width": 2, "dash": "dash", "color": TAB10[3]}}]
    data += [{"type": "scatter", "mode": "markers", "x": [None], "y": [None], "name": name, "hoverinfo": "skip",
              "marker": {"symbol": "square", "size": 11, "color": COLORS[code]}} for code, name in NAMES.items()]
    cols_here = -(-(prompt_len + OUTPUT - 1) // BLOCK)
    return View(data, {"title": {"text": caption(run, prompt_len).replace(": ", ":<br>", 1)},
                       "xaxis": {"range": [-0.5, cols_here - 0.5]}, "yaxis": {"range": [n - 0.5, -0.5]},
                       "yaxis2": {"range": [0, nice_ceil(run.peak_without * 1.05)]}})


def sharing_site(ns: Sequence[int] = NS, prompts: Sequence[int] = PROMPTS) -> Explorer:
    """The site's figure: a slider for n and one for the prompt length, over precomputed runs."""
    runs = {(n, p): sample_run(p, OUTPUT, n, BLOCK) for n in ns for p in prompts}
    rows, cols = max(ns), -(-(max(prompts) + OUTPUT - 1) // BLOCK)
    layout = panels(1, 2, titles=(f"the samples' block tables (blocks of {BLOCK})", "blocks in use"), hspace=0.1)
    layout["xaxis"].update(domain=[0, 0.55], title={"text": "block of the table"})
    layout["yaxis"].update(title={"text": "sample"}, tickformat="d")
    layout["xaxis2"].update(domain=[0.65, 1], range=[0, OUTPUT + 1], title={"text": "step"})
    # (vertical, said outright: the book's base legend is horizontal, and a horizontal legend starting
    # at x=0.66 reaches past the plot, which made plotly lay the sliders out for a 144 px plot)
    layout["legend"] = {"orientation": "v", "x": 0.66, "xanchor": "left", "y": 1, "yanchor": "top", "xref": "paper", "yref": "paper",
                        "bgcolor": "rgba(255,255,255,0.8)", "font": {"size": 10}}
    layout.update(title={"font": {"size": 13}}, margin={"t": 96})
    knobs = [Knob("n", "samples n", tuple(ns), start=4 if 4 in ns else ns[0]),
             Knob("prompt_len", "prompt tokens", tuple(prompts), start=100 if 100 in prompts else prompts[0])]
    return explorer(knobs, lambda n, prompt_len: _view(runs, n, prompt_len, rows, cols), layout, height=380)
