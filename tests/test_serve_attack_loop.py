"""The engine loop behind the server, attacked: aborts that race the end of a request, a reused
request id, clients that leave at every moment, a model that raises for one request or for all,
and the metrics, which must agree with what the clients were told."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from serve_helpers import WAIT_S, InProcessServer, dechunk, parse_response, read_all, read_until, tiny_engine  # noqa: E402

PROMPT = "def add(a, b):"


def _engine(tiny, **kw):
    return tiny_engine(tiny, **{"max_batch_size": 4, **kw})


def _samples(text: str) -> dict[str, float]:
    """Prometheus text parsed by prometheus_client's own parser: {name{labels}: value}."""
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name + json.dumps(s.labels, sort_keys=True): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _get(samples: dict, name: str, **labels) -> float:
    return sum(v for k, v in samples.items() if k.split("{")[0] == f"inflight:{name}"
               and all(f'"{a}": "{b}"' in k for a, b in labels.items()))


# -- metrics -----------------------------------------------------------------------------------------
def test_metrics_agree_with_what_the_clients_saw(tiny):
    """Prompt and generation token totals are the sums of the clients' `usage` (vLLM counts a request's
    whole prompt once, at its first token, also when the prefix cache supplied part of it), and
    each histogram counts each finished request once."""
    srv = InProcessServer(_engine(tiny, enable_prefix_caching=True))
    try:
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key="x", timeout=WAIT_S, max_retries=0)
        shared = "def shared_prefix_of_many_requests(x, y, z):\n    " * 2
        usage = [client.completions.create(model=srv.model, prompt=shared + str(i), max_tokens=5 + i).usage
                 for i in range(4)]
        srv.wait_clean()
        status, _, raw = srv.request("GET", "/metrics")
        m = _samples(raw.decode())
    finally:
        srv.stop()
    assert _get(m, "prefix_cache_hits_total") > 0  # (the case this test is about)
    assert _get(m, "prompt_tokens_total") == sum(u.prompt_tokens for u in usage)
    assert _get(m, "generation_tokens_total") == sum(u.completion_tokens for u in usage)
    assert _get(m, "request_success_total", finished_reason="length") == 4
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert _get(m, hist + "_count") == 4, hist
    assert _get(m, "inter_token_latency_seconds_count") == sum(u.completion_tokens - 1 for u in usage)
    assert {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "num_preemptions_total",
            "prefix_cache_queries_total"} <= {k.split("{")[0].removeprefix("inflight:") for k in m}


def test_an_abort_that_comes_after_the_end_counts_nothing_twice(tiny):
    """A client that leaves after its request ended but before it read the end sends an abort the
    loop must ignore — without recounting the last step in the metrics."""
    from inflight import SamplingParams
    from inflight.serve.async_engine import AsyncEngine
    from inflight.serve.metrics import ServerMetrics
    from inflight.serve.output_collector import StreamDelta

    prom = ServerMetrics("m")

    async def main():
        ae = AsyncEngine(_engine(tiny), observer=prom)
        await ae.start()
        ids, params = ae.engine.check_request(PROMPT, SamplingParams(max_tokens=3, ignore_eos=True))
        stream = ae.add_request(ids, params, "r")
        # nothing read until it has ended in the engine: its end is unread (reading a first delta
        # instead raced the loop: on a quick machine all three tokens, end included, came as one)
        while not (isinstance(stream.collector.output, StreamDelta) and stream.collector.output.finished):
            assert ae.dead is None, ae.dead
            await asyncio.sleep(0.01)
        other, one = ae.engine.check_request("x = 1", SamplingParams(max_tokens=1))
        assert [d.finish_reason async for d in ae.generate(other, one, "other")] == ["length"]  # a prefill step
        steps = ae.snapshot.steps
        stream.close()  # the client leaves: an abort for a request that is over
        while ae.snapshot.steps == steps:  # (the loop has handled it)
            assert ae.dead is None, ae.dead
            await asyncio.sleep(0.01)
        await ae.shutdown()
        return len(ids) + len(other)

    prompt_tokens = asyncio.run(asyncio.wait_for(main(), WAIT_S))
    from inflight.serve.async_engine import EngineSnapshot

    m = _samples(prom.render(EngineSnapshot()).decode())
    assert _get(m, "prompt_tokens_total") == prompt_tokens and _get(m, "generation_tokens_total") == 3 + 1
    assert _get(m, "request_success_total", finished_reason="length") == 2
    assert _get(m, "request_success_total", finished_reason="abort") == 0


