"""A fair comparison: every system in its own process, at its own best settings, taking turns.

What "x times faster than the peer" needs before it means anything, on a machine whose speed drifts
by tens of percent from one minute to the next and where a process-wide setting of one system (the
OpenMP wait policy `import inflight` sets, a thread count) can handicap another:

1. **its own process**: each measurement is a fresh process running one system, so nothing one
   system sets (environment, thread pools, imports) reaches another;
2. **its own best settings, found**: every system is first run at each of its candidate settings
   (by default every thread count and OpenMP wait policy, `openmp_settings`), taking turns, and
   keeps the one with the best median — recorded with every setting tried and its figures;
3. **taking turns**: then the systems alternate, round after round (the order rotating), so the
   machine's drift hits each alike; the report gives each system's median and range, and each
   ratio per round, with its median and range;
4. **the same output**: every process's tokens are compared with one reference saved to disk, and
   a process whose tokens differ gets no figure.

A contender is any command that does one measurement and writes a JSON object to the file named by
`$INFLIGHT_RESULT`: `{"value": <higher is better, e.g. tokens/s>, "tokens": {request id: [ids]}, ...}`
(`inflight.bench.protocol.contender` is that command for this package's modes and the transformers peers;
a server benchmark can be another). `compare` runs the whole protocol.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from inflight.threads import SHORT_SPIN, environment_for_child

__all__ = ["Setting", "Contender", "POLICIES", "openmp_settings", "run_process", "TokenReference", "search", "alternate",
           "summarize", "spread", "compare", "RESULT_VAR"]

RESULT_VAR = "INFLIGHT_RESULT"
Log = Callable[[str], None]


@dataclass(frozen=True)
class Setting:
    """One way to run a contender: environment changes (a value of None unsets the variable) and,
    for a Python module, whether torch is imported before anything else (so that `import inflight`
    leaves torch's OpenMP wait policy at its default)."""

    label: str
    env: tuple[tuple[str, str | None], ...] = ()
    torch_first: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "env": dict(self.env), "torch_first": self.torch_first}


@dataclass(frozen=True)
class Contender:
    """A system to measure: its command (argv; `{python}` stands for this interpreter) and the
    settings to search (the first is where a search that can't run falls back)."""

    name: str
    command: tuple[str, ...]
    settings: tuple[Setting, ...] = (Setting("as is"),)


#: the OpenMP wait policies `openmp_settings` tries: the variables each sets (None: unset)
POLICIES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "default": (("OMP_WAIT_POLICY", None), ("GOMP_SPINCOUNT", None)),  # the library's own: spin for milliseconds
    "PASSIVE": (("OMP_WAIT_POLICY", "PASSIVE"), ("GOMP_SPINCOUNT", None)),  # sleep at once
    "ACTIVE": (("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", None)),  # spin (for minutes)
    # spin about 0.35 ms, then sleep: what `import inflight` first sets (inflight.threads.SHORT_SPIN)
    "short spin": (("OMP_WAIT_POLICY", "PASSIVE"), ("GOMP_SPINCOUNT", SHORT_SPIN)),
}


def openmp_settings(cores: int, policies: Sequence[str] = ("default", "PASSIVE", "ACTIVE", "short spin")
                    ) -> tuple[Setting, ...]:
    """Every thread count (1 .. cores; on more than 4 cores: 1, half, all) times every OpenMP wait
    policy of `POLICIES`: "default" is the library's own (torch imported first, nothing set). The
    first is torch's own default (every core, default policy): where nothing is searched, that one."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown wait policies {unknown}; choose from {list(POLICIES)}")
    counts = sorted({1, max(1, cores // 2), cores}) if cores > 4 else list(range(1, cores + 1))
    out = []
    for policy in policies:
        for n in reversed(counts):
            env = (("OMP_NUM_THREADS", str(n)),) + POLICIES[policy]
            out.append(Setting(f"{n} thread{'s' if n > 1 else ''}, {policy} wait", env, torch_first=policy == "default"))
    return tuple(out)


def _argv(command: Sequence[str], torch_first: bool) -> list[str]:
    argv = [sys.executable if a == "{python}" else a for a in command]
    if not torch_first:
        return argv
    if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
        raise ValueError(f"torch_first needs a `{{python}} -m module ...` command, got {list(command)}")
    # run the module as `python -m` would, after `import torch`
    code = (f"import torch, runpy, sys; sys.argv = {[argv[2]] + argv[3:]!r}; "
            f"runpy.run_module({argv[2]!r}, run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", code]


def run_process(contender: Contender, setting: Setting, timeout: float | None = None,
                extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """One measurement: the contender's command at `setting`, in a fresh process; its result JSON
    plus the process's wall time. A failed process raises RuntimeError with the end of its stderr."""
    env = environment_for_child()  # this process's own `import inflight` is no setting of the contender's
    for k, v in list(setting.env) + list((extra_env or {}).items()):
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    with tempfile.TemporaryDirectory(prefix="inflight-fair-") as tmp:
        env[RESULT_VAR] = path = os.path.join(tmp, "result.json")
        t0 = time.perf_counter()
        proc = subprocess.run(_argv(contender.command, setting.torch_first), env=env, capture_output=True,
                              text=True, timeout=timeout, check=False)
        wall = time.perf_counter() - t0
        if proc.returncode != 0 or not os.path.exists(path):
            raise RuntimeError(f"{contender.name} ({setting.label}) failed with exit status {proc.returncode}:\n"
                               f"{proc.stderr[-3000:]}")
        with open(path, encoding="utf-8") as f:
            res = json.load(f)
    if not isinstance(res.get("value"), (int, float)):
        raise RuntimeError(f"{contender.name} ({setting.label}) wrote no numeric 'value': {sorted(res)}")
    res["process_wall_s"] = wall
    return res


