"""Chapter 10's explorer: the TP degree → what one device holds, and what a decode step costs.

For a model (Llama 3.1 8B or 70B, bf16) on H100-class devices of 80 GB, at TP = 1, 2, 4, 8: left,
one device's memory — its slice of the layers' weights, the embedding and LM head it holds whole
(`inflight.model.parallel` replicates them), and the KV pool that is left, with the tokens it
holds; right, the time of one decode step (context 2,048) against the batch size, over NVLink and
over PCIe, and what it would be with no communication at all. Everything is
`inflight.sim.tp_capacity`: the engine's head layout, and a roofline with the bandwidths it states.

`tp_live` redraws with matplotlib at every move in Jupyter; `tp_site` holds every view for the site."""
from __future__ import annotations

from typing import Any, Sequence

from inflight.book.interactive import TAB10, Explorer, Knob, View, explorer, panels
from inflight.sim.tp_capacity import GB, H100_NVLINK, H100_PCIE, LLAMA_8B, LLAMA_70B, decode_step_cost, device_share

MODELS = {"70B": LLAMA_70B, "8B": LLAMA_8B}
TPS = (1, 2, 4, 8)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXT = 2048
PARTS = (("layer weights (1/N each)", TAB10[0]), ("embedding + LM head (whole)", TAB10[7]), ("KV pool", TAB10[2]))
LINES = ((H100_NVLINK, "NVLink", TAB10[1], "solid"), (H100_PCIE, "PCIe", TAB10[3], "solid"))


def memory_parts(model: str, tp: int) -> tuple[list[float], Any]:
    """GB of one device: layer weights, embedding + LM head, KV pool (0 if none) — and the share."""
    share = device_share(MODELS[model], tp, H100_NVLINK.memory)
    return [(share.weights - share.replicated) / GB, share.replicated / GB, max(0.0, share.kv_pool) / GB], share


def step_ms(model: str, tp: int) -> dict[str, list[float | None]]:
    """Milliseconds per decode step at each batch size: per link, and reading alone; None where the
    batch's KV does not fit the pool (or the weights do not fit at all)."""
    share = device_share(MODELS[model], tp, H100_NVLINK.memory)
    out: dict[str, list[float | None]] = {"read only": []}
    for dev, name, _, _ in LINES:
        out[name] = []
        for b in BATCHES:
            fits = share.fits and b * CONTEXT <= share.kv_tokens
            cost = decode_step_cost(MODELS[model], dev, tp, b, CONTEXT) if fits else None
            out[name].append(None if cost is None else round(cost.total * 1e3, 3))
            if dev is H100_NVLINK:
                out["read only"].append(None if cost is None else round(cost.read * 1e3, 3))
    return out


def headline(model: str, tp: int) -> str:
    _, share = memory_parts(model, tp)
    name = MODELS[model].name
    if not share.fits:
        return (f"{name} at TP = {tp}: {share.weights / GB:.0f} GB of weights per device — "
                f"does not fit 90% of 80 GB, no room for KV")
    ms = step_ms(model, tp)
    at = BATCHES.index(64)
    comm = "" if ms["NVLink"][at] is None or tp == 1 else (
        f"; batch 64: {ms['NVLink'][at]:.1f} ms NVLink, {ms['PCIe'][at]:.1f} ms PCIe")
    return (f"{name} at TP = {tp}: {share.weights / GB:.1f} GB of weights per device, "
            f"KV for {share.kv_tokens / 1e3:,.0f}k tokens{comm}")


def _y_max(model: str) -> float:
    return max(v for tp in TPS for series in step_ms(model, tp).values() for v in series if v is not None) * 1.1


# -- on the site: plotly, one view per (model, TP) --------------------------------------------

