"""The serving grader accepts the reference, rejects independently written wrong answers with the
right explanation, and reports a stub as not implemented."""
import pytest

from inflight.exercises.serving import EXAMPLE, check_serving_metrics, serving_metrics


def test_reference_passes():
    assert check_serving_metrics(serving_metrics, quiet=True)


def test_worked_example_numbers():
    out = serving_metrics(EXAMPLE)
    assert out["ttft"] == pytest.approx({"a": 0.5, "b": 0.4, "c": 0.5})
    assert out["tpot"]["a"] == pytest.approx(0.1) and out["tpot"]["b"] == pytest.approx(0.3)
    assert out["tpot"]["c"] is None
    assert out["throughput"] == pytest.approx(7 / 1.5)


def test_an_equivalent_rewrite_passes():
    def mine(timeline):
        first_arrival = min(r["arrival"] for r in timeline)
        end = max(max(r["token_times"]) for r in timeline)
        n = 0
        ttft, tpot = {}, {}
        for r in sorted(timeline, key=lambda r: r["id"]):
            ts = r["token_times"]
            n += len(ts)
            ttft[r["id"]] = ts[0] - r["arrival"]
            gaps = [b - a for a, b in zip(ts, ts[1:])]
            tpot[r["id"]] = sum(gaps) / len(gaps) if gaps else None
        return {"throughput": n / (end - first_arrival), "ttft": ttft, "tpot": tpot}

    assert check_serving_metrics(mine, quiet=True)


def test_stub_is_not_implemented():
    def stub(timeline):
        raise NotImplementedError("fill me in")

    res = check_serving_metrics(stub, quiet=True)
    assert not res and res.not_implemented


# --- mutants, written here independently of the package's Mistakes -----------------------------------
def _base(timeline):
    ttft = {r["id"]: r["token_times"][0] - r["arrival"] for r in timeline}
    tpot = {}
    for r in timeline:
        ts = r["token_times"]
        tpot[r["id"]] = None if len(ts) < 2 else (ts[-1] - ts[0]) / (len(ts) - 1)
    total = sum(len(r["token_times"]) for r in timeline)
    t0 = min(r["arrival"] for r in timeline)
    t1 = max(r["token_times"][-1] for r in timeline)
    return ttft, tpot, total, t0, t1


def mutant_gaps_over_count(timeline):
    ttft, tpot, total, t0, t1 = _base(timeline)
    for r in timeline:
        ts = r["token_times"]
        tpot[r["id"]] = (ts[-1] - ts[0]) / len(ts)
    return {"ttft": ttft, "tpot": tpot, "throughput": total / (t1 - t0)}


def mutant_latency_per_token(timeline):
    ttft, tpot, total, t0, t1 = _base(timeline)
    tpot = {r["id"]: (r["token_times"][-1] - r["arrival"]) / len(r["token_times"]) for r in timeline}
    return {"ttft": ttft, "tpot": tpot, "throughput": total / (t1 - t0)}


def mutant_gaps_over_count_keeps_none(timeline):  # the n-vs-(n - 1) slip alone: one token still gives None
    ttft, tpot, total, t0, t1 = _base(timeline)
    for r in timeline:
        ts = r["token_times"]
        if len(ts) > 1:
            tpot[r["id"]] = (ts[-1] - ts[0]) / len(ts)
    return {"ttft": ttft, "tpot": tpot, "throughput": total / (t1 - t0)}


def mutant_latency_per_token_keeps_none(timeline):
    ttft, tpot, total, t0, t1 = _base(timeline)
    for r in timeline:
        if tpot[r["id"]] is not None:
            tpot[r["id"]] = (r["token_times"][-1] - r["arrival"]) / len(r["token_times"])
    return {"ttft": ttft, "tpot": tpot, "throughput": total / (t1 - t0)}


def mutant_span_from_first_token(timeline):
    ttft, tpot, total, t0, t1 = _base(timeline)
    first = min(r["token_times"][0] for r in timeline)
    return {"ttft": ttft, "tpot": tpot, "throughput": total / (t1 - first)}


def mutant_absolute_first_token(timeline):
    ttft, tpot, total, t0, t1 = _base(timeline)
    ttft = {r["id"]: r["token_times"][0] for r in timeline}
    return {"ttft": ttft, "tpot": tpot, "throughput": total / (t1 - t0)}


def mutant_counts_prompt(timeline):
    ttft, tpot, total, t0, t1 = _base(timeline)
    total += sum(r["prompt_len"] for r in timeline)
    return {"ttft": ttft, "tpot": tpot, "throughput": total / (t1 - t0)}


def mutant_average_rate(timeline):
    ttft, tpot, total, t0, t1 = _base(timeline)
    per = [len(r["token_times"]) / (r["token_times"][-1] - r["arrival"]) for r in timeline]
    return {"ttft": ttft, "tpot": tpot, "throughput": sum(per) / len(per)}


def mutant_span_from_zero(timeline):
    ttft, tpot, total, t0, t1 = _base(timeline)
    return {"ttft": ttft, "tpot": tpot, "throughput": total / t1}


def mutant_zero_for_single(timeline):
    ttft, tpot, total, t0, t1 = _base(timeline)
    tpot = {k: v if v is not None else 0.0 for k, v in tpot.items()}
    return {"ttft": ttft, "tpot": tpot, "throughput": total / (t1 - t0)}


@pytest.mark.parametrize("mutant, mistake", [
    (mutant_gaps_over_count, "tpot divided by n"),
    (mutant_latency_per_token, "tpot includes the wait"),
    (mutant_absolute_first_token, "ttft from the clock's zero"),
    (mutant_counts_prompt, "prompt tokens counted"),
    (mutant_average_rate, "mean of per-request rates"),
    (mutant_span_from_zero, "span from the clock's zero"),
    (mutant_zero_for_single, "tpot of one token is zero"),
    (mutant_gaps_over_count_keeps_none, "tpot divided by n"),
    (mutant_latency_per_token_keeps_none, "tpot includes the wait"),
    (mutant_span_from_first_token, "span from the first token"),
])
def test_mutants_are_caught_and_explained(mutant, mistake):
    res = check_serving_metrics(mutant, quiet=True)
    assert not res
    assert res.mistake == mistake, (res.mistake, res.report)
    assert res.report.count("💡") == 1 and "🤔" not in res.report
    assert res.explanation


def test_crashing_answer_fails_cleanly():
    def crashes(timeline):
        return {"ttft": {}, "tpot": {}, "throughput": 1 / 0}

    res = check_serving_metrics(crashes, quiet=True)
    assert not res and not res.not_implemented


def test_wrong_return_type_fails():
    res = check_serving_metrics(lambda tl: [1, 2, 3], quiet=True)
    assert not res and res.mistake == "returned a list" and "return a dict" in res.report
