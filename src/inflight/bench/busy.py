"""`python -m inflight.bench.busy`: the engine on a quiet machine and on a busy one, side by side.

A reader's laptop or a Colab CPU is rarely idle. This benchmark runs the same engine workload
(the tiny model, long-tailed requests) twice per thread setting: alone, then with one CPU-bound
competitor per core (plain `while True: pass` processes, started by this program in its own
process group, so the scheduler treats them like the engine's own siblings), and reports the
throughput kept under load. Fair share is 1/2: two programs per core.

Each run is a fresh Python process, because OpenMP reads its wait policy once, when torch loads:

- `inflight`   what `import inflight` gives: OMP_WAIT_POLICY=PASSIVE, then torch's default threads
               (one per core), and the engine's `ThreadGovernor`, which runs each step on the cores
               other programs leave free. Idle threads sleep at once.
- `fixed`      the same, without the governor (INFLIGHT_ADAPT_THREADS=0): every step on every core.
- `spin`       torch imported before inflight, no policy, no governor: GNU OpenMP's default, where
               an idle thread spins (busy-waits) for a while before it sleeps, and every parallel
               region ends at a barrier where all threads wait for the slowest.
- `one-thread` the same spinning library, but one thread: nothing to wait for at a barrier.

The target (issue 14): the default keeps >= 40 % of its quiet throughput (in every round, with
`--rounds`: on a shared machine one round can be luckier or unluckier than the next). Run it alone: other
programs on the machine are competitors you did not count (the report says how busy the quiet runs
really were).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from inflight.threads import usable_cores

__all__ = ["VARIANTS", "run_variant", "run_busy_benchmark", "measure_here", "competitors_running", "main"]

#: variant -> (environment changes, torch imported before inflight, torch threads or None for torch's default)
VARIANTS: dict[str, tuple[dict[str, str | None], bool, int | None]] = {
    "inflight": ({"OMP_WAIT_POLICY": None, "INFLIGHT_ADAPT_THREADS": None}, False, None),
    "fixed": ({"OMP_WAIT_POLICY": None, "INFLIGHT_ADAPT_THREADS": "0"}, False, None),
    "spin": ({"OMP_WAIT_POLICY": None, "INFLIGHT_ADAPT_THREADS": "0"}, True, None),
    "one-thread": ({"OMP_WAIT_POLICY": None, "INFLIGHT_ADAPT_THREADS": "0"}, True, 1),
}
KEEP_TARGET = 0.40
_SPIN = "while True: pass"


def _child(n: int, threads: int | None) -> dict[str, Any]:
    """One engine run in this process (the parent chose the environment); returns its figures."""
    import torch  # (for `spin`, the parent's command line imported it before inflight: OpenMP spins)

    from inflight.model.loading import load_tiny

    if threads:
        torch.set_num_threads(threads)
    return _engine_run(load_tiny()[0], n)


def _engine_run(model: Any, n: int) -> dict[str, Any]:
    """The paged engine on `n` long-tailed requests in this process, after a short warm-up."""
    import torch

    from inflight.bench.prompts import make_workload
    from inflight.bench.runners import run_engine
    from inflight.threads import LoadWatch, adaptive_threads_wanted, passive_wait_in_effect

    ctx = model.config.max_position_embeddings
    w = make_workload("long_tailed", n, 0, model.config.vocab_size, max_context=ctx)
    warm = make_workload("long_tailed", 2, 1, model.config.vocab_size, max_context=ctx)
    kw = dict(block_size=16, num_blocks=n * 16, max_batch_size=64, mode="paged")
    run_engine(model, warm, **kw)  # first-call costs (allocator, operator caches) out of the measurement
    with LoadWatch(sample_seconds=0.1) as watch:
        rec = run_engine(model, w, **kw)
    return {"tokens_per_s": w.useful_tokens / rec.wall, "wall_s": rec.wall, "cpu_s": watch.cpu_seconds,
            "threads": torch.get_num_threads(), "passive_wait": passive_wait_in_effect(),
            "adaptive_threads": adaptive_threads_wanted(),
            "other_cores_during": watch.other_cores}


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


def measure_here(model: Any, n: int = 16, competitors: int | None = None) -> dict[str, Any]:
    """This process's own setting (whatever thread policy it loaded torch with): the engine alone,
    then beside one CPU-bound program per core. Cheap enough for a notebook: no new processes for
    the engine, so only this process's setting is measured (the other settings need `run_variant`)."""
    cores = usable_cores()
    competitors = cores if competitors is None else competitors
    quiet = _engine_run(model, n)
    with competitors_running(competitors):
        busy = _engine_run(model, n)
    return {"requests": n, "cores": cores, "competitors": competitors, "quiet": quiet, "busy": busy,
            "kept": busy["tokens_per_s"] / quiet["tokens_per_s"]}


