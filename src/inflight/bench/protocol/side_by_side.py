"""`python -m inflight.bench.protocol.side_by_side`: the paged engine against transformers, fairly.

The claim it settles: the paged engine over transformers `generate` (static batches of B) as a
multiple of the work-bound ideal (the row-steps static batching computes per token wanted; issue
24's target is >= 1.5x), and over transformers' own continuous batching. It runs the protocol of
`inflight.bench.protocol.fair`: each system in its own process (`inflight.bench.protocol.contender`), each at the best
of its thread counts and OpenMP wait policies (searched first, on a smaller workload, every setting
taking turns), then the systems alternating round after round at those settings; every process's
tokens are checked against a one-request-at-a-time reference saved to disk. With `--floor`, every
paged run also measures its own floor in its process (the linear layers at their best, one read of
the KV per step: `inflight.bench.protocol.floor`) and the report gives its time over that floor, per round.
"""
from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from inflight.bench.protocol import fair
from inflight.bench.offline.report import print_and_save, target_lines

__all__ = ["run", "report", "main", "contenders", "median_runs", "of_ideal", "TARGET_OF_IDEAL", "TARGET_FLOOR", "PEERS"]

TARGET_OF_IDEAL = 1.5  # paged over generate, as a multiple of the work-bound ideal
TARGET_FLOOR = 1.3     # the paged engine's time at most this many times its floor
PEERS = ("hf_static", "hf_continuous")


def _command(mode: str, n: int, floor: bool = False, batch_size: int = 64, **shape: Any) -> tuple[str, ...]:
    args = ["{python}", "-m", "inflight.bench.protocol.contender", "--mode", mode, "-n", str(n), "-B", str(batch_size)]
    if "prompt_range" in shape:
        args += ["--prompt-range", *map(str, shape["prompt_range"])]
    for key in ("output_mean", "output_cap", "seed", "model", "weights", "device"):
        if shape.get(key) is not None:
            args += [f"--{key.replace('_', '-')}", str(shape[key])]
    return tuple(args + (["--floor"] if floor else []))


def contenders(n: int, settings: Sequence[fair.Setting], floor: bool = False, batch_size: int = 64,
               **shape: Any) -> list[fair.Contender]:
    """The paged engine and the two transformers peers, each searched over `settings`. Where nothing
    is searched each runs at the first: the peers at torch's defaults (every core, OpenMP's own wait
    policy), the engine as `import inflight` first leaves it (every core, the short spin)."""
    return [fair.Contender(m, _command(m, n, floor and m == "paged", batch_size, **shape),
                           _own_default_first(settings) if m == "paged" else tuple(settings)) for m in ("paged", *PEERS)]


def _own_default_first(settings: Sequence[fair.Setting]) -> tuple[fair.Setting, ...]:
    """`settings` with the one `import inflight` first gives (the most threads, the short spin) in front."""
    def threads(s: fair.Setting) -> int:
        return int(dict(s.env).get("OMP_NUM_THREADS") or 0)

    most = max((threads(s) for s in settings), default=0)
    own = [s for s in settings if set(fair.POLICIES["short spin"]) <= set(s.env) and threads(s) == most][:1]
    return tuple(own + [s for s in settings if s not in own])


def reference(path: Path, n: int, log: fair.Log = print, batch_size: int = 64,
              **shape: Any) -> tuple[fair.TokenReference, dict[str, Any]]:
    """Every request served alone by our model (the benchmark's sequential mode), in its own
    process: the tokens every other process must reproduce, saved to `path`; and that run's record
    (the workload's work-bound ideal is in it)."""
    seq = fair.Contender("sequential", _command("sequential", n, False, batch_size, **shape))
    log(f"reference: {n} requests one at a time ...")
    res = fair.run_process(seq, seq.settings[0])
    return fair.TokenReference.save(path, res["tokens"], " ".join(seq.command).replace("{python}", "python")), res


def run(n: int = 256, rounds: int = 5, search_rounds: int = 1, search_n: int = 64, floor: bool = False,
        reference_path: str | Path = "side_by_side_reference_tokens.json", settings: Sequence[fair.Setting] | None = None,
        batch_size: int = 64, log: fair.Log = print, ref: fair.TokenReference | None = None,
        ideal: float | None = None, search_in_rounds: bool = False, **shape: Any) -> dict[str, Any]:
    """The whole comparison (see the module docstring); `shape` overrides the long-tailed workload's
    `prompt_range`, `output_mean`, `output_cap`, `seed`, and the benchmark's `model` (or `weights`, a
    model saved by `contender.save_model`). A caller that already has the reference tokens (the
    full benchmark's sequential run) and the workload's work-bound `ideal` passes them; with
    `search_in_rounds` every round runs every setting (`fair.compare`) instead of a separate search."""
    from inflight.threads import machine_load, usable_cores

    settings = tuple(settings or fair.openmp_settings(usable_cores()))
    before = machine_load().as_dict()
    ref_path = Path(reference_path)
    if ref is None or ideal is None:
        ref, seq = reference(ref_path, n, log, batch_size, **shape)
        ideal = seq["work_bound_ideal"]
    search_ref = search_run = None
    if search_rounds and not search_in_rounds:
        search_ref = reference(ref_path.with_name(ref_path.stem + f"_search{search_n}.json"), search_n, log,
                               batch_size, **shape)[0]
        searched = {c.name: c for c in contenders(search_n, settings, False, batch_size, **shape)}

        def search_run(c: fair.Contender, s: fair.Setting) -> dict[str, Any]:  # the same system, smaller workload
            return fair.run_process(searched[c.name], s)

    res = fair.compare(contenders(n, settings, floor, batch_size, **shape), rounds, search_rounds,
                       pairs=[("paged", "hf_static"), ("paged", "hf_continuous")], ref=ref, search_run=search_run,
                       search_ref=search_ref, search_in_rounds=search_in_rounds, log=log)
    res.update(status="ok", created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
               command="python -m inflight.bench.protocol.side_by_side " + " ".join(sys.argv[1:]), requests=n,
               batch_size=batch_size, search_requests=None if search_in_rounds else search_n,
               load_before=before, load_after=machine_load().as_dict(), target=_targets(res, ideal, floor))
    return res