def test_a_reused_request_id_is_refused_and_the_first_request_goes_on(tiny):
    from inflight import SamplingParams
    from inflight.serve.async_engine import AsyncEngine

    async def main():
        ae = AsyncEngine(_engine(tiny))
        await ae.start()
        ids, params = ae.engine.check_request(PROMPT, SamplingParams(max_tokens=8, ignore_eos=True))
        first = ae.generate(ids, params, "same")
        got = [await first.__anext__()]
        with pytest.raises(ValueError, match="already in use"):
            async for _ in ae.generate(ids, params, "same"):
                pass
        async for d in first:
            got.append(d)
        await ae.shutdown()
        return got

    got = asyncio.run(asyncio.wait_for(main(), WAIT_S))
    assert sum(len(d.token_ids) for d in got) == 8 and got[-1].finish_reason == "length"


# -- clients that leave at every moment --------------------------------------------------------------
def test_clients_leaving_at_every_moment_leave_nothing_behind(tiny):
    srv = InProcessServer(_engine(tiny, max_batch_size=2, num_blocks=48))
    try:
        body = {"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True}
        stream = json.dumps({**body, "stream": True}).encode()
        whole = json.dumps(body).encode()
        for _ in range(10):  # gone before the server has even read the request
            srv.post_raw("/v1/completions", stream).close()
            srv.post_raw("/v1/completions", whole).close()
        mid = [srv.post_raw("/v1/completions", stream) for _ in range(3)]
        read_until(mid[0], b"data: {")
        waiting = srv.post_raw("/v1/completions", whole)  # (the batch holds two: some of these wait)
        srv.wait_until(lambda: srv.metric("num_requests_waiting") >= 1, "a request waits")
        for s in mid + [waiting]:
            s.close()
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key="x", timeout=WAIT_S, max_retries=0)
        for _ in range(3):  # and the server still answers, start to end
            assert client.completions.create(model=srv.model, prompt=PROMPT, max_tokens=4).usage.completion_tokens == 4
        srv.wait_clean()
    finally:
        srv.stop()
    assert not srv.errors, [r.getMessage() for r in srv.errors]


@pytest.mark.parametrize("preemption, loop", [("recompute", "thread"), ("swap", "task")])
def test_clients_leaving_while_their_requests_are_preempted_leave_nothing_behind(tiny, preemption, loop):
    """A pool of 12 blocks for 10 requests of 75 tokens (5 blocks each) at mixed priorities: requests
    are preempted (recomputed, or swapped out to the CPU pool) all the time, and half of the clients
    hang up at random moments, some while their request is preempted. The pool and the swap pool
    come back whole, and every stream read to its end is the text of its request run alone."""
    import random

    from inflight import SamplingParams

    srv = InProcessServer(_engine(tiny, num_blocks=12, preemption=preemption), loop=loop)
    rnd, texts = random.Random(1), {}
    try:
        socks = [srv.post_raw("/v1/completions", json.dumps({
            "prompt": f"{PROMPT} {i}", "max_tokens": 60, "ignore_eos": True, "stream": True,
            "priority": rnd.randint(0, 3)}).encode()) for i in range(10)]
        kept = []
        for i, s in enumerate(socks):
            if rnd.random() < 0.5:
                read_until(s, b"data: {")
                time.sleep(rnd.random() * 0.03)  # (soon: on an idle machine a request is done in ~0.2 s)
                s.close()
            else:
                kept.append((i, s))
        for i, s in kept:
            raw = read_until(s, b"data: [DONE]")
            s.close()
            events = dechunk(raw.split(b"\r\n\r\n", 1)[1]).decode().split("\n\n")
            chunks = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
            texts[i] = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        srv.wait_clean()  # (also the swap pool: see loop_state)
        preempted, aborted = srv.metric("num_preemptions_total"), srv.metric("request_success_total",
                                                                             finished_reason="abort")
    finally:
        srv.stop()
    assert preempted > 0 and 0 < aborted <= 10 - len(kept)  # (the case this test is about; a client may hang up too late)
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    alone = {i: _engine(tiny).generate([f"{PROMPT} {i}"], params, use_tqdm=False)[0].text for i in texts}
    assert texts == alone
    assert not srv.errors, [r.getMessage() for r in srv.errors]