def _env(changes: dict[str, str | None]) -> dict[str, str]:
    env = dict(os.environ)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def run_variant(name: str, n: int, competitors: int) -> dict[str, Any]:
    """One engine run of variant `name` in a fresh process, with `competitors` spinning processes beside it."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; choose from {list(VARIANTS)}")
    changes, torch_first, threads = VARIANTS[name]
    # `python -m inflight.bench.busy` would import inflight (and set the policy) before anything else
    args = ["--child", "-n", str(n), "--threads", str(threads or 0)]
    code = (("import torch; " if torch_first else "")
            + f"import sys; from inflight.bench.busy import main; sys.exit(main({args!r}))")
    with competitors_running(competitors):
        out = subprocess.run([sys.executable, "-c", code], env=_env(changes), capture_output=True, text=True,
                             check=False)
    if out.returncode != 0:
        raise RuntimeError(f"variant {name!r} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_busy_benchmark(n: int = 64, variants: Sequence[str] = tuple(VARIANTS), competitors: int | None = None,
                       log: Any = print, rounds: int = 1) -> dict[str, Any]:
    """Quiet and busy runs of every variant, `rounds` times (interleaved, so that the machine's drift
    hits every variant alike); per variant the busy/quiet ratio of each round and the round with the
    median ratio; the target on the default, which must hold in every round."""
    from inflight.threads import machine_load

    cores = usable_cores()
    competitors = cores if competitors is None else competitors
    res: dict[str, Any] = {"requests": n, "cores": cores, "competitors": competitors, "rounds": rounds,
                           "load_before": machine_load().as_dict(), "variants": {}}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name in variants:
            quiet = run_variant(name, n, 0)
            busy = run_variant(name, n, competitors)
            runs[name].append({"quiet": quiet, "busy": busy, "kept": busy["tokens_per_s"] / quiet["tokens_per_s"]})
            log(f"{name:<11} quiet {quiet['tokens_per_s']:7.0f} tok/s   busy {busy['tokens_per_s']:7.0f} tok/s   "
                f"kept {runs[name][-1]['kept']:5.0%}   ({quiet['threads']} thread(s), idle threads "
                f"{'sleep' if quiet['passive_wait'] else 'spin'}, "
                f"{'steps fit to the free cores' if quiet.get('adaptive_threads') else 'fixed threads'})")
    for name, rs in runs.items():
        kept = sorted(r["kept"] for r in rs)
        median = next(r for r in rs if r["kept"] == kept[(len(kept) - 1) // 2])
        res["variants"][name] = {**median, "kept_min": kept[0], "kept_max": kept[-1],
                                 "kept_per_round": [r["kept"] for r in rs]}
    if "inflight" in res["variants"]:
        v = res["variants"]["inflight"]
        res["target"] = {"keep_at_least": KEEP_TARGET, "kept": v["kept"], "kept_min": v["kept_min"],
                         "met": v["kept_min"] >= KEEP_TARGET}
    quiet_others = [r["quiet"]["other_cores_during"] for rs in runs.values() for r in rs
                    if r["quiet"]["other_cores_during"] is not None]
    res["quiet_runs_other_cores_max"] = max(quiet_others) if quiet_others else None
    return res


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.busy", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--num-requests", type=int, default=64)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--competitors", type=int, default=None, help="spinning processes (default: one per core)")
    p.add_argument("--rounds", type=int, default=1, help="measure every variant this many times (interleaved)")
    p.add_argument("--out", default=None, help="write the results JSON here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.num_requests < 1:
        p.error(f"--num-requests must be >= 1, got {a.num_requests}")
    if a.child:
        print(json.dumps(_child(a.num_requests, a.threads or None)))
        return 0
    if a.rounds < 1:
        p.error(f"--rounds must be >= 1, got {a.rounds}")
    res = run_busy_benchmark(a.num_requests, [v.strip() for v in a.variants.split(",") if v.strip()], a.competitors,
                             rounds=a.rounds)
    if res.get("quiet_runs_other_cores_max") and res["quiet_runs_other_cores_max"] >= 0.5:
        print(f"note: the quiet runs were not quiet: other programs kept {res['quiet_runs_other_cores_max']:.1f} "
              "core(s) busy during one of them")
    if "target" in res:
        t = res["target"]
        spread = f" (lowest of {res['rounds']} rounds: {t['kept_min']:.0%})" if res["rounds"] > 1 else ""
        print(f"target: keep >= {t['keep_at_least']:.0%} of quiet throughput with one competitor per core, in every "
              f"round: {t['kept']:.0%}{spread} ({'met' if t['met'] else 'not met'})")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"results written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
