"""What the server needs from the engine, and its loop: incremental detokenization (no half
characters, stop strings on the text), queue time, the output collector's merge, and `AsyncEngine`
(requests through one loop, aborts that give the blocks back, a loop that dies loudly)."""
from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings, strategies as st

from inflight.engine.detokenizer import IncrementalDetokenizer
from inflight.model.tokenizer import ByteTokenizer
from serve_helpers import tiny_engine

TOK = ByteTokenizer()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.data())
def test_incremental_text_is_the_whole_decode_and_never_shows_half_a_character(text, data):
    ids = TOK.encode(text)
    d = IncrementalDetokenizer(TOK)
    shown = []
    n = 0
    while n < len(ids):  # feed the tokens a few at a time, as steps do
        n = min(len(ids), n + data.draw(st.integers(1, 3)))
        d.update(ids[:n])
        shown.append(d.text(False))
        assert "\ufffd" not in d.text(False)  # (the text has none of its own)
    d.update(ids, finished=True)
    assert d.text(True) == text
    assert all(a == b[:len(a)] for a, b in zip(shown, shown[1:]))  # append-only


@settings(max_examples=200, deadline=None)
@given(st.text("ab\n", max_size=30), st.sampled_from(["b", "ab", "\n\n", "aba"]))
def test_stop_string_cuts_the_text_before_it_and_nothing_past_it_was_shown(text, stop):
    ids = TOK.encode(text)
    d = IncrementalDetokenizer(TOK, stop=[stop])
    found, shown = None, ""
    for n in range(1, len(ids) + 1):
        found = d.update(ids[:n])
        shown = d.text(found is not None)
        if found:
            break
    if stop in text:
        assert found == stop and d.stop_reason == stop and shown == text[:text.index(stop)]
    else:
        assert found is None and text.startswith(shown)


