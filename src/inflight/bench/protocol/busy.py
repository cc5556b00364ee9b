"""`python -m inflight.bench.protocol.busy`: the engine whatever the import order, on a quiet machine and a busy one.

A reader's notebook may start with `import torch` or with `import inflight`, and a laptop or a Colab
CPU is rarely idle. OpenMP reads its wait policy once, when torch loads: `import inflight` first asks
for a short spin (`OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=10000`: idle threads spin about a third of
a millisecond, then sleep), `import torch` first leaves torch's default (idle threads spin for
milliseconds). So this benchmark measures the engine (the paged mode of the benchmark,
on the long-tailed workload) in each import order (`VARIANTS`), each run a fresh process
(`inflight.bench.protocol.fair`), alone and beside one CPU-bound program per core (plain `while True: pass`
processes this program starts), the variants taking turns round after round. Two programs per core
makes a fair share one half.

The targets (issue 24), on the medians over the rounds: in every variant the quiet throughput is
within 20 % of the best variant's, and the busy one keeps at least 40 % of its own quiet one. Run it
alone: other programs on the machine are competitors you did not count (the report says how busy
the quiet runs really were).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from inflight.bench.protocol import fair
from inflight.threads import SHORT_SPIN, usable_cores

__all__ = ["VARIANTS", "matrix", "targets", "measure_here", "competitors_running", "main", "KEEP_TARGET",
           "QUIET_WITHIN"]

#: variant -> how its process starts. The first two are what a reader gets; the others take one
#: piece away, to show what it is worth.
VARIANTS: dict[str, fair.Setting] = {
    "inflight first": fair.Setting("import inflight first (it sets OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=10000)",
                                   fair.POLICIES["default"]),
    "torch first": fair.Setting("import torch first (torch's OpenMP default: idle threads spin)",
                                fair.POLICIES["default"], torch_first=True),
    "inflight first, PASSIVE": fair.Setting(
        "OMP_WAIT_POLICY=PASSIVE, then import inflight (idle threads sleep at once: what import inflight set before)",
        fair.POLICIES["PASSIVE"]),
    "torch first, kernels on OpenMP": fair.Setting(
        "import torch first, the C kernels on torch's OpenMP team (INFLIGHT_THREAD_POOL=0)",
        fair.POLICIES["default"] + (("INFLIGHT_THREAD_POOL", "0"),), torch_first=True),
    "inflight first, kernels on OpenMP": fair.Setting(
        "import inflight first, the C kernels on torch's OpenMP team (INFLIGHT_THREAD_POOL=0)",
        fair.POLICIES["default"] + (("INFLIGHT_THREAD_POOL", "0"),)),
    "torch first, no governor": fair.Setting(
        "import torch first, no ThreadGovernor (INFLIGHT_ADAPT_THREADS=0)",
        fair.POLICIES["default"] + (("INFLIGHT_ADAPT_THREADS", "0"),), torch_first=True),
    "torch first, short spin": fair.Setting(
        "import torch first with GOMP_SPINCOUNT=10000 (idle OpenMP threads spin briefly, then sleep)",
        (("OMP_WAIT_POLICY", None), ("GOMP_SPINCOUNT", SHORT_SPIN)), torch_first=True),
}
DEFAULT_VARIANTS = ("inflight first", "torch first")
KEEP_TARGET = 0.40   # busy over quiet, each variant
QUIET_WITHIN = 0.20  # every variant's quiet throughput within this of the best variant's
_SPIN = "while True: pass"


@contextmanager
def competitors_running(count: int) -> Iterator[None]:
    """`count` CPU-bound programs (`while True: pass`) for the duration of the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(count)]
    try:
        if spinners:
            time.sleep(0.5)  # let them reach the cores first
        yield
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait()