def of_ideal(res: dict[str, Any], ideal: float) -> dict[str, Any]:
    """A fair run's paged-over-`generate` ratio as a multiple of the work-bound ideal: per round,
    median, range, how many rounds reached the target, and whether the median did."""
    over = res["summary"]["ratios"]["paged/hf_static"]
    per_round = [x / ideal for x in over["per_round"]]
    median = over["median"] / ideal if over["median"] else None
    return {"work_bound_ideal": ideal, "of_ideal_at_least": TARGET_OF_IDEAL, "of_ideal_per_round": per_round,
            "median_of_ideal": median, "min_of_ideal": min(per_round, default=None),
            "max_of_ideal": max(per_round, default=None), "rounds_measured": len(per_round),
            "rounds_met": sum(x >= TARGET_OF_IDEAL for x in per_round),
            "met": median is not None and median >= TARGET_OF_IDEAL}


def _targets(res: dict[str, Any], ideal: float, floor: bool) -> dict[str, Any]:
    t = of_ideal(res, ideal) | {"median_over_hf_continuous": res["summary"]["ratios"]["paged/hf_continuous"]["median"]}
    if floor:
        t["floor"] = _floor_target([row["paged"] for row in res["rounds"] if row["paged"].get("floor")])
    return t


def _floor_target(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The paged engine's time over its floor: each round's run over the floor measured right after
    it, in its process; and, since the machine's speed drifts between minutes and a floor is the best
    the work allows, the median run over the lowest floor any round measured (the same steps every
    round: the schedule doesn't depend on timing)."""
    per_round = [r["floor"]["wall_over_floor"] for r in runs]
    floors = [r["floor"].get("floor_s", r["floor"]["linear_layers_s"] + r["floor"]["kv_read_s"]) for r in runs]
    out: dict[str, Any] = {"wall_over_floor_at_most": TARGET_FLOOR, "per_round": per_round,
                           **fair.spread(per_round)}
    if runs:
        walls = sorted(r["wall_s"] for r in runs)
        out |= {"lowest_floor_s": min(floors), "floors_s": floors, "median_wall_s": walls[(len(walls) - 1) // 2],
                "median_wall_over_lowest_floor": walls[(len(walls) - 1) // 2] / min(floors)}
    out["met"] = bool(runs) and out["median"] <= TARGET_FLOOR
    return out


def median_runs(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each system's run from its median round (the lower middle one), as the full benchmark's table
    shows a mode: its summary, with status "outputs differ" where its tokens weren't the reference's."""
    out = {}
    for name in res["summary"]["contenders"]:
        runs = [row[name] for row in res["rounds"]]
        ok = sorted((r for r in runs if r["value"] is not None), key=lambda r: r["value"])
        pick = ok[(len(ok) - 1) // 2] if ok else runs[0]
        summary = dict(pick.get("summary") or {"mode": name, "title": name})
        if pick["value"] is None:
            summary.update(status="outputs differ", tokens_per_s=None,
                           reason=f"tokens differ from the reference: {pick['token_check']}")
        out[name] = summary
    return out


def report(res: dict[str, Any]) -> str:
    if res["status"] != "ok":
        return f"side-by-side run unavailable: {res['reason']}"
    t, s = res["target"], res["summary"]["contenders"]
    lines = [f"{name}: best setting {v['best']['label']}" for name, v in res["settings"].items()]
    lines += [f"{name}: median {v['median']:.0f} tokens/s, range {v['min']:.0f}-{v['max']:.0f} over {v['n']} rounds"
              for name, v in s.items() if v["n"]]
    lines += target_lines(t)
    lines.append("every process's tokens identical to the reference: " + ("yes" if res["all_tokens_identical"] else "NO"))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.protocol.side_by_side", description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--num-requests", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--search-rounds", type=int, default=1, help="rounds of the settings search (0: no search)")
    p.add_argument("--search-n", type=int, default=64, help="requests of the search's workload")
    p.add_argument("--floor", action="store_true", help="every paged run also measures its floor")
    p.add_argument("--out", help="write the results JSON here (the reference tokens go beside it)")
    a = p.parse_args(argv)
    if a.num_requests < 1 or a.rounds < 1 or a.search_n < 1 or a.search_rounds < 0:
        p.error("--num-requests, --rounds and --search-n must be >= 1, --search-rounds >= 0")
    out = Path(a.out) if a.out else None
    ref = out.with_name(out.stem + "_reference_tokens.json") if out else Path("side_by_side_reference_tokens.json")
    res = run(a.num_requests, a.rounds, a.search_rounds, a.search_n, a.floor, ref)
    return print_and_save(res, report(res), a.out)


if __name__ == "__main__":
    raise SystemExit(main())