class TokenReference:
    """The tokens every process must produce, kept in a JSON file: `check(tokens)` says how many
    requests match and the first that doesn't."""

    def __init__(self, path: str | Path, tokens: dict[str, list[int]], source: str):
        self.path, self.tokens, self.source = Path(path), {k: list(v) for k, v in tokens.items()}, source

    @classmethod
    def save(cls, path: str | Path, tokens: dict[str, list[int]], source: str) -> "TokenReference":
        ref = cls(path, tokens, source)
        ref.path.parent.mkdir(parents=True, exist_ok=True)
        ref.path.write_text(json.dumps({"source": source, "tokens": ref.tokens}) + "\n", encoding="utf-8")
        return ref

    @classmethod
    def load(cls, path: str | Path) -> "TokenReference":
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(path, data["tokens"], data.get("source", "?"))

    def check(self, tokens: dict[str, list[int]] | None) -> dict[str, Any]:
        tokens = tokens or {}
        same = sum(tokens.get(k) == v for k, v in self.tokens.items())
        bad = next((k for k, v in self.tokens.items() if tokens.get(k) != v), None)
        out: dict[str, Any] = {"identical": same, "of": len(self.tokens), "ok": same == len(self.tokens)}
        if bad is not None:
            got = tokens.get(bad)
            at = next((i for i, (a, b) in enumerate(zip(got or [], self.tokens[bad])) if a != b),
                      min(len(got or []), len(self.tokens[bad])))
            out["first_difference"] = {"request": bad, "position": at, "missing": got is None}
        return out


Run = Callable[[Contender, Setting], dict[str, Any]]


def _measure(run: Run, c: Contender, s: Setting, ref: TokenReference | None) -> dict[str, Any]:
    res = run(c, s)
    check = ref.check(res.get("tokens")) if ref is not None else None
    out = {k: v for k, v in res.items() if k != "tokens"}
    out["token_check"] = check
    if check is not None and not check["ok"]:
        out["refused_value"], out["value"] = out["value"], None  # a figure for the wrong output is no figure
    return out


def search(contenders: Sequence[Contender], rounds: int, run: Run, ref: TokenReference | None = None,
           log: Log = print) -> dict[str, dict[str, Any]]:
    """Every setting of every contender, `rounds` times, taking turns; per contender, the setting
    with the best median value ("best") and every setting's figures ("tried")."""
    tried: dict[str, dict[str, list]] = {c.name: {s.label: [] for s in c.settings} for c in contenders}
    for r in range(rounds):
        for c in contenders:
            if len(c.settings) == 1:
                continue  # nothing to choose between
            for s in c.settings:
                m = _measure(run, c, s, ref)
                tried[c.name][s.label].append(m["value"])
                log(f"search {r + 1}/{rounds}: {c.name} at {s.label}: " + _fmt(m["value"]))
    out = {}
    for c in contenders:
        rows = [{"setting": s.as_dict(), "values": tried[c.name][s.label],
                 "median": _median([v for v in tried[c.name][s.label] if v is not None])} for s in c.settings]
        scored = [(row["median"], i) for i, row in enumerate(rows) if row["median"] is not None]
        best = max(scored)[1] if scored else 0
        out[c.name] = {"best": c.settings[best], "tried": rows}
    return out


def alternate(contenders: Sequence[Contender], best: dict[str, Setting], rounds: int, run: Run,
              ref: TokenReference | None = None, log: Log = print) -> list[dict[str, dict[str, Any]]]:
    """`rounds` rounds; in each, every contender once at its best setting, the order rotating (round
    r starts with contender r), so that none always runs first or after the same neighbour."""
    out = []
    for r in range(rounds):
        order = [contenders[(r + i) % len(contenders)] for i in range(len(contenders))]
        row = {}
        for c in order:
            row[c.name] = _measure(run, c, best[c.name], ref)
            check = row[c.name]["token_check"]
            log(f"round {r + 1}/{rounds}: {c.name} " + _fmt(row[c.name]["value"])
                + ("" if check is None or check["ok"] else f" (REFUSED: {check['identical']}/{check['of']} identical)"))
        out.append({name: row[name] for name in (c.name for c in contenders)})
    return out