def matrix(variants: Sequence[str] = DEFAULT_VARIANTS, n: int = 128, rounds: int = 3, competitors: int | None = None,
           run: fair.Run | None = None, log: fair.Log = print) -> dict[str, Any]:
    """Every variant quiet and busy, in fresh processes, the variants taking turns round after round
    (the order rotating); the figures per round, their medians and ranges, and the targets."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    cores = usable_cores()
    competitors = cores if competitors is None else competitors
    engine = fair.Contender("paged engine", ("{python}", "-m", "inflight.bench.protocol.contender", "--mode", "paged", "-n",
                                              str(n)))
    run = run or fair.run_process
    rows: list[dict[str, Any]] = []
    for r in range(rounds):
        row = {}
        for name in [variants[(r + i) % len(variants)] for i in range(len(variants))]:
            quiet = run(engine, VARIANTS[name])
            with competitors_running(competitors):
                busy = run(engine, VARIANTS[name])
            row[name] = {"quiet": _brief(quiet), "busy": _brief(busy), "kept": busy["value"] / quiet["value"]}
            log(f"round {r + 1}/{rounds}: {name:<34} quiet {quiet['value']:6.0f} tok/s   busy {busy['value']:6.0f} "
                f"tok/s   kept {row[name]['kept']:4.0%}   (kernels on {quiet['kernels']['on']} / {busy['kernels']['on']})")
        rows.append({name: row[name] for name in variants})
    cells = {name: {"setting": VARIANTS[name].as_dict(),
                    "quiet": _spread([row[name]["quiet"]["value"] for row in rows]),
                    "busy": _spread([row[name]["busy"]["value"] for row in rows]),
                    "kept": _spread([row[name]["kept"] for row in rows])} for name in variants}
    quiet_others = [row[v]["quiet"]["other_cores_during"] for row in rows for v in variants]
    return {"requests": n, "cores": cores, "competitors": competitors, "rounds": rows, "variants": cells,
            "child_command": " ".join(engine.command).replace("{python}", "python"),
            "quiet_runs_other_cores_max": max((x for x in quiet_others if x is not None), default=None),
            "targets": targets(cells, [v for v in DEFAULT_VARIANTS if v in variants] or list(variants))}


def targets(cells: dict[str, dict[str, Any]], judged: Sequence[str]) -> dict[str, Any]:
    """Issue 24's two targets on the medians of the `judged` variants."""
    best = max(cells[v]["quiet"]["median"] for v in judged)
    quiet = {v: cells[v]["quiet"]["median"] / best for v in judged}
    kept = {v: cells[v]["kept"]["median"] for v in judged}
    return {"quiet_of_best": quiet, "quiet_within": QUIET_WITHIN, "kept": kept, "keep_at_least": KEEP_TARGET,
            "quiet_met": all(q >= 1 - QUIET_WITHIN for q in quiet.values()),
            "kept_met": all(k >= KEEP_TARGET for k in kept.values()),
            "met": all(q >= 1 - QUIET_WITHIN for q in quiet.values()) and all(k >= KEEP_TARGET for k in kept.values())}


def _brief(res: dict[str, Any]) -> dict[str, Any]:
    load = res.get("load") or {}
    return {"value": res["value"], "wall_s": res.get("wall_s"), "cpu_s": load.get("cpu_s"),
            "torch_threads": res.get("torch_threads"), "passive_wait": res.get("passive_wait"),
            "idle_wait": res.get("idle_wait"),
            "kernels": res.get("kernels"), "other_cores_during": load.get("other_cores_during")}


def _spread(xs: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "per_round": xs}


def measure_here(model: Any, n: int = 16, competitors: int | None = None) -> dict[str, Any]:
    """This process's own setting (whatever import order and thread policy it started with): the
    engine alone, then beside one CPU-bound program per core. Cheap enough for a notebook: no new
    processes for the engine, so only this process's setting is measured (`matrix` does the rest)."""
    cores = usable_cores()
    competitors = cores if competitors is None else competitors
    quiet = _engine_run(model, n)
    with competitors_running(competitors):
        busy = _engine_run(model, n)
    return {"requests": n, "cores": cores, "competitors": competitors, "quiet": quiet, "busy": busy,
            "kept": busy["tokens_per_s"] / quiet["tokens_per_s"]}


