"""Grader for the serving chapter: the three numbers every serving benchmark reports — time to
first token, time per output token, and throughput — computed from a request timeline.

A timeline is a list of requests, each a dict with `id`, `arrival` (seconds), `prompt_len`
(tokens) and `token_times` (when each generated token came out, seconds, same clock). The
function returns `{"ttft": {id: s}, "tpot": {id: s or None}, "throughput": tokens/s}`.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from inflight.exercises.grading import Case, GradeResult, Mistake, grade

Timeline = Sequence[dict]


def serving_metrics(timeline: Timeline) -> dict[str, Any]:
    """TTFT = first token − arrival; TPOT = time between the first and last token over the gaps
    between them (None with one token); throughput = generated tokens over the span from the first
    arrival to the last token."""
    ttft, tpot = {}, {}
    for r in timeline:
        times = r["token_times"]
        ttft[r["id"]] = times[0] - r["arrival"]
        tpot[r["id"]] = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
    tokens = sum(len(r["token_times"]) for r in timeline)
    span = max(r["token_times"][-1] for r in timeline) - min(r["arrival"] for r in timeline)
    return {"ttft": ttft, "tpot": tpot, "throughput": tokens / span}


def timeline_from_outputs(outputs: Sequence[Any], start: float = 0.0) -> list[dict]:
    """A timeline from the engine's `RequestOutput`s (their perf_counter times shifted by `start`)."""
    return [{"id": o.request_id, "arrival": o.arrival_time - start, "prompt_len": len(o.prompt_token_ids),
             "token_times": [t - start for t in o.token_times]} for o in outputs]


# --- classic mistakes ---------------------------------------------------------------------------
def _tpot_over_n(timeline: Timeline, none_for_one: bool = False) -> dict[str, Any]:
    out = serving_metrics(timeline)
    out["tpot"] = {r["id"]: None if none_for_one and len(r["token_times"]) == 1
                   else (r["token_times"][-1] - r["token_times"][0]) / len(r["token_times"]) for r in timeline}
    return out


def _tpot_includes_ttft(timeline: Timeline, none_for_one: bool = False) -> dict[str, Any]:
    out = serving_metrics(timeline)
    out["tpot"] = {r["id"]: None if none_for_one and len(r["token_times"]) == 1
                   else (r["token_times"][-1] - r["arrival"]) / len(r["token_times"]) for r in timeline}
    return out


def _ttft_from_zero(timeline: Timeline) -> dict[str, Any]:
    out = serving_metrics(timeline)
    out["ttft"] = {r["id"]: r["token_times"][0] for r in timeline}
    return out


def _throughput_counts_prompts(timeline: Timeline) -> dict[str, Any]:
    out = serving_metrics(timeline)
    tokens = sum(len(r["token_times"]) + r["prompt_len"] for r in timeline)
    span = max(r["token_times"][-1] for r in timeline) - min(r["arrival"] for r in timeline)
    out["throughput"] = tokens / span
    return out


def _throughput_mean_of_rates(timeline: Timeline) -> dict[str, Any]:
    out = serving_metrics(timeline)
    rates = [len(r["token_times"]) / (r["token_times"][-1] - r["arrival"]) for r in timeline]
    out["throughput"] = sum(rates) / len(rates)
    return out


def _throughput_from_clock_zero(timeline: Timeline) -> dict[str, Any]:
    out = serving_metrics(timeline)
    out["throughput"] = sum(len(r["token_times"]) for r in timeline) / max(r["token_times"][-1] for r in timeline)
    return out


def _throughput_from_first_token(timeline: Timeline) -> dict[str, Any]:
    out = serving_metrics(timeline)
    span = max(r["token_times"][-1] for r in timeline) - min(r["token_times"][0] for r in timeline)
    out["throughput"] = sum(len(r["token_times"]) for r in timeline) / span
    return out


def _single_token_tpot_zero(timeline: Timeline) -> dict[str, Any]:
    out = serving_metrics(timeline)
    out["tpot"] = {k: (0.0 if v is None else v) for k, v in out["tpot"].items()}
    return out


_TPOT_OVER_N = ("TPOT is the time *between* tokens: n tokens have n − 1 gaps after the first one, so divide "
                "(last − first) by n − 1, not n.")
_TPOT_WAIT = ("TPOT starts at the first token. Measuring from arrival folds the queueing and the prefill (that is "
              "TTFT's job) into every token.")