def summarize(rows: list[dict[str, dict[str, Any]]], pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """Each contender's median and range over the rounds; each pair's ratio per round (a over b,
    only rounds where both have a figure), with its median and range."""
    names = list(rows[0]) if rows else []
    per = {n: spread([r[n]["value"] for r in rows if r[n]["value"] is not None]) for n in names}
    ratios = {}
    for a, b in pairs:
        xs = [r[a]["value"] / r[b]["value"] for r in rows if r[a]["value"] and r[b]["value"]]
        ratios[f"{a}/{b}"] = {"per_round": xs, **spread(xs)}
    return {"contenders": per, "ratios": ratios}


def compare(contenders: Sequence[Contender], rounds: int = 5, search_rounds: int = 1,
            pairs: Sequence[tuple[str, str]] = (), ref: TokenReference | None = None, run: Run | None = None,
            search_run: Run | None = None, search_ref: TokenReference | None = None, search_in_rounds: bool = False,
            log: Log = print) -> dict[str, Any]:
    """The whole protocol: search every contender's settings (with `search_run`, e.g. on a smaller
    workload, checked against `search_ref`; by default `run` and `ref`), then `rounds` alternating
    rounds at the best ones, every process's tokens checked against `ref`; the record a results
    file keeps. With `search_in_rounds` there is no separate search: every round runs every
    setting of every contender, and each contender's figures are those of its best setting (the
    cheaper way when settings are few)."""
    if rounds < 1 or search_rounds < 0:
        raise ValueError(f"rounds must be >= 1 and search_rounds >= 0, got {rounds} and {search_rounds}")
    run = run or run_process
    if search_in_rounds:
        found, rows = _search_in_rounds(contenders, rounds, run, ref, log)
    else:
        found = search(contenders, search_rounds, search_run or run, search_ref if search_run else ref, log) \
            if search_rounds else {c.name: {"best": c.settings[0], "tried": []} for c in contenders}
        for name, f in found.items():
            log(f"{name}: best setting {f['best'].label}")
        rows = alternate(contenders, {name: f["best"] for name, f in found.items()}, rounds, run, ref, log)
    return {"protocol": "each contender in its own process at its best setting, alternating (inflight.bench.protocol.fair)",
            "rounds": rows, "search_rounds": rounds if search_in_rounds else search_rounds,
            "search_in_rounds": search_in_rounds,
            "settings": {name: {"best": f["best"].as_dict(), "tried": f["tried"]} for name, f in found.items()},
            "commands": {c.name: list(c.command) for c in contenders},
            "reference": None if ref is None else {"path": str(ref.path), "source": ref.source,
                                                    "requests": len(ref.tokens)},
            "all_tokens_identical": all(m["token_check"] is None or m["token_check"]["ok"]
                                        for row in rows for m in row.values()),
            "summary": summarize(rows, pairs)}


def _search_in_rounds(contenders: Sequence[Contender], rounds: int, run: Run, ref: TokenReference | None,
                      log: Log) -> tuple[dict[str, dict[str, Any]], list[dict[str, dict[str, Any]]]]:
    """Every (contender, setting) as a contender of its own, alternating; then each contender's best."""
    each = {(c.name, s.label): Contender(f"{c.name} at {s.label}", c.command, (s,)) for c in contenders for s in c.settings}
    rows = alternate(list(each.values()), {e.name: e.settings[0] for e in each.values()}, rounds, run, ref, log)
    found, best_rows = {}, [{} for _ in rows]
    for c in contenders:
        tried = [{"setting": s.as_dict(), "values": [row[each[c.name, s.label].name]["value"] for row in rows]}
                 for s in c.settings]
        for t in tried:
            t["median"] = _median([v for v in t["values"] if v is not None])
        scored = [(t["median"], i) for i, t in enumerate(tried) if t["median"] is not None]
        best = c.settings[max(scored)[1] if scored else 0]
        found[c.name] = {"best": best, "tried": tried}
        log(f"{c.name}: best setting {best.label}")
        for out, row in zip(best_rows, rows):
            out[c.name] = row[each[c.name, best.label].name]
    return found, best_rows


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def spread(xs: list[float]) -> dict[str, Any]:
    """Median, lowest, highest and how many (None for each of the first three when there are none)."""
    return {"median": _median(xs), "min": min(xs, default=None), "max": max(xs, default=None), "n": len(xs)}


def _fmt(v: float | None) -> str:
    return "refused" if v is None else f"{v:.1f}"
