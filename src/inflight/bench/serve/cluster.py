"""`python -m inflight.bench.serve.cluster`: replicas behind `vllm-router`, one run per routing policy,
on a workload whose prompts share prefixes, and one run with a replica killed mid-way.

    python -m inflight.bench.serve.cluster --replicas 2 --output results/fleet_cpu.json
    python -m inflight.bench.serve.cluster --quick          # a smoke run: 2 policies, 6 sessions

The workload is chat-like (`session_workload`): a few system prompts; sessions that each take one of
them and send several turns, every turn resending the whole history so far (system prompt, earlier
questions, earlier answers) plus a new question, the next turn sent when the answer is in. So two
kinds of sharing: the system prompt between sessions, the history between the turns of one session.
Every request carries an `X-Session-ID` header (what `consistent_hash` hashes).

For each policy (`round_robin`, `power_of_two`, `cache_aware`, `consistent_hash`) a fresh fleet
(empty caches) serves the same workload; recorded: every replica's prefix-cache hit rate (its own
/metrics: hit tokens / queried tokens over the run), how many requests each served (the load
spread: max / mean), TTFT p50/p99, TPOT, goodput at the SLO. Then the fault run: the same kind of
workload through one policy; at `--kill-at` of the way one replica is SIGKILLed, later restarted on
its port; recorded: requests that failed and what their client saw, when the router's health check
marked the replica down and up again, when the last request failed.

Everything runs on 127.0.0.1 and is stopped by its PID (`inflight.bench.serve.fleet`). A pure HTTP
client and process starter: it imports no engine code.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from inflight.bench.serve.client import RequestResult, send_request, stream_payload
from inflight.bench.serve.fleet import POLICIES, Fleet
from inflight.bench.serve.stats import is_good, tpot

__all__ = ["Session", "session_workload", "run_sessions", "policy_run", "fault_run", "summarize", "main"]

_WORDS = ("def", "return", "self", "if", "else", "for", "in", "import", "value", "name", "path", "items", "None",
          "True", "len", "list", "dict", "key", "data", "result", "args", "line", "open", "with", "as", "not")


def _text(rng: random.Random, n: int) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < n:
        words.append(rng.choice(_WORDS))
    return " ".join(words)[:n]


@dataclass
class Session:
    """One conversation: its id, its system prompt, its questions (one per turn), when it starts."""

    session_id: str
    system: str
    questions: list[str]
    start: float


def session_workload(num_sessions: int, *, num_system_prompts: int = 4, turns: int = 3, system_len: int = 160,
                     question_len: int = 32, session_rate: float = 2.0, seed: int = 0) -> list[Session]:
    """`num_sessions` sessions starting as a Poisson process of `session_rate` per second, each with
    one of `num_system_prompts` system prompts (`system_len` characters = tokens for a byte-level
    model) and `turns` questions of `question_len` characters."""
    if num_sessions < 1 or num_system_prompts < 1 or turns < 1:
        raise ValueError("a workload needs at least one session, one system prompt and one turn")
    rng = random.Random(seed)
    systems = [f"# system {k} ({seed})\n" + _text(rng, system_len) + "\n" for k in range(num_system_prompts)]
    t, out = 0.0, []
    for i in range(num_sessions):
        out.append(Session(f"s{seed}-{i}", rng.choice(systems),
                           [f"\n>>> {_text(rng, question_len)}\n" for _ in range(turns)], t))
        t += rng.expovariate(session_rate)
    return out


@dataclass
class TurnResult:
    session_id: str
    turn: int
    sent: float            # seconds from the run's start
    prompt_chars: int
    result: RequestResult


async def run_sessions(base_url: str, sessions: Sequence[Session], *, output_len: int = 16, model: str = "inflight-tiny",
                       timeout_s: float = 120.0, on_turn=None) -> tuple[list[TurnResult], float]:
    """Play every session against `base_url` (its turns in order, each after the previous answer);
    returns each turn's result and the run's duration. A failed turn ends its session (a client whose
    answer did not come has no history to resend)."""
    import httpx

    url = base_url.rstrip("/") + "/v1/completions"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    results: list[TurnResult] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:
        start = time.perf_counter()

        async def play(s: Session) -> None:
            await asyncio.sleep(max(0.0, start + s.start - time.perf_counter()))
            history = s.system
            for turn, q in enumerate(s.questions):
                prompt = history + q
                sent = time.perf_counter() - start
                payload = stream_payload(model, prompt, output_len)
                res = await send_request(client, url, payload, headers={"X-Session-ID": s.session_id})
                results.append(TurnResult(s.session_id, turn, sent, len(prompt), res))
                if on_turn is not None:
                    on_turn(results[-1])
                if not res.success:
                    return
                history = prompt + res.generated_text

        await asyncio.gather(*(play(s) for s in sessions))
        duration = time.perf_counter() - start
    return results, duration


def _run(coro) -> Any:
    """Run `coro` to the end, also from inside a notebook (whose loop is running: a thread of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(out=asyncio.run(coro)))
    t.start()
    t.join()
    if "out" not in box:
        raise RuntimeError("the run failed (see the thread's traceback above)")
    return box["out"]