MISTAKES = [  # the two TPOT slips twice: with a one-token request's TPOT left at None as asked, and without
    Mistake("tpot divided by n", _TPOT_OVER_N, _tpot_over_n),
    Mistake("tpot divided by n", _TPOT_OVER_N, lambda tl: _tpot_over_n(tl, none_for_one=True)),
    Mistake("tpot includes the wait", _TPOT_WAIT, _tpot_includes_ttft),
    Mistake("tpot includes the wait", _TPOT_WAIT, lambda tl: _tpot_includes_ttft(tl, none_for_one=True)),
    Mistake("ttft from the clock's zero", "TTFT counts from the request's own arrival, not from the start of the "
            "run — with online arrivals a late request would look slow for nothing.", _ttft_from_zero),
    Mistake("prompt tokens counted", "Useful throughput counts generated tokens only; prompt tokens are input, "
            "and counting them rewards long prompts.", _throughput_counts_prompts),
    Mistake("mean of per-request rates", "Throughput is the system's rate: all generated tokens over one span of "
            "wall time. Averaging each request's own rate ignores that they ran at the same time.",
            _throughput_mean_of_rates),
    Mistake("span from the clock's zero", "The span starts at the first arrival, not at time 0: time before any "
            "request existed is not the server's.", _throughput_from_clock_zero),
    Mistake("span from the first token", "The span starts at the first arrival, not at the first token: the time "
            "the first requests waited for their first token is the server's time too.", _throughput_from_first_token),
    Mistake("tpot of one token is zero", "A request with a single token has no gap between tokens: its TPOT is "
            "undefined (None), and a 0 would pull the average down.", _single_token_tpot_zero),
]


# --- cases ----------------------------------------------------------------------------------------
def _rounded(result: Any) -> Any:
    if isinstance(result, dict):
        return {k: _rounded(v) for k, v in result.items()}
    if isinstance(result, float):
        return round(result, 9)
    return result


def _case(name: str, timeline: list[dict], describe: str) -> Case:
    def run(impl: Callable, tl=timeline) -> Any:
        out = impl([dict(r, token_times=list(r["token_times"])) for r in tl])
        if not isinstance(out, dict):
            return f"returned {type(out).__name__}, not a dict"
        return _rounded({k: out.get(k) for k in ("ttft", "tpot", "throughput")})

    return Case(name, run, describe)


def _random_timeline(rng: random.Random, online: bool) -> list[dict]:
    reqs, t = [], rng.uniform(0.5, 2.0) if online else 0.0
    for i in range(rng.randint(2, 8)):
        arrival = round(t, 3)
        first = arrival + rng.uniform(0.05, 1.0)
        n = rng.choice([1, 2, 3, 5, 8, 13])
        times = [round(first + k * rng.uniform(0.02, 0.1), 4) for k in range(n)]
        times = sorted(times)
        reqs.append({"id": f"q{i}", "arrival": arrival, "prompt_len": rng.randint(1, 50), "token_times": times})
        if online:
            t += rng.expovariate(2.0)
    return reqs


EXAMPLE = [  # the chapter's worked example
    {"id": "a", "arrival": 0.0, "prompt_len": 4, "token_times": [0.5, 0.6, 0.7, 0.8]},
    {"id": "b", "arrival": 0.2, "prompt_len": 8, "token_times": [0.6, 0.9]},
    {"id": "c", "arrival": 1.0, "prompt_len": 2, "token_times": [1.5]},
]


def cases(seed: int = 0, n_random: int = 12) -> list[Case]:
    rng = random.Random(seed)
    cs = [
        _case("worked example", EXAMPLE, "the three requests of the chapter's worked example"),
        _case("offline batch", [{"id": "x", "arrival": 0.0, "prompt_len": 3, "token_times": [1.0, 1.5, 2.0]},
                                {"id": "y", "arrival": 0.0, "prompt_len": 5, "token_times": [1.0, 1.25]}],
              "two requests that arrived together at t = 0"),
        _case("late arrivals", [{"id": "p", "arrival": 10.0, "prompt_len": 1, "token_times": [10.4, 10.6, 10.8]},
                                {"id": "q", "arrival": 11.0, "prompt_len": 30, "token_times": [11.2, 11.3]}],
              "an online run whose first request arrives at t = 10 s"),
        _case("one token each", [{"id": "s", "arrival": 0.0, "prompt_len": 2, "token_times": [0.3]},
                                 {"id": "t", "arrival": 0.1, "prompt_len": 2, "token_times": [0.4, 0.5]}],
              "a request that generated a single token"),
        _case("long prompts", [{"id": "l", "arrival": 0.0, "prompt_len": 500, "token_times": [2.0, 2.1, 2.2]}],
              "one request with a 500-token prompt"),
    ]
    for i in range(n_random):
        online = i % 2 == 1
        cs.append(_case(f"random {'online' if online else 'offline'} #{i}", _random_timeline(rng, online),
                        f"a random {'online' if online else 'offline'} timeline (seed {seed}, #{i})"))
    return cs


def check_serving_metrics(fn: Callable[[Timeline], dict], quiet: bool = False) -> GradeResult:
    """Grade the learner's `serving_metrics(timeline)`."""
    return grade("serving_metrics", fn, serving_metrics, cases(), MISTAKES, quiet=quiet)