def tp_site(models: Sequence[str] = ("70B", "8B"), tps: Sequence[int] = TPS) -> Explorer:
    layout = panels(1, 2, titles=("one device's 80 GB (GB)", f"ms per decode step, context {CONTEXT}"), hspace=0.14)
    layout["xaxis"].update(domain=[0, 0.3], title={"text": ""}, type="category")
    layout["yaxis"].update(range=[0, 80], title={"text": "GB"})
    layout["xaxis2"].update(domain=[0.44, 1], type="log", title={"text": "batch size (requests)"},
                            tickvals=list(BATCHES))
    layout["yaxis2"].update(title={"text": "ms"})
    layout.update(barmode="stack", title={"font": {"size": 13}}, margin={"t": 96},
                  legend={"x": 0.45, "xanchor": "left", "y": 0.99, "yanchor": "top", "orientation": "v",
                          "bgcolor": "rgba(255,255,255,0.85)", "font": {"size": 11}})
    ymax = {m: _y_max(m) for m in models}

    def view(model: str, tp: int) -> View:
        parts, _ = memory_parts(model, tp)
        data = [{"type": "bar", "x": [f"TP = {tp}"], "y": [round(v, 2)], "name": name, "marker": {"color": color},
                 "showlegend": False, "text": [f"{name.split(' (')[0]}: {v:.1f} GB" if v >= 3 else ""],
                 "textposition": "inside", "insidetextanchor": "middle", "textfont": {"size": 10, "color": "white"},
                 "hovertemplate": f"{name}: %{{y:.1f}} GB<extra></extra>"} for (name, color), v in zip(PARTS, parts)]
        ms = step_ms(model, tp)
        for dev, name, color, _ in LINES:
            data.append({"type": "scatter", "mode": "lines+markers", "x": list(BATCHES), "y": ms[name],
                         "xaxis": "x2", "yaxis": "y2", "name": name, "line": {"color": color},
                         "hovertemplate": f"{name}: batch %{{x}}, %{{y:.2f}} ms<extra></extra>"})
        data.append({"type": "scatter", "mode": "lines", "x": list(BATCHES), "y": ms["read only"], "xaxis": "x2",
                     "yaxis": "y2", "name": "no communication", "line": {"color": "#777", "dash": "dot"},
                     "hovertemplate": "reading only: %{y:.2f} ms<extra></extra>"})
        return View(data, {"title": {"text": headline(model, tp).replace(": ", ":<br>", 1)},
                           "yaxis2": {"range": [0, ymax[model]]}})

    knobs = [Knob("model", "model", tuple(models)), Knob("tp", "tensor-parallel size", tuple(tps), start=4)]
    return explorer(knobs, view, layout, height=440)


# -- in Jupyter: matplotlib, a figure per move -----------------------------------------------

def draw(model: str, tp: int) -> Any:
    """The same view as the site's, with matplotlib (a Figure, not pyplot's)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.8), dpi=100)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, width_ratios=(1, 2.2))
    fig.subplots_adjust(left=0.08, right=0.98, top=0.8, bottom=0.15, wspace=0.3)
    parts, _ = memory_parts(model, tp)
    bottom = 0.0
    for (name, color), v in zip(PARTS, parts):
        left.bar([f"TP = {tp}"], [v], bottom=bottom, color=color, label=name)
        bottom += v
    left.set_ylim(0, 80)
    left.set_ylabel("GB of one device")
    left.legend(fontsize=7, loc="upper right")
    ms = step_ms(model, tp)
    for dev, name, color, _ in LINES:
        right.plot(BATCHES, [float("nan") if v is None else v for v in ms[name]], "o-", color=color, label=name, ms=3)
    right.plot(BATCHES, [float("nan") if v is None else v for v in ms["read only"]], ":", color="0.45",
               label="no communication")
    right.set_xscale("log", base=2)
    right.set_ylim(0, _y_max(model))
    right.set_xlabel("batch size (requests)")
    right.set_ylabel(f"ms per decode step (context {CONTEXT})")
    right.legend(fontsize=8, loc="upper left")
    fig.suptitle(headline(model, tp).replace(": ", ":\n", 1), fontsize=10)
    return fig


def tp_live(models: Sequence[str] = ("70B", "8B"), tps: Sequence[int] = TPS) -> Any:
    from inflight.book.widgets import live_explorer

    knobs = [Knob("model", "model", tuple(models)), Knob("tp", "tensor-parallel size", tuple(tps), start=4)]
    return live_explorer(draw, knobs)
