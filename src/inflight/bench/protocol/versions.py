"""`python -m inflight.bench.protocol.versions --before DIR`: did an engine change make it faster?

The same contender (`bench.protocol.contender`, the paged engine) from two checkouts of the package
-- `--before` (another tree's `src` folder, e.g. a `git worktree` of the commit before the change)
and this one -- by the fair protocol (`bench.protocol.fair`): each in its own process, at the same
setting, taking turns round after round, the tokens of every process checked against this tree's
one-at-a-time reference, on the cells of the workload matrix asked for (`bench.protocol.cells`).
Reports each cell's ratio after/before per round, with its median and range.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from inflight.bench.protocol import fair, matrix, side_by_side
from inflight.bench.protocol.cells import cell

__all__ = ["run", "main"]


def run(before_src: str, cells: Sequence[str], rounds: int = 3, log: fair.Log = print,
        setting: str | None = None) -> dict[str, Any]:
    """Per cell: the paged engine of `before_src` against this tree's, alternating, tokens checked,
    both at the engine's own default wait policy or at `setting` (a label of `setting_labels()`:
    the matrix compares with `generate` at the best one its search finds)."""
    if not (Path(before_src) / "inflight" / "bench" / "protocol" / "contender.py").exists():
        raise ValueError(f"{before_src} holds no inflight package with bench/protocol/contender.py")
    here = str(Path(__file__).resolve().parents[3])
    base = matrix._settings_default("paged") if setting is None else _setting(setting)
    out: dict[str, Any] = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "before": before_src,
                           "after": here, "rounds": rounds, "setting": base.as_dict(), "cells": {}}
    with tempfile.TemporaryDirectory(prefix="inflight-versions-") as tmp:
        for name in cells:
            c = cell(name)
            ref, _ = side_by_side.reference(Path(tmp) / "ref.json", c.num_requests, log, c.batch_size, **c.shape())
            command = side_by_side._command("paged", c.num_requests, False, c.batch_size, **c.shape())
            contenders = [fair.Contender(label, command, (fair.Setting(base.label, base.env + (("PYTHONPATH", src),),
                                                                     base.torch_first),))
                          for label, src in (("before", before_src), ("after", here))]
            res = fair.compare(contenders, rounds, 0, pairs=[("after", "before")], ref=ref, log=lambda s: log(f"  {s}"))
            out["cells"][name] = res
            r = res["summary"]["ratios"]["after/before"]
            log(f"{name}: after/before {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})")
    return out


def setting_labels() -> list[str]:
    """The settings `--setting` takes: every wait policy at this machine's thread count."""
    from inflight.threads import usable_cores

    return [s.label for s in matrix._settings(usable_cores())]


def _setting(label: str) -> fair.Setting:
    from inflight.threads import usable_cores

    found = [s for s in matrix._settings(usable_cores()) if s.label == label]
    if not found:
        raise ValueError(f"unknown setting {label!r}; this machine's: {'; '.join(setting_labels())}")
    return found[0]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.protocol.versions", description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="the other checkout's src folder")
    p.add_argument("--cells", nargs="+", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--setting", help="a wait policy for both (default: the engine's own), one of: "
                   + "; ".join(setting_labels()))
    p.add_argument("--out")
    a = p.parse_args(argv)
    try:
        [cell(n) for n in a.cells]
        res = run(a.before, a.cells, a.rounds, setting=a.setting)
    except ValueError as exc:
        p.error(str(exc))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
