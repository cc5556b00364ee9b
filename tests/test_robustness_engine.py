"""A request never takes down the engine: bad input is refused at submission with a ValueError or
TypeError that names the problem and changes NOTHING; extreme-but-valid values run; and whatever
still fails for one request inside a step (sampling, the stop check, detokenization) ends that
request alone with finish_reason "error" and a message, while the others go on unchanged.

The fuzz tests count what they try (printed with `pytest -s`)."""
from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from inflight import checks
from inflight.engine.llm_engine import LLMEngine
from inflight.engine.sampling import SamplingParams

torch.set_num_threads(1)
VOCAB = 61
TRIED: Counter = Counter()  # bad inputs tried / accepted, per test (reported at the end of the module)



@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    print("\nfuzz counts:", dict(TRIED))


def state(engine: LLMEngine) -> tuple:
    """Everything a refused submission must leave as it was."""
    sched = engine.scheduler
    return (tuple(s.request_id for s in sched.waiting), tuple(s.request_id for s in sched.running),
            tuple(s.request_id for s in sched.swapped), engine.allocator.num_free, tuple(engine.requests),
            engine._next_id, engine._next_seq_no, len(engine.stats), engine.totals.steps, len(engine._undelivered))


def drain(engine: LLMEngine, limit: int = 5000) -> dict:
    final = {}
    for _ in range(limit):
        if not engine.has_unfinished_requests():
            return final
        final.update((o.request_id, o) for o in engine.step() if o.finished)
    raise AssertionError("the engine did not finish")


def alone(model, prompt, sp) -> list[int]:
    return LLMEngine(model, block_size=4, num_blocks=64, debug=True).generate([prompt], sp, use_tqdm=False)[0].token_ids


# -- fuzz: submissions -------------------------------------------------------------------------
junk = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.just(10**400), st.just(-10**400),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3),
                 st.sampled_from([np.int64(3), np.float32(0.5), np.bool_(True), torch.tensor(2), torch.tensor([1, 2]),
                                  (), [], [None], object(), 1j, b"x"]))
def spoil(data, valid: dict, most: int = 2) -> dict:
    """`valid` with up to `most` of its entries replaced by junk (none, a third of the time)."""
    out = dict(valid)
    for name in data.draw(st.lists(st.sampled_from(sorted(out)), max_size=most, unique=True)) if out else []:
        out[name] = data.draw(junk)
    return out


prompts = st.one_of(st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=20), junk,
                    st.lists(st.one_of(st.integers(-2, VOCAB + 2), junk), max_size=6),
                    st.sampled_from([torch.tensor([5, 9, 2]), torch.zeros(2, 2, dtype=torch.long), torch.tensor([1.5]),
                                     np.array([3, 4]), range(1, 4), list(range(1, 120)) * 2]))
fields = st.fixed_dictionaries({}, optional={
    "max_tokens": st.integers(-2, 200), "temperature": st.floats(-1, 1e300), "top_p": st.floats(-0.5, 1.5),
    "seed": st.integers(-2**64, 2**65), "priority": st.integers(-2**64, 2**64), "ignore_eos": st.booleans(),
    "stop_token_ids": st.lists(st.integers(-1, VOCAB + 1), max_size=3), "n": st.integers(-2, 12),
    "logprobs": st.one_of(st.none(), st.integers(-2, 25)), "prompt_logprobs": st.one_of(st.none(), st.integers(-2, 25))})
submission = st.fixed_dictionaries({"request_id": st.one_of(st.none(), st.sampled_from(["a", "b", 0, 7])),
                                    "arrival_time": st.one_of(st.none(), st.floats()),
                                    "priority": st.one_of(st.none(), st.integers())})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=prompts, mutate=st.booleans(), data=st.data())
