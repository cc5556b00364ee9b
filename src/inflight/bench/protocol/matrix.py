"""`python -m inflight.bench.protocol.matrix`: the fair comparison on every shape of work.

The benchmark's headline ratio (the paged engine over transformers `generate`, as a multiple of the
work-bound ideal) is measured on one long-tailed workload. This runs the same protocol
(`inflight.bench.protocol.fair`: each system in its own process, at its own best settings, taking
turns round after round, every process's tokens checked against a one-at-a-time reference) on each
cell of the matrix (`inflight.bench.protocol.cells`: decode-heavy / balanced / prefill-heavy × short
/ long contexts × batch limits 16 and 64), and gives each cell

- its **work-bound ideal** (the rows static batching computes per token wanted) and the ratio over
  `generate` as a multiple of it, per round, with the median and range;
- its **floor** (`bench.protocol.floor`: the linear layers at their measured rate, one KV read per
  step, the prompts' attention arithmetic), the engine's time in each round over it, and the most
  any engine could reach against this peer here (the floor's speed over the peer's median), as a
  multiple of the ideal;
- the engine's **time split** (`bench.offline.time_split`): linear layers, attention on decode-only
  steps and on steps with prompt tokens, the fused small operations, sampling, scheduling, input
  preparation, Python.

The floor and the split come from one more paged process after the rounds (the same steps: the
schedule doesn't depend on timing), so that no timed run carries their measurements.

Settings: the search of `fair` runs once per batch limit, on that limit's `--search-cell`, over
every wait policy at the machine's full thread count (one thread lost by a wide margin for both
systems in the benchmark's full search, `results/bench_cpu.json`), and each system keeps its best
for the whole matrix at that limit.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from inflight.bench.protocol import fair, side_by_side
from inflight.bench.protocol.cells import ALL, BENCHMARK, CELLS, Cell, cell, cell_names

__all__ = ["run", "run_cell", "report", "markdown", "main", "TARGET_OF_IDEAL"]

TARGET_OF_IDEAL = side_by_side.TARGET_OF_IDEAL  # 1.5x the work-bound ideal over generate, in every cell


def _contenders(c: Cell, settings: dict[str, tuple[fair.Setting, ...]], peers: Sequence[str], floor: bool,
                n: int | None = None, split: bool = False) -> list[fair.Contender]:
    out = []
    for mode in ("paged", *peers):
        command = side_by_side._command(mode, n or c.num_requests, floor and mode == "paged", c.batch_size, **c.shape())
        if split and mode == "paged":
            command += ("--split",)
        out.append(fair.Contender(mode, command, settings[mode]))
    return out


def _settings(cores: int) -> tuple[fair.Setting, ...]:
    """Every wait policy at the full thread count (the engine's own default first: `side_by_side`)."""
    return tuple(s for s in fair.openmp_settings(cores) if dict(s.env).get("OMP_NUM_THREADS") == str(cores))


def search_settings(c: Cell, peers: Sequence[str], tmp: Path, rounds: int = 1, log: fair.Log = print
                    ) -> dict[str, Any]:
    """The best setting of each system on cell `c` (`fair.search`, its tokens checked)."""
    from inflight.threads import usable_cores

    each = _settings(usable_cores())
    ref, _ = side_by_side.reference(tmp / f"search_{c.batch_size}.json", c.num_requests, log, c.batch_size, **c.shape())
    contenders = _contenders(c, {m: side_by_side._own_default_first(each) if m == "paged" else each
                                 for m in ("paged", *peers)}, peers, floor=False)
    found = fair.search(contenders, rounds, fair.run_process, ref, log)
    return {"cell": c.name, "rounds": rounds,
            "best": {m: f["best"] for m, f in found.items()},
            "tried": {m: f["tried"] for m, f in found.items()}}


def run_cell(c: Cell, best: dict[str, fair.Setting], peers: Sequence[str], rounds: int, tmp: Path,
             split: bool = True, log: fair.Log = print) -> dict[str, Any]:
    """One cell: its reference, `rounds` alternating rounds at the `best` settings, then one more
    paged process that measures the run's floor and splits its time (outside the rounds: neither
    the floor's measurement nor the split's timers touch a timed run)."""
    ref, seq = side_by_side.reference(tmp / (c.name.replace("/", "_") + ".json"), c.num_requests, log,
                                      c.batch_size, **c.shape())
    ideal = seq["work_bound_ideal"]
    res = fair.compare(_contenders(c, {m: (s,) for m, s in best.items()}, peers, floor=False), rounds, 0,
                       pairs=[("paged", p) for p in peers], ref=ref, log=log)
    out: dict[str, Any] = {"cell": c.as_dict(), "useful_tokens": seq["useful_tokens"],
                           "prompt_tokens": seq.get("prompt_tokens"),
                           "work_bound_ideal_with_prompts": seq.get("work_bound_ideal_with_prompts"),
                           "reference_sha256": _digest(ref.tokens),
                           "fair": res, "target": side_by_side.of_ideal(res, ideal)}
    if split:
        cmd = _contenders(c, {"paged": (best["paged"],)}, (), floor=True, split=True)[0].command
        m = fair._measure(fair.run_process, fair.Contender("paged (floor and time split)", cmd, (best["paged"],)),
                          best["paged"], ref)
        log(f"floor and split: paged {m['value'] or 0:.1f} tokens/s, tokens "
            f"{'identical' if (m['token_check'] or {}).get('ok') else 'DIFFER'}")
        out["floor"] = _floor(m, res, ideal, peers)
        out["time_split"] = m.get("time_split")
        out["split_process"] = {k: m.get(k) for k in ("value", "wall_s", "token_check", "load")}
    return out


def _digest(tokens: dict[str, list[int]]) -> str:
    return hashlib.sha256(json.dumps(tokens, sort_keys=True).encode()).hexdigest()


def _floor(m: dict[str, Any], res: dict[str, Any], ideal: float, peers: Sequence[str]) -> dict[str, Any]:
    """The floor measured in process `m` against the rounds: the paged runs' wall time over it, and
    the floor's speed over each peer's median speed -- the largest ratio any engine could show here
    (over `generate`, also as a multiple of the ideal)."""
    f = m.get("floor")
    if not f:
        return {}
    walls = [row["paged"]["wall_s"] for row in res["rounds"] if row["paged"].get("value")]
    out: dict[str, Any] = {"floor_s": f["floor_s"],
                           "parts_s": {k: f[k] for k in ("linear_layers_s", "kv_read_s", "prefill_attention_s")},
                           "wall_over_floor": fair.spread([w / f["floor_s"] for w in walls]),
                           "max_tokens_per_s": f["max_tokens_per_s_floor"], "measured": f}
    for p in peers:
        med = res["summary"]["contenders"][p]["median"]
        if med:
            out[f"bound_over_{p}"] = f["max_tokens_per_s_floor"] / med
            if p == "hf_static":
                out["bound_of_ideal"] = out["bound_over_hf_static"] / ideal
    return out


def run(cells: Sequence[Cell] = ALL, rounds: int = 5, peers: Sequence[str] = ("hf_static",),
        search_cell: str = "balanced/short", search_rounds: int = 1, split: bool = True,
        log: fair.Log = print) -> dict[str, Any]:
    """The matrix: a settings search per batch limit, then every cell (`run_cell`)."""
    from inflight.threads import machine_load

    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    before = machine_load().as_dict()
    out: dict[str, Any] = {"protocol": "each system in its own process at its best setting, alternating, tokens "
                                       "checked (inflight.bench.protocol.fair), per cell of the matrix",
                           "created": started, "rounds": rounds, "peers": list(peers), "searches": {}, "cells": {},
                           "load_before": before}
    with tempfile.TemporaryDirectory(prefix="inflight-matrix-") as tmp:
        best: dict[int, dict[str, fair.Setting]] = {}
        for b in sorted({c.batch_size for c in cells}):
            if search_rounds:
                sc = cell(f"{search_cell}/B{b}")
                log(f"settings search on {sc.name} ...")
                found = search_settings(sc, peers, Path(tmp), search_rounds, log=lambda s: log(f"  {s}"))
                best[b] = found["best"]
                out["searches"][str(b)] = found | {"best": {m: s.as_dict() for m, s in found["best"].items()}}
            else:
                best[b] = {m: _settings_default(m) for m in ("paged", *peers)}
            log(f"B={b}: " + ", ".join(f"{m} at {s.label}" for m, s in best[b].items()))
        for c in cells:
            log(f"cell {c.name}: {c.num_requests} requests, prompts {c.prompt_range}, outputs mean {c.output_mean} "
                f"cap {c.output_cap}")
            out["cells"][c.name] = run_cell(c, best[c.batch_size], peers, rounds, Path(tmp), split,
                                            log=lambda s: log(f"  {s}"))
            log("  " + _line(out["cells"][c.name]))
    out["load_after"] = machine_load().as_dict()
    out["command"] = "python -m inflight.bench.protocol.matrix " + " ".join(sys.argv[1:])
    out["summary"] = summarize(out["cells"])
    return out


def _settings_default(mode: str) -> fair.Setting:
    from inflight.threads import usable_cores

    each = _settings(usable_cores())
    return side_by_side._own_default_first(each)[0] if mode == "paged" else each[0]


def summarize(cells: dict[str, Any]) -> dict[str, Any]:
    """The matrix in a few numbers: every cell's median multiple of the ideal, how many meet the
    target, the furthest from the ideal and from its floor."""
    rows = {name: c["target"] for name, c in cells.items() if name != BENCHMARK.name}
    of_ideal = {n: t["median_of_ideal"] for n, t in rows.items() if t.get("median_of_ideal") is not None}
    over_floor = {n: c["floor"]["wall_over_floor"]["median"] for n, c in cells.items() if c.get("floor")}
    bench = cells.get(BENCHMARK.name)
    return {"benchmark_workload": bench["target"] if bench else None, "median_of_ideal": of_ideal, "cells_met": sorted(n for n, t in rows.items() if t.get("met")),
            "cells_not_met": sorted(n for n, t in rows.items() if not t.get("met")),
            "furthest_from_ideal": min(of_ideal, key=of_ideal.get) if of_ideal else None,
            "furthest_from_floor": max(over_floor, key=over_floor.get) if over_floor else None,
            "all_tokens_identical": all(c["fair"]["all_tokens_identical"] for c in cells.values())}


def _line(c: dict[str, Any]) -> str:
    t, f = c["target"], c.get("floor") or {}
    parts = [f"ideal {t['work_bound_ideal']:.2f}"]
    if t.get("median_of_ideal") is not None:
        parts.append(f"paged/generate {t['median_of_ideal']:.2f}x the ideal ({t['min_of_ideal']:.2f}-{t['max_of_ideal']:.2f})")
    if f:
        parts.append(f"{f['wall_over_floor']['median']:.2f}x its floor, floor allows {f.get('bound_of_ideal', 0):.2f}x the ideal")
    return "; ".join(parts)


def report(res: dict[str, Any]) -> str:
    """The matrix as a table: one row per cell."""
    head = (f"{'cell':<28} {'ideal':>6} {'+prompts':>8} {'over generate':>15} {'x ideal':>14} {'/floor':>7} {'floor allows':>12}  "
            f"largest shares of the engine's time")
    lines = [head, "-" * len(head)]
    for name, c in res["cells"].items():
        t, f = c["target"], c.get("floor") or {}
        over = c["fair"]["summary"]["ratios"].get("paged/hf_static", {})
        shares = (c.get("time_split") or {}).get("shares") or {}
        top = ", ".join(f"{k} {v:.0%}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1])[:3])
        x = (f"{t['median_of_ideal']:.2f} {'met' if t['met'] else '   '}" if t.get("median_of_ideal") is not None else "—")
        lines.append(f"{name:<28} {t['work_bound_ideal']:>6.2f} {_num(c.get('work_bound_ideal_with_prompts')):>8} "
                     f"{_num(over.get('median')):>15} {x:>14} "
                     f"{_num((f.get('wall_over_floor') or {}).get('median')):>7} {_num(f.get('bound_of_ideal')):>12}  {top}")
    s = res["summary"]
    n = sum(name != BENCHMARK.name for name in res["cells"])
    lines.append(f"target >= {TARGET_OF_IDEAL}x the ideal: met in {len(s['cells_met'])} of {n} cells of the matrix; "
                 f"every process's tokens identical to its reference: {'yes' if s['all_tokens_identical'] else 'NO'}")
    return "\n".join(lines)


def markdown(res: dict[str, Any]) -> str:
    """The saved matrix as the Markdown table results/README.md shows (every figure from the file)."""
    lines = ["| cell | requests | ideal | ideal with prompts | paged over generate (median, range) | × the ideal "
             "(median, range) | ≥ 1.5× | time / floor | the floor allows (× ideal) | largest shares of the engine's time |",
             "| --- | ---: | ---: | ---: | ---: | ---: | :---: | ---: | ---: | --- |"]
    for name, c in res["cells"].items():
        t, f = c["target"], c.get("floor") or {}
        over = c["fair"]["summary"]["ratios"].get("paged/hf_static", {})
        shares = (c.get("time_split") or {}).get("shares") or {}
        top = ", ".join(f"{k} {v:.0%}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1])[:3])
        rng = lambda lo, hi: "—" if lo is None else f"{lo:.2f}–{hi:.2f}"  # noqa: E731
        lines.append(f"| {name} | {c['cell']['num_requests']} | {t['work_bound_ideal']:.2f} | "
                     f"{_num(c.get('work_bound_ideal_with_prompts'))} | {_num(over.get('median'))}× "
                     f"({rng(over.get('min'), over.get('max'))}) | {_num(t.get('median_of_ideal'))} "
                     f"({rng(t.get('min_of_ideal'), t.get('max_of_ideal'))}) | {'yes' if t['met'] else 'no'} | "
                     f"{_num((f.get('wall_over_floor') or {}).get('median'))} | {_num(f.get('bound_of_ideal'))} | {top} |")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.protocol.matrix", description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", nargs="*", default=None,
                   help=f"cells to run (default: the twelve and the benchmark's own): {' '.join(cell_names())}")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--peers", default="hf_static", help="comma list of hf_static, hf_continuous")
    p.add_argument("--search-cell", default="balanced/short", help="the shape the settings search runs on, per batch limit")
    p.add_argument("--search-rounds", type=int, default=1, help="0: no search (torch's defaults for the peers)")
    p.add_argument("--no-split", action="store_true", help="skip the time split (one paged process per cell)")
    p.add_argument("--out", help="write the results JSON here (e.g. results/matrix_cpu.json)")
    p.add_argument("--table", metavar="JSON", help="print a saved run as results/README.md's Markdown table, and stop")
    a = p.parse_args(argv)
    if a.table:
        print(markdown(json.loads(Path(a.table).read_text(encoding="utf-8"))))
        return 0
    peers = [x.strip() for x in a.peers.split(",") if x.strip()]
    if not peers or set(peers) - set(side_by_side.PEERS) or "hf_static" not in peers:
        p.error(f"--peers: hf_static, optionally with hf_continuous (got {a.peers!r})")
    if a.rounds < 1 or a.search_rounds < 0:
        p.error("--rounds must be >= 1 and --search-rounds >= 0")
    try:
        cells = [cell(n) for n in a.cells] if a.cells else list(ALL)
        cell(f"{a.search_cell}/B16")
    except ValueError as exc:
        p.error(str(exc))
    res = run(cells, a.rounds, peers, a.search_cell, a.search_rounds, not a.no_split)
    text = report(res)
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"saved {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