def test_engine_stop_strings_and_queue_time():
    from inflight import LLMEngine, SamplingParams, load_tiny

    model, tok = load_tiny()
    engine = LLMEngine(model, tokenizer=tok, block_size=16, num_blocks=32)
    full = engine.generate(["def f(x):"], SamplingParams(max_tokens=40), use_tqdm=False)[0]
    stop = full.text.strip()[:2]
    out = engine.generate(["def f(x):"], SamplingParams(max_tokens=40, stop=stop), use_tqdm=False)[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == full.text[:full.text.index(stop)]
    assert out.token_ids == full.token_ids[:len(out.token_ids)] and len(out.token_ids) < 40
    assert 0 <= out.queue_time <= out.ttft
    with pytest.raises(TypeError, match=r"stop\[0\] must be a string"):
        SamplingParams(stop=[3])
    with pytest.raises(ValueError, match="needs a tokenizer"):
        LLMEngine(model, block_size=16, num_blocks=8).add_request([1, 2], SamplingParams(stop="x"))


# -- the output collector ------------------------------------------------------------------------
def test_collector_merges_while_the_reader_is_away_and_wakes_it_once():
    from inflight.serve.output_collector import RequestOutputCollector, StreamDelta

    async def main():
        c = RequestOutputCollector()
        c.put(StreamDelta([1], "a"))
        c.put(StreamDelta([2, 3], "bc"))
        c.put(StreamDelta([4], "d", "length"))
        got = await c.get()
        assert (got.token_ids, got.text, got.finish_reason) == ([1, 2, 3, 4], "abcd", "length")
        assert c.get_nowait() is None and not c.ready.is_set()
        waiter = asyncio.ensure_future(c.get())
        await asyncio.sleep(0)
        assert not waiter.done()  # nothing pending: it waits
        c.put(StreamDelta([5], "e"))
        assert (await asyncio.wait_for(waiter, 5)).token_ids == [5]
        c.put(StreamDelta([6], "f"))
        c.put(RuntimeError("engine died"))  # an error replaces what is pending
        with pytest.raises(RuntimeError, match="engine died"):
            await c.get()

    asyncio.run(main())


# -- AsyncEngine ---------------------------------------------------------------------------------
def _engine(tiny, **kw):
    return tiny_engine(tiny, **kw)


@pytest.mark.parametrize("mode", ["thread", "task"])
def test_async_engine_serves_concurrent_requests_like_the_engine_alone(tiny, mode):
    from inflight import SamplingParams
    from inflight.serve.async_engine import AsyncEngine

    prompts = ["def a(x):", "import os\n", "class B:"]
    sp = SamplingParams(max_tokens=24)
    alone = [_engine(tiny).generate([p], sp, use_tqdm=False)[0] for p in prompts]

    async def main():
        ae = AsyncEngine(_engine(tiny), loop=mode)
        await ae.start()

        async def one(i, p):
            ids, params = ae.engine.check_request(p, sp)
            toks, text = [], ""
            async for d in ae.generate(ids, params, f"r{i}"):
                toks += d.token_ids
                text += d.text
            return toks, text

        outs = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        await ae.shutdown()
        return outs, ae

    outs, ae = asyncio.run(main())
    assert [o[0] for o in outs] == [a.token_ids for a in alone]
    assert [o[1] for o in outs] == [a.text for a in alone]
    assert ae.engine.allocator.num_used == 0 and not ae.engine.requests


@pytest.mark.parametrize("mode", ["thread", "task"])
def test_abandoned_requests_are_aborted_and_shutdown_ends_the_rest(tiny, mode):
    from inflight import SamplingParams
    from inflight.serve.async_engine import AsyncEngine

    async def main():
        ae = AsyncEngine(_engine(tiny, max_batch_size=1), loop=mode)
        await ae.start()
        sp = SamplingParams(max_tokens=400, ignore_eos=True)
        ids, params = ae.engine.check_request("def f():", sp)
        running = ae.generate(ids, params, "running")
        first = await running.__anext__()            # it runs
        waiting = ae.generate(ids, params, "waiting")
        task = asyncio.ensure_future(waiting.__anext__())
        for _ in range(400):  # until the engine has it queued (behind the running one: one at a time)
            await asyncio.sleep(0.005)
            if "waiting" in ae.engine.requests:
                break
        assert "waiting" in ae.engine.requests and not task.done()
        task.cancel()                                 # the waiting client leaves before its first token
        with pytest.raises(asyncio.CancelledError):
            await task
        await running.aclose()                        # the running one leaves mid-stream
        for _ in range(600):
            if not ae.engine.requests and ae.snapshot.blocks_used == 0:
                break
            await asyncio.sleep(0.05)
        assert not ae.engine.requests and ae.engine.allocator.num_used == 0
        last = ae.generate(ids, params, "last")
        await last.__anext__()
        stop = asyncio.ensure_future(ae.shutdown())
        rest = [d async for d in last]
        await stop
        return first, rest, ae

    first, rest, ae = asyncio.run(main())
    assert first.token_ids and rest[-1].finish_reason == "abort"
    assert ae.engine.allocator.num_used == 0 and not ae.is_running


def test_a_dying_loop_fails_its_requests_and_health_says_so(tiny):
    from inflight import SamplingParams
    from inflight.serve.async_engine import AsyncEngine, EngineDeadError

    engine = _engine(tiny)

    def broken_step():
        raise RuntimeError("the device fell off the bus")

    engine.step = broken_step

    async def main():
        ae = AsyncEngine(engine)
        await ae.start()
        ids, params = engine.check_request("x", SamplingParams(max_tokens=4))
        with pytest.raises(EngineDeadError, match="fell off the bus"):
            async for _ in ae.generate(ids, params, "r"):
                pass
        for _ in range(100):
            if ae.dead:
                break
            await asyncio.sleep(0.05)
        assert not ae.is_running
        with pytest.raises(EngineDeadError):
            await ae.generate(ids, params, "r2").__anext__()
        return ae

    ae = asyncio.run(main())
    from fastapi.testclient import TestClient  # (no stream here: the in-process transport is enough)

    from inflight.serve.api_server import build_app
    from inflight.serve.metrics import ServerMetrics

    app = build_app(ae, ServerMetrics("m"), model_name="m")
    ae.start = _no_start  # already started and dead
    ae.shutdown = _no_start
    with TestClient(app) as http:
        assert http.get("/health").status_code == 503
        r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and "not running" in r.json()["error"]["message"]


async def _no_start(*a, **k):
    return None