def test_fuzz_add_request_refuses_cleanly_and_changes_nothing(model, prompt, mutate, data):
    engine = LLMEngine(model, block_size=4, num_blocks=24, max_batch_size=3, debug=True)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True), request_id="a")
    engine.step()
    kw, extra = spoil(data, data.draw(fields)), spoil(data, data.draw(submission), most=1)
    try:
        if mutate:  # fields changed after construction skip __post_init__: submission must still check them
            sp = SamplingParams()
            for k, v in kw.items():
                setattr(sp, k, v)
        else:
            sp = SamplingParams(**kw)
    except (ValueError, TypeError):
        TRIED["bad SamplingParams refused at construction"] += 1
        return
    before = state(engine)
    snapshot = (sp.max_tokens, sp.temperature, sp.top_p, sp.seed, sp.priority, sp.n, sp.logprobs, sp.prompt_logprobs)
    try:
        engine.add_request(prompt, sp, **extra)
    except (ValueError, TypeError) as exc:
        TRIED["bad submissions refused"] += 1
        assert state(engine) == before, f"a refused request ({exc}) changed the engine"
        assert len(str(exc)) < 500
    else:
        TRIED["odd but valid submissions accepted"] += 1
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.seed, sp.priority, sp.n, sp.logprobs,
            sp.prompt_logprobs) == snapshot  # the caller's object
    drain(engine)
    assert engine.allocator.num_free == engine.num_blocks and not engine.requests


generate_args = st.one_of(prompts, st.lists(prompts, max_size=3), st.tuples(prompts, prompts))
params_args = st.one_of(st.none(), st.just(SamplingParams(max_tokens=2)), junk,
                        st.lists(st.one_of(st.none(), st.just(SamplingParams(max_tokens=3)), junk), max_size=3))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompts_=generate_args, params=params_args, use_tqdm=st.one_of(st.just(False), junk))
def test_fuzz_generate_refuses_cleanly_and_changes_nothing(model, prompts_, params, use_tqdm):
    engine = LLMEngine(model, block_size=4, num_blocks=24, max_batch_size=3, debug=True)
    before = state(engine)
    try:
        outs = engine.generate(prompts_, params, use_tqdm=use_tqdm)
    except (ValueError, TypeError):
        TRIED["bad generate() calls refused"] += 1
        assert state(engine) == before
    else:
        TRIED["odd but valid generate() calls run"] += 1
        assert all(o.finished for o in outs) and not engine.requests
        assert engine.allocator.num_free == engine.num_blocks


knobs = st.fixed_dictionaries({}, optional={
    "block_size": st.integers(-1, 40), "num_blocks": st.integers(-1, 64), "max_batch_size": st.integers(-1, 10),
    "max_batched_tokens": st.integers(-1, 600), "preemption": st.sampled_from(["recompute", "swap", "drop", ""]),
    "enable_chunked_prefill": st.booleans(), "enable_prefix_caching": st.booleans(), "debug": st.booleans(),
    "watermark": st.floats(-1, 2), "swap_blocks": st.integers(-3, 16), "max_model_len": st.integers(-1, 300),
    "seed": st.integers(-2**64, 2**65), "priority_aging": st.floats(-1, 1e300), "stats_window": st.integers(-1, 5),
    "device": st.sampled_from(["cpu", "cuda", "bogus", "cpu:0", "meta"]),
    "tokenizer": st.sampled_from([None, object(), "tok"])})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_engine_knobs(model, data):
    kw = spoil(data, data.draw(knobs))
    if isinstance(kw.get("num_blocks"), int) and not isinstance(kw["num_blocks"], bool) and kw["num_blocks"] > 10**4:
        kw["num_blocks"] = 10**4  # (a real allocation: keep it small)
    kw.setdefault("num_blocks", 16)
    try:
        engine = LLMEngine(model, **kw)
    except (ValueError, TypeError):
        TRIED["bad engine knobs refused"] += 1
        return
    TRIED["odd but valid engine knobs accepted"] += 1
    try:
        outs = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    except ValueError as exc:  # a pool too small for even this request is refused at submission
        assert "whole pool" in str(exc) or "context" in str(exc), exc
        outs = []
    assert all(o.finished for o in outs)
    engine.check_invariants()
    assert engine.allocator.num_free == engine.num_blocks


def test_odd_calls_on_an_idle_or_busy_engine(model):
    engine = LLMEngine(model, block_size=4, num_blocks=16, debug=True)
    assert engine.step() == [] and engine.step() == []  # nothing to do is not an error
    assert not engine.has_unfinished_requests()
    for rid in ("nope", 123, "", "0"):
        engine.abort_request(rid)  # unknown ids are ignored
    for rid in (None, 1.5, [1], (1,), b"0", True):
        with pytest.raises(TypeError, match="request_id"):
            engine.abort_request(rid)
        with pytest.raises(TypeError, match="request_id"):
            engine.add_request([1], request_id=rid) if rid is not None else engine.get_output(rid)
    with pytest.raises(KeyError, match="no unfinished request"):
        engine.get_output("nope")
    rid = engine.add_request([1, 2], SamplingParams(max_tokens=3, ignore_eos=True), request_id=7)
    assert rid == "7" and engine.get_output(7).request_id == "7"
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request([1], request_id="7")
    assert engine.add_request([1]) != "7"  # automatic ids skip the ones in use
    engine.abort_request(7)
    engine.abort_request(7)  # twice: the second is a no-op
    drain(engine)
    assert engine.allocator.num_free == engine.num_blocks and not engine.requests


