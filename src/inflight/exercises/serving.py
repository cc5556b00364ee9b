"""Grader for the serving chapter: the three numbers every serving benchmark reports — time to
first token, time per output token, and throughput — computed from a request timeline.

A timeline is a list of requests, each a dict with `id`, `arrival` (seconds), `prompt_len`
(tokens) and `token_times` (when each generated token came out, seconds, same clock). The
function returns `{"ttft": {id: s}, "tpot": {id: s or None}, "throughput": tokens/s}`.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from inflight.exercises.answers import Flaw, as_number, as_optional_number, call_unchanged, type_name
from inflight.exercises.grading import Case, GradeResult, Mistake, grade, repeat_case

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


def _tpot_wait_over_gaps(timeline: Timeline) -> dict[str, Any]:
    out = serving_metrics(timeline)
    out["tpot"] = {r["id"]: None if len(r["token_times"]) == 1
                   else (r["token_times"][-1] - r["arrival"]) / (len(r["token_times"]) - 1) for r in timeline}
    return out


def _throughput_counts_gaps(timeline: Timeline) -> dict[str, Any]:
    out = serving_metrics(timeline)
    span = max(r["token_times"][-1] for r in timeline) - min(r["arrival"] for r in timeline)
    out["throughput"] = sum(len(r["token_times"]) - 1 for r in timeline) / span
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


def _single_token_tpot_zero(timeline: Timeline, fill: float = 0.0) -> dict[str, Any]:
    out = serving_metrics(timeline)
    out["tpot"] = {k: (fill if v is None else v) for k, v in out["tpot"].items()}
    return out


def _milliseconds(timeline: Timeline) -> dict[str, Any]:
    out = serving_metrics(timeline)
    for key in ("ttft", "tpot"):
        out[key] = {k: None if v is None else v * 1000 for k, v in out[key].items()}
    return out


def _requests_per_second(timeline: Timeline) -> dict[str, Any]:
    out = serving_metrics(timeline)
    span = max(r["token_times"][-1] for r in timeline) - min(r["arrival"] for r in timeline)
    out["throughput"] = len(timeline) / span
    return out


def _span_of_listed_ends(timeline: Timeline) -> dict[str, Any]:
    out = serving_metrics(timeline)
    span = timeline[-1]["token_times"][-1] - timeline[0]["arrival"]
    out["throughput"] = sum(len(r["token_times"]) for r in timeline) / span
    return out


def _span_is_sum_of_latencies(timeline: Timeline) -> dict[str, Any]:
    out = serving_metrics(timeline)
    span = sum(r["token_times"][-1] - r["arrival"] for r in timeline)
    out["throughput"] = sum(len(r["token_times"]) for r in timeline) / span
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
    Mistake("tpot includes the wait", _TPOT_WAIT, _tpot_wait_over_gaps),
    Mistake("ttft from the first arrival", "TTFT counts from the request's OWN arrival: measuring every request "
            "from the first one's arrival charges it the time before it even existed.",
            lambda tl: {**serving_metrics(tl), "ttft": {r["id"]: r["token_times"][0] - min(x["arrival"] for x in tl)
                                                        for r in tl}}),
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
    Mistake("tpot of one token is NaN", "A request with a single token has no gap between tokens: the text asks for "
            "None there (a NaN poisons every mean it enters).", lambda tl: _single_token_tpot_zero(tl, float("nan"))),
    Mistake("milliseconds instead of seconds", "The timeline is in seconds and so are TTFT and TPOT: don't multiply "
            "by 1000 (the chapter converts to ms only when it prints).", _milliseconds),
    Mistake("first tokens not counted", "Every generated token counts in throughput, the first one of each request "
            "too: count len(token_times), not the gaps between them.", _throughput_counts_gaps),
    Mistake("requests per second", "Throughput here is generated TOKENS per second: count every token in "
            "token_times, not the requests.", _requests_per_second),
    Mistake("span from the list's first and last entries", "The timeline is not sorted by arrival or by finish: the "
            "span runs from the EARLIEST arrival (min) to the LATEST token (max), wherever they are in the list.",
            _span_of_listed_ends),
    Mistake("span as the sum of request times", "The requests overlap in time: the span is one stretch of wall "
            "time, from the first arrival to the last token — adding each request's own duration counts the shared "
            "time again and again.", _span_is_sum_of_latencies),
]


# --- cases ----------------------------------------------------------------------------------------
_WHY = "The chapter passes its real timeline next, and the engine keeps using it."


def _per_request(out: dict, key: str, optional: bool) -> dict:
    value = out[key]
    if not isinstance(value, dict):
        raise Flaw(f"{key} is not a dict", f"{key} = {value!r:.80} ({type_name(value)})",
                   f'"{key}" must be a dict {{request id: seconds}}, keyed by each request\'s "id", so the chapter '
                   f'can look a request up by its id; yours is {type_name(value)}.', first=True)
    check = as_optional_number if optional else as_number
    return {k: check(v, f"{key}[{k!r}]", "a number of seconds" + (" (or None for a one-token request)"
                                                                   if optional else ""))
            for k, v in value.items()}


def _metrics(impl: Callable, tl: list[dict]) -> dict:
    out = call_unchanged(impl, [tl], ["the timeline"], _WHY)
    if not isinstance(out, dict):
        raise Flaw(f"returned {type_name(out)}", f"{out!r:.80} ({type_name(out)})",
                   f'serving_metrics returned {type_name(out)}; return a dict {{"ttft": ..., "tpot": ..., '
                   '"throughput": ...}.', first=True)
    missing = [k for k in ("ttft", "tpot", "throughput") if k not in out]
    if missing:
        raise Flaw(f"no {missing[0]!r} in the result", f"keys {sorted(map(str, out))}",
                   f'the result must have the keys "ttft", "tpot" and "throughput"; yours has no '
                   f'{", ".join(map(repr, missing))}.', first=True)
    return {"ttft": _per_request(out, "ttft", False), "tpot": _per_request(out, "tpot", True),
            "throughput": as_number(out["throughput"], 'out["throughput"]', "tokens per second, a number")}


def _tags(timeline: list[dict]) -> frozenset:
    tags = set()
    if any(len(r["token_times"]) == 1 for r in timeline):
        tags.add("one token")
    if min(r["arrival"] for r in timeline) > 0:
        tags.add("late start")
    arrivals = [r["arrival"] for r in timeline]
    ends = [r["token_times"][-1] for r in timeline]
    if arrivals != sorted(arrivals) or ends[-1] != max(ends):
        tags.add("unsorted")
    if any(not isinstance(r["id"], str) for r in timeline):
        tags.add("int ids")
    return frozenset(tags)


def _case(name: str, timeline: list[dict], describe: str) -> Case:
    return Case(name, lambda impl, tl=timeline: _metrics(impl, tl), describe, tags=_tags(timeline))


TAGS = {
    "one token": ("a request generated a single token",
                  "one token has no gap after it: its TPOT is None (and it still counts 1 token in throughput)."),
    "late start": ("the first request arrives after t = 0",
                   "measure from the requests' own arrivals: TTFT from each arrival, the span from the FIRST arrival."),
    "unsorted": ("the timeline is not in arrival order, or its last entry is not the last to finish",
                 "use min(arrivals) and max(last tokens), not the first and last entries of the list."),
    "int ids": ("the request ids are integers", "key ttft and tpot by each request's own id, whatever its type."),
}

RULES = {"ttft": "each request's first token time minus that request's own arrival",
         "tpot": "(last token − first token) / (number of tokens − 1) per request, None for a single token",
         "throughput": "all generated tokens / (the latest token time − the earliest arrival)"}

FACTORS = {1000.0: "your times are in milliseconds: the timeline and the answer are in seconds.",
           0.001: "your rate is per millisecond: throughput is tokens per second."}


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
        _case("listed out of order", [
            {"id": "late", "arrival": 1.0, "prompt_len": 3, "token_times": [1.2, 1.3]},
            {"id": "long", "arrival": 0.5, "prompt_len": 6, "token_times": [0.9, 1.4, 1.9, 2.4]},
            {"id": "first", "arrival": 0.2, "prompt_len": 2, "token_times": [0.4, 0.6, 0.8]}],
            "the requests are listed neither by arrival nor by finish: the last entry is not the last to finish"),
        _case("integer request ids", [{"id": 7, "arrival": 0.0, "prompt_len": 4, "token_times": [0.25, 0.5]},
                                      {"id": 3, "arrival": 0.1, "prompt_len": 4, "token_times": [0.5, 0.75, 1.0]}],
              "ids are ints, not strings"),
    ]
    for i in range(n_random):
        online = i % 2 == 1
        cs.append(_case(f"random {'online' if online else 'offline'} #{i}", _random_timeline(rng, online),
                        f"a random {'online' if online else 'offline'} timeline (seed {seed}, #{i})"))
    return cs + [repeat_case(cs)]


def check_serving_metrics(fn: Callable[[Timeline], dict], quiet: bool = False) -> GradeResult:
    """Grade the learner's `serving_metrics(timeline)`."""
    return grade("serving_metrics", fn, serving_metrics, cases(), MISTAKES, quiet=quiet, tags=TAGS, factors=FACTORS,
                 fields=RULES)