def _delta(after: list, before: list) -> list[dict | None]:
    return [None if a is None or b is None else {k: a[k] - b[k] for k in a} for a, b in zip(after, before)]


def summarize(turns: list[TurnResult], duration: float, per_replica: list[dict | None],
              slo_ms: dict[str, float]) -> dict[str, Any]:
    """The run's figures: hit rate per replica and overall, load spread, TTFT/TPOT percentiles, goodput."""
    done = [t.result for t in turns if t.result.success]
    ttft = np.array([r.ttft for r in done] or [0.0]) * 1000
    tp = np.array([tpot(r) for r in done] or [0.0]) * 1000
    later = np.array([t.result.ttft for t in turns if t.result.success and t.turn > 0] or [0.0]) * 1000
    reps = [r for r in per_replica if r is not None]
    q = sum(r["prefix_cache_query_tokens"] for r in reps)
    h = sum(r["prefix_cache_hit_tokens"] for r in reps)
    served = [r["requests"] for r in reps]
    return {
        "requests": len(turns), "completed": len(done), "failed": len(turns) - len(done), "duration_s": duration,
        "hit_rate": h / q if q else 0.0,
        "replica_hit_rate": [r["prefix_cache_hit_tokens"] / r["prefix_cache_query_tokens"]
                             if r and r["prefix_cache_query_tokens"] else None for r in per_replica],
        "replica_requests": [None if r is None else r["requests"] for r in per_replica],
        "load_spread_max_over_mean": (max(served) / (sum(served) / len(served))) if served and sum(served) else None,
        "p50_ttft_ms": float(np.percentile(ttft, 50)), "p99_ttft_ms": float(np.percentile(ttft, 99)),
        "p50_ttft_later_turns_ms": float(np.percentile(later, 50)),
        "p50_tpot_ms": float(np.percentile(tp, 50)), "p99_tpot_ms": float(np.percentile(tp, 99)),
        "request_throughput": len(done) / duration if duration > 0 else 0.0,
        "request_goodput": sum(is_good(r, slo_ms) for r in done) / duration if duration > 0 else 0.0,
        "slo_ms": slo_ms,
    }


def policy_run(fleet: Fleet, sessions: Sequence[Session], *, output_len: int = 16,
               slo_ms: dict[str, float] | None = None) -> dict[str, Any]:
    """One policy's run on `fleet` (whatever policy its router has): the figures of `summarize`."""
    slo_ms = slo_ms or {"ttft": 1000.0, "tpot": 200.0}
    before = fleet.replica_metrics()
    turns, duration = _run(run_sessions(fleet.router_url, sessions, output_len=output_len))
    out = summarize(turns, duration, _delta(fleet.replica_metrics(), before), slo_ms)
    out["policy"] = fleet.policy
    return out