# -- extreme but valid values complete ---------------------------------------------------------
EXTREMES = [
    dict(temperature=1e-45), dict(temperature=5e-324), dict(temperature=9.99e-6), dict(temperature=1.01e-5, seed=1),
    dict(temperature=1e-3, seed=2), dict(temperature=3.4e38, seed=3), dict(temperature=1e300, seed=4),
    dict(temperature=1.0, top_p=5e-324, seed=5), dict(temperature=1.0, top_p=1.0, seed=6),
    dict(temperature=0.7, seed=checks.SEED_RANGE[0]), dict(temperature=0.7, seed=checks.SEED_RANGE[1]),
    dict(priority=checks.PRIORITY_RANGE[0]), dict(priority=checks.PRIORITY_RANGE[1]),
    dict(max_tokens=10**18), dict(stop_token_ids=list(range(1, VOCAB))), dict(stop_token_ids={1, 2, 3}),
]


@pytest.mark.parametrize("aging", [None, 1e-300, 1e300])
def test_extreme_but_valid_requests_complete_beside_normal_ones(model, aging):
    rng = random.Random(0)
    normal = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 12))] for _ in range(4)]
    greedy = SamplingParams(max_tokens=6, ignore_eos=True)
    engine = LLMEngine(model, block_size=4, num_blocks=40, max_batch_size=8, max_model_len=40, priority_aging=aging,
                       debug=True)
    ids = [engine.add_request(p, greedy) for p in normal]
    odd = [engine.add_request([3, 4, 5], SamplingParams(ignore_eos=True, **kw), arrival_time=t)
           for kw, t in zip(EXTREMES, [None, -1e300, 1e300, 0.0] * 4)]
    final = drain(engine)
    assert [final[i].token_ids for i in ids] == [alone(model, p, greedy) for p in normal]
    assert all(final[i].finish_reason in ("length", "stop") for i in odd), [final[i].error for i in odd]
    # a temperature below SAMPLING_EPS is greedy: the same tokens as temperature 0
    assert final[odd[0]].token_ids == final[odd[1]].token_ids == final[odd[2]].token_ids == \
        alone(model, [3, 4, 5], SamplingParams(max_tokens=16, ignore_eos=True))
    assert engine.allocator.num_free == engine.num_blocks


# -- one request's failure stays its own -------------------------------------------------------
class _BrokenGenerator:
    """A request's random stream that fails when drawn from."""


class _NaNRowModel(torch.nn.Module):
    """The test model, except that on its `at`-th call the logits of row `row` are NaN."""

    def __init__(self, inner, at=1, row=1, exc=None):
        super().__init__()
        self.inner, self.config, self.at, self.row, self.exc, self.calls = inner, inner.config, at, row, exc, 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at and self.exc is not None:
            raise self.exc
        logits = self.inner(*args, **kwargs)
        if self.calls == self.at and self.exc is None and logits.shape[0] > self.row:
            logits = logits.clone()
            logits[self.row] = math.nan
        return logits


class _Tokenizer:
    """Decodes ids as letters, but fails on the `bad`-th call."""

    def __init__(self, bad):
        self.bad, self.calls = bad, 0

    def encode(self, text):
        return [ord(c) % VOCAB for c in text]

    def decode(self, ids):
        self.calls += 1
        if self.calls == self.bad:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return "".join(chr(97 + i % 26) for i in ids)


def _failure_run(model, prompts, sp, inject, **kw):
    engine = LLMEngine(model, block_size=4, num_blocks=40, max_batch_size=4, debug=True, **kw)
    ids = [engine.add_request(p, sp) for p in prompts]
    inject(engine, ids)
    final = drain(engine)
    assert engine.allocator.num_free == engine.num_blocks and not engine.requests  # its blocks came back too
    return ids, final


