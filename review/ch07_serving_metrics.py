"""Chapter 7: serving_metrics(timeline) -> ttft, tpot, throughput."""
from _harness import run

from inflight.exercises import serving as serving_ex


def correct(timeline):
    ttft, tpot = {}, {}
    tokens, start, end = 0, float("inf"), float("-inf")
    for r in timeline:
        times = r["token_times"]
        ttft[r["id"]] = times[0] - r["arrival"]
        tpot[r["id"]] = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        tokens += len(times)
        start = min(start, r["arrival"])
        end = max(end, times[-1])
    return {"ttft": ttft, "tpot": tpot, "throughput": tokens / (end - start)}


def w1_span_from_first_token(timeline):
    # the span starts at the first token anyone got, not at the first arrival
    out = correct(timeline)
    tokens = sum(len(r["token_times"]) for r in timeline)
    start = min(r["token_times"][0] for r in timeline)
    end = max(r["token_times"][-1] for r in timeline)
    out["throughput"] = tokens / (end - start)
    return out


def w2_list_order(timeline):
    # trusts the list to be in arrival order: first entry's arrival to last entry's last token
    out = correct(timeline)
    tokens = sum(len(r["token_times"]) for r in timeline)
    out["throughput"] = tokens / (timeline[-1]["token_times"][-1] - timeline[0]["arrival"])
    return out


def w3_sorts_input(timeline):
    # sorts the caller's timeline in place by arrival first (the values are right)
    timeline.sort(key=lambda r: r["arrival"])
    return correct(timeline)


ANSWERS = [
    ("correct", None, correct),
    ("w1", "throughput span starts at the first token, not the first arrival", w1_span_from_first_token),
    ("w2", "span from timeline[0] arrival to timeline[-1] last token (assumes order)", w2_list_order),
    ("w3", "sorts the caller's timeline in place (mutates input)", w3_sorts_input),
]

if __name__ == "__main__":
    run("ch07", ANSWERS, serving_ex.check_serving_metrics)