def fault_run(fleet: Fleet, sessions: Sequence[Session], *, victim: int = 0, kill_at: float = 0.3,
              restart_at: float = 0.6, output_len: int = 16) -> dict[str, Any]:
    """The sessions through `fleet`; replica `victim` is SIGKILLed once `kill_at` of the turns have been
    answered (or have failed) and restarted on its port at `restart_at`. A watcher polls the router's
    `/workers` every 50 ms. Times are seconds from the run's start (the watcher's and the clients'
    clocks start within milliseconds of each other); the wait for the restarted replica to rejoin is
    bounded (120 s)."""
    total = sum(len(s.questions) for s in sessions)
    events: dict[str, float] = {}
    health: list[tuple[float, bool]] = []
    stop = threading.Event()
    t0 = time.perf_counter()
    done: list[TurnResult] = []  # (the turns answered or failed so far)

    def watch() -> None:
        url = fleet.urls[victim]
        while not stop.is_set():
            try:
                ok = next(w["is_healthy"] for w in fleet.workers() if w["url"] == url)
                if not health or health[-1][1] != ok:
                    health.append((time.perf_counter() - t0, ok))
            except Exception:  # noqa: BLE001 - the router is busy: try again
                pass
            if "kill" not in events and len(done) >= kill_at * total:
                fleet.kill(victim)
                events["kill"] = time.perf_counter() - t0
            elif "kill" in events and "restart" not in events and len(done) >= restart_at * total:
                events["restart_begin"] = time.perf_counter() - t0
                threading.Thread(target=_restart, daemon=True).start()
                events["restart"] = -1.0
            time.sleep(0.05)

    def _restart() -> None:
        fleet.restart(victim)
        events["restart"] = time.perf_counter() - t0

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    try:
        turns, duration = _run(run_sessions(fleet.router_url, sessions, output_len=output_len, on_turn=done.append))
        deadline = time.monotonic() + 120  # let the restarted replica rejoin before the report
        while time.monotonic() < deadline and not (health and health[-1][1] and events.get("restart", -1) > 0):
            time.sleep(0.1)
    finally:
        stop.set()
        w.join(10)
    failed = [t for t in turns if not t.result.success]
    kill = events.get("kill")
    down = next((t for t, ok in health if not ok), None)
    up = next((t for t, ok in health if ok and down is not None and t > down), None)
    return {
        "requests": len(turns), "failed": len(failed), "completed": len(turns) - len(failed),
        "kill_s": kill, "restart_began_s": events.get("restart_begin"), "restarted_s": events.get("restart"),
        "router_marked_down_s": down, "router_marked_up_s": up,
        "detection_s": None if down is None or kill is None else down - kill,
        "errors_seen_by_clients": sorted({t.result.error[:160] for t in failed}),
        "failed_sent_at_s": [round(t.sent, 3) for t in failed],
        "replica_requests_after": [None if m is None else m["requests"] for m in fleet.replica_metrics()],
        "health_timeline": health, "duration_s": duration,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inflight.bench.serve.cluster", description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    p.add_argument("--sessions", type=int, default=24)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--system-prompts", type=int, default=4)
    p.add_argument("--system-len", type=int, default=160)
    p.add_argument("--question-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--session-rate", type=float, default=2.0, help="sessions starting per second")
    p.add_argument("--num-blocks", type=int, default=128, help="KV blocks per replica")
    p.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    p.add_argument("--slo", nargs="+", default=["ttft:1000", "tpot:200"], metavar="NAME:MS")
    p.add_argument("--fault-policy", default="cache_aware", choices=POLICIES + ("none",))
    p.add_argument("--kill-at", type=float, default=0.25, help="share of the turns sent when a replica is killed")
    p.add_argument("--restart-at", type=float, default=0.4, help="share of the turns sent when it is restarted")
    p.add_argument("--fault-sessions", type=int, default=60, help="sessions of the fault run (long enough for "
                   "the restarted replica to load its model and take traffic again)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None)
    p.add_argument("--quick", action="store_true", help="a smoke run: round_robin and cache_aware, 6 sessions")
    args = p.parse_args(argv)
    if args.quick:
        args.policies, args.sessions, args.fault_policy = ["round_robin", "cache_aware"], 6, "none"
    from inflight.bench.serve.process import run_record, save_result
    from inflight.bench.serve.stats import parse_goodput
    from inflight.threads import LoadWatch

    slo = parse_goodput(args.slo)
    server_args = ["--enable-prefix-caching", "--num-blocks", str(args.num_blocks), "--threads", str(args.threads)]
    work = dict(num_system_prompts=args.system_prompts, turns=args.turns, system_len=args.system_len,
                question_len=args.question_len, session_rate=args.session_rate, seed=args.seed)
    runs, fault = [], None
    with LoadWatch() as watch:
        for policy in args.policies:
            with Fleet(args.replicas, policy=policy, server_args=server_args) as fleet:
                r = policy_run(fleet, session_workload(args.sessions, **work), output_len=args.output_len, slo_ms=slo)
            runs.append(r)
            print(f"{policy:>16}: hit rate {r['hit_rate']:.2f} per replica "
                  f"{[None if x is None else round(x, 2) for x in r['replica_hit_rate']]}, served {r['replica_requests']}, "
                  f"TTFT p50 {r['p50_ttft_ms']:.0f} ms p99 {r['p99_ttft_ms']:.0f} ms, "
                  f"goodput {r['request_goodput']:.2f} req/s, failed {r['failed']}", flush=True)
        if args.fault_policy != "none":
            with Fleet(args.replicas, policy=args.fault_policy, server_args=server_args,
                       router_args=["--health-check-interval-secs", "1"]) as fleet:
                fault = fault_run(fleet, session_workload(args.fault_sessions, **{**work, "seed": args.seed + 1}),
                                  kill_at=args.kill_at, restart_at=args.restart_at, output_len=args.output_len)
                fault["policy"] = args.fault_policy
            print("fault:", json.dumps({k: v for k, v in fault.items() if k != "health_timeline"}), flush=True)
    result = {**run_record("inflight.bench.serve.cluster", argv, watch), "settings": vars(args),
              "server_args": server_args, "policies": runs, "fault": fault}
    save_result(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