def _engine_run(model: Any, n: int) -> dict[str, Any]:
    """The paged engine on `n` long-tailed requests in this process, after a short warm-up."""
    import torch

    from inflight.bench.offline.prompts import make_workload
    from inflight.bench.offline.runners import run_engine
    from inflight.threads import LoadWatch, adaptive_threads_wanted, openmp_idle_wait, passive_wait_in_effect

    ctx = model.config.max_position_embeddings
    w = make_workload("long_tailed", n, 0, model.config.vocab_size, max_context=ctx)
    warm = make_workload("long_tailed", 2, 1, model.config.vocab_size, max_context=ctx)
    kw = dict(block_size=16, num_blocks=n * 16, max_batch_size=64, mode="paged")
    run_engine(model, warm, **kw)  # first-call costs (allocator, operator caches) out of the measurement
    with LoadWatch(sample_seconds=0.1) as watch:
        rec = run_engine(model, w, **kw)
    return {"tokens_per_s": w.useful_tokens / rec.wall, "wall_s": rec.wall, "cpu_s": watch.cpu_seconds,
            "threads": torch.get_num_threads(), "passive_wait": passive_wait_in_effect(), "idle_wait": openmp_idle_wait(),
            "adaptive_threads": adaptive_threads_wanted(), "other_cores_during": watch.other_cores}


def report(res: dict[str, Any]) -> str:
    t = res["targets"]
    lines = [f"{'variant':<34} {'quiet tok/s (range)':>22} {'busy tok/s (range)':>22} {'kept (range)':>16}"]
    for name, c in res["variants"].items():
        q, b, k = c["quiet"], c["busy"], c["kept"]
        lines.append(f"{name:<34} {q['median']:7.0f} ({q['min']:.0f}-{q['max']:.0f}){'':>4} "
                     f"{b['median']:7.0f} ({b['min']:.0f}-{b['max']:.0f}){'':>4} {k['median']:5.0%} ({k['min']:.0%}-{k['max']:.0%})")
    lines.append(f"targets (medians of {len(res['rounds'])} rounds): quiet within {t['quiet_within']:.0%} of the best "
                 f"variant: {'met' if t['quiet_met'] else 'not met'} ("
                 + ", ".join(f"{v} {x:.0%}" for v, x in t["quiet_of_best"].items()) + f"); busy keeps >= "
                 f"{t['keep_at_least']:.0%}: {'met' if t['kept_met'] else 'not met'}")
    if (res.get("quiet_runs_other_cores_max") or 0) >= 0.5:
        lines.append(f"note: the quiet runs were not quiet: other programs kept {res['quiet_runs_other_cores_max']:.1f} "
                     "core(s) busy during one of them")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.protocol.busy", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--num-requests", type=int, default=128)
    p.add_argument("--variants", default=";".join(DEFAULT_VARIANTS), help=f"';'-separated list of: {'; '.join(VARIANTS)}")
    p.add_argument("--competitors", type=int, default=None, help="spinning processes (default: one per core)")
    p.add_argument("--rounds", type=int, default=3, help="every variant this many times, taking turns")
    p.add_argument("--out", default=None, help="write the results JSON here")
    a = p.parse_args(argv)
    if a.num_requests < 1 or a.rounds < 1:
        p.error("--num-requests and --rounds must be >= 1")
    from inflight.threads import machine_load

    before = machine_load().as_dict()
    res = matrix([v.strip() for v in a.variants.split(";") if v.strip()], a.num_requests, a.rounds, a.competitors)
    res.update(load_before=before, load_after=machine_load().as_dict(),
               command="python -m inflight.bench.protocol.busy " + " ".join(sys.argv[1:] if argv is None else argv))
    print(report(res))
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
        print(f"results written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