@pytest.mark.parametrize("how", ["generator", "nan logits", "stop check", "detokenization"])
def test_one_failing_request_ends_alone_and_the_others_go_on(model, how):
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    sp = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0)
    expected = [alone(model, p, sp) for p in prompts]
    kw: dict = {}
    if how == "generator":
        def inject(engine, ids):
            seq = engine.requests[ids[1]]
            seq.params = SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.0)
            seq.generator = _BrokenGenerator()
    elif how == "nan logits":
        m = _NaNRowModel(model, at=1, row=1)
        kw = {}
        inject = lambda engine, ids: None  # noqa: E731
    elif how == "stop check":
        def inject(engine, ids):
            engine.requests[ids[1]].params.stop_token_ids = None  # `token in None` raises inside the step
    else:
        kw = {"tokenizer": _Tokenizer(bad=2)}  # the second output of the first step: request 1
        inject = lambda engine, ids: None  # noqa: E731
    ids, final = _failure_run(m if how == "nan logits" else model, prompts, sp, inject, **kw)
    bad = final[ids[1]]
    assert bad.finish_reason == "error" and bad.finished and bad.error, bad
    words = {"generator": "random generator", "nan logits": "not finite", "stop check": "stop check",
             "detokenization": "detokenization"}[how]
    assert words in bad.error
    assert [final[i].token_ids for i in (ids[0], ids[2])] == [expected[0], expected[2]]
    assert all(final[i].finish_reason == "length" for i in (ids[0], ids[2]))


def test_a_failed_forward_pass_leaves_the_engine_as_before_the_step(model):
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    flaky = _NaNRowModel(model, at=3, exc=RuntimeError("CUDA error: an illegal memory access (simulated)"))
    engine = LLMEngine(flaky, block_size=4, num_blocks=12, max_batch_size=4, max_batched_tokens=8, debug=True)
    ids = [engine.add_request(p, sp) for p in prompts]
    engine.step()
    engine.step()
    with pytest.raises(RuntimeError, match="simulated"):
        engine.step()
    engine.check_invariants()  # no block held for tokens that were never computed
    final = drain(engine)
    assert [final[i].token_ids for i in ids] == [alone(model, p, sp) for p in prompts]
    assert engine.allocator.num_free == engine.num_blocks


def test_caller_changes_after_submission_do_not_reach_the_request(model):
    sp = SamplingParams(max_tokens=5, ignore_eos=True)
    engine = LLMEngine(model, block_size=4, num_blocks=24, debug=True)
    rid = engine.add_request([1, 2, 3], sp)
    sp.max_tokens, sp.stop_token_ids, sp.temperature = 0, "junk", float("nan")  # too late: it runs as sent
    out = drain(engine)[rid]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"


def test_the_reported_instances(model):
    """Each instance the issue reported, as a regression test."""
    engine = LLMEngine(model, block_size=4, num_blocks=24, debug=True)
    before = state(engine)
    with pytest.raises(ValueError, match="64-bit"):  # used to overflow inside generate() and orphan the request
        engine.generate([[1, 2]], SamplingParams(priority=10**400))
    with pytest.raises(ValueError, match="64-bit"):
        engine.add_request([1, 2], priority=10**400)
    with pytest.raises(TypeError, match="bool"):
        engine.add_request([True, False])
    with pytest.raises(ValueError, match="NaN"):
        engine.add_request([1, 2], arrival_time=float("nan"))
    with pytest.raises(TypeError, match="seed"):
        SamplingParams(seed="x")
    with pytest.raises(ValueError, match="swap_blocks"):
        LLMEngine(model, num_blocks=8, swap_blocks=-1)  # even with preemption="recompute"
    with pytest.raises(ValueError, match="2-D"):
        engine.generate(torch.tensor([[5, 9], [2, 33]]))
    assert state(engine) == before
    engine.step()
    engine.abort_request("0")  # nothing orphaned: no assertion, no list.remove error
    # a 1-D tensor is ONE prompt for generate() as for add_request()
    outs = engine.generate(torch.tensor([5, 9, 2, 33]), SamplingParams(max_tokens=2), use_tqdm=False)
    assert len(outs) == 1 and outs[0].prompt_token_ids == [5, 9, 2, 33]
    # temperature=1e-45 used to make the probabilities NaN and crash every step for everyone
    outs = engine.generate([[1, 2, 3], [4, 5]], [SamplingParams(temperature=1e-45, max_tokens=3, ignore_eos=True),
                                                 SamplingParams(max_tokens=3, ignore_eos=True)], use_tqdm=False)
    assert [o.finish_reason for o in outs] == ["length", "length"]
