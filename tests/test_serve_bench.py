"""The load generator's arithmetic (no server needed): arrivals, per-token timing of chunks, vLLM's
figures and goodput."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from inflight.bench.serve import arrival_times, random_requests
from inflight.bench.serve.client import RequestResult, _take_chunk
from inflight.bench.serve.stats import calculate_metrics, is_good, parse_goodput, tpot


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 200), st.floats(0.1, 100), st.floats(0.1, 10))
def test_arrivals_start_at_zero_rise_and_last_n_over_rate(n, rate, burstiness):
    t = arrival_times(n, rate, burstiness, seed=1)
    assert len(t) == n and t[0] == 0.0 and all(a <= b for a, b in zip(t, t[1:]))
    assert t[-1] <= n / rate + 1e-9
    assert arrival_times(n, math.inf) == [0.0] * n


def test_bad_arrival_parameters_are_refused():
    with pytest.raises(ValueError, match="positive"):
        arrival_times(3, 0.0)
    with pytest.raises(ValueError, match="NAME:MILLISECONDS"):
        parse_goodput(["latency:5"])
    with pytest.raises(ValueError, match="positive"):
        parse_goodput(["ttft:-1"])
    assert parse_goodput(["ttft:200", "tpot:50"]) == {"ttft": 200.0, "tpot": 50.0}


def test_random_requests_are_reproducible_and_sized():
    a, b = random_requests(10, 40, 20, seed=3), random_requests(10, 40, 20, seed=3)
    assert a == b and all(39 <= len(r.prompt) <= 40 and r.output_len == 20 for r in a)


def _chunk(text, completion_tokens=None, finish=None):
    c = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if completion_tokens is not None:
        c["usage"] = {"prompt_tokens": 5, "completion_tokens": completion_tokens}
    return c


def test_a_chunk_of_k_tokens_is_k_arrivals_at_once():
    res, text = RequestResult(start_time=0.0), []
    n, last = 0, 0.0
    for chunk, now in [(_chunk("a", 1), 0.10), (_chunk("bcd", 4), 0.30), (_chunk("e", 5, "length"), 0.35)]:
        n, last = _take_chunk(chunk, res, text, n, now, last)
    assert n == 5 and res.ttft == pytest.approx(0.10) and res.prompt_len == 5
    assert res.itl == pytest.approx([0.20, 0.0, 0.0, 0.05])  # the stall shows once, then the tokens that waited
    assert "".join(text) == "abcde" and res.finish_reason == "length"


def test_without_running_usage_each_chunk_with_text_is_one_token():
    res, text = RequestResult(start_time=0.0), []
    n, last = 0, 0.0
    for chunk, now in [(_chunk("a"), 0.1), (_chunk(""), 0.15), (_chunk("b"), 0.2),
                       ({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}, 0.21)]:
        n, last = _take_chunk(chunk, res, text, n, now, last)
    assert n == 2 and res.itl == pytest.approx([0.1]) and res.output_len == 2


def _done(ttft, latency, n, itl=None):
    return RequestResult(success=True, prompt_len=10, output_len=n, ttft=ttft, latency=latency,
                         itl=itl if itl is not None else [(latency - ttft) / max(n - 1, 1)] * (n - 1))


def test_metrics_and_goodput():
    results = [_done(0.1, 1.0, 10), _done(0.5, 1.4, 10), _done(0.2, 0.2, 1), RequestResult(error="HTTP 503")]
    m = calculate_metrics(results, duration=2.0, slos={"ttft": 300, "tpot": 120}, percentiles=[50, 99])
    assert m["completed"] == 3 and m["failed"] == 1 and m["total_output_tokens"] == 21
    assert m["output_throughput"] == pytest.approx(10.5) and m["request_throughput"] == pytest.approx(1.5)
    assert tpot(results[0]) == pytest.approx(0.1) and tpot(results[2]) == 0.0
    assert [is_good(r, {"ttft": 300, "tpot": 120}) for r in results] == [True, False, True, False]
    assert m["request_goodput"] == pytest.approx(1.0)
    assert m["median_ttft_ms"] == pytest.approx(200) and m["mean_tpot_ms"] == pytest.approx(100)
    assert {"p50_itl_ms", "p99_itl_ms", "std_e2el_ms", "ttfts", "itls", "errors"} <= set(m)
    assert calculate_metrics(results, 2.0)["request_goodput"] is None  # no objectives: no goodput