# -- a model that raises ----------------------------------------------------------------------------
def _faulty_engine(kill_token: int | None = None):
    """An engine whose model raises for any batch holding token 7 (the BEL byte); once it has seen
    `kill_token`, for every batch (a model broken for good)."""
    from inflight import load_tiny

    model, tok = load_tiny()
    forward, broken = model.forward, []

    def faulty(input_ids, *args, **kw):
        if kill_token is not None and (input_ids == kill_token).any():
            broken.append(True)
        if broken or (input_ids == 7).any():
            raise RuntimeError("injected fault")
        return forward(input_ids, *args, **kw)

    model.forward = faulty
    return _engine((model, tok))


def test_a_request_the_model_fails_on_ends_alone_with_an_error(tiny):
    from inflight import SamplingParams

    srv = InProcessServer(_faulty_engine())
    try:
        good = srv.post_raw("/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 120, "ignore_eos": True,
                                                           "stream": True}).encode())
        text = read_until(good, b"data: {")
        status, _, raw = srv.request("POST", "/v1/completions", {"prompt": "a\x07b", "max_tokens": 5})
        assert status == 500 and "injected fault" in json.loads(raw)["error"]["message"]
        text += read_until(good, b"data: [DONE]")
        assert srv.request("GET", "/health")[0] == 200
        srv.wait_clean()
    finally:
        srv.stop()
    alone = _engine(tiny).generate([PROMPT], SamplingParams(max_tokens=120, ignore_eos=True), use_tqdm=False)[0].text
    events = dechunk(text.split(b"\r\n\r\n", 1)[1]).decode().split("\n\n")
    assert "".join(json.loads(e[6:])["choices"][0]["text"] for e in events if e.startswith("data: {")) == alone


def test_when_the_loop_dies_every_request_in_flight_ends_with_an_error():
    srv = InProcessServer(_faulty_engine(kill_token=8))
    try:
        body = {"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True}
        streaming = srv.post_raw("/v1/completions", json.dumps({**body, "stream": True}).encode())
        read_until(streaming, b"data: {")
        whole = srv.post_raw("/v1/completions", json.dumps(body).encode())
        srv.wait_until(lambda: srv.metric("num_requests_running") == 2, "both run")
        status, _, raw = srv.request("POST", "/v1/completions", {"prompt": "a\x08b", "max_tokens": 5})
        assert status == 500  # (the request that broke the model)
        tail = read_until(streaming, b"data: [DONE]\n\n")
        assert b"the engine loop died" in tail and b"data: [DONE]\n\n" in tail
        status, _, raw = parse_response(read_all(whole))
        assert status == 500 and "engine loop died" in json.loads(raw)["error"]["message"]
        assert srv.request("GET", "/health")[0] == 503
        status, headers, _ = srv.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
        assert status == 503 and headers["retry-after"] == "1"
        streaming.close()
        whole.close()
    finally:
        srv.stop()
    assert not srv.errors, [r.getMessage() for r in srv.errors]
