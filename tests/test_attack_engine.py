"""Attacks on `LLMEngine` that an earlier hardening pass left open: each test names what broke."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from inflight.engine.llm_engine import LLMEngine
from inflight.engine.sampling import SamplingParams
from test_robustness_engine import drain  # step until every request has returned its final output

torch.set_num_threads(1)
VOCAB = 61



class Tokenizer:
    eos_token_id = 0
    interrupt = False

    def encode(self, text):
        return [1, 2, 3]

    def decode(self, ids):
        if self.interrupt:
            self.interrupt = False
            raise KeyboardInterrupt  # the user pressed Ctrl-C while a slow tokenizer decoded
        return " ".join(map(str, ids))


def test_ctrl_c_while_decoding_loses_no_request(model):
    """Ctrl-C inside the tokenizer's decode, after the step's tokens were sampled, left a request
    that had just ended held by the engine forever: its final output was never returned, and with
    debug=True every later step failed the invariant check."""
    tok = Tokenizer()
    engine = LLMEngine(model, block_size=4, num_blocks=32, tokenizer=tok, debug=True)
    engine.add_request([1, 2], SamplingParams(max_tokens=1), request_id="short")
    engine.add_request([3, 4], SamplingParams(max_tokens=5), request_id="long")
    tok.interrupt = True
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    final = drain(engine)
    assert set(final) == {"short", "long"}
    assert final["short"].finish_reason == "length" and len(final["short"].token_ids) == 1
    alone = LLMEngine(model, block_size=4, num_blocks=32, tokenizer=Tokenizer())
    assert final["long"].token_ids == alone.generate([[3, 4]], SamplingParams(max_tokens=5), use_tqdm=False)[0].token_ids
    assert not engine.requests and engine.allocator.num_free == engine.allocator.num_blocks


class BoolEos(Tokenizer):
    eos_token_id = True


class ForeignEos(Tokenizer):
    eos_token_id = 10**6


class EncodesNone(Tokenizer):
    def encode(self, text):
        return None


@pytest.mark.parametrize("tok, error, words", [
    (BoolEos(), TypeError, "tokenizer.eos_token_id must be an int, got a bool"),  # was: token 1 ended requests
    (ForeignEos(), ValueError, "tokenizer.eos_token_id must be <= 60"),             # was: silently accepted
])
def test_a_tokenizers_eos_is_a_token_id_of_this_model(model, tok, error, words):
    with pytest.raises(error, match=words):
        LLMEngine(model, block_size=4, num_blocks=8, tokenizer=tok)


def test_an_encode_that_returns_no_ids_is_named(model):
    """was: TypeError: 'NoneType' object is not iterable, naming nothing."""
    engine = LLMEngine(model, block_size=4, num_blocks=8, tokenizer=EncodesNone())
    with pytest.raises(TypeError, match=r"tokenizer's encode\(\) turned prompt 'hi' into NoneType"):
        engine.add_request("hi")
    assert not engine.requests


def test_request_ids_are_ints_by_the_packages_one_rule(model):
    """A numpy int was refused as a request id although priorities and token ids take it; an int
    too long to print raised Python's int-to-str ValueError, which named no argument."""
    engine = LLMEngine(model, block_size=4, num_blocks=8)
    assert engine.add_request([1], request_id=np.int64(7)) == "7"
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request([1], request_id=7)
    with pytest.raises(ValueError, match="request_id is an integer of about 5001 digits: too long"):
        engine.add_request([1], request_id=10**5000)
    with pytest.raises(TypeError, match="request_id must be a str"):
        engine.add_request([1], request_id=np.bool_(True))
    engine.abort_request(np.int64(7))
    assert not engine.requests


@pytest.mark.parametrize("bad, error", [(0, ValueError), (False, TypeError)])
def test_max_model_len_zero_is_refused_not_read_as_unset(model, bad, error):
    """`max_model_len or default` took 0 and False for "not given" and served at the model's
    full context instead of refusing them."""
    with pytest.raises(error, match="max_model_len"):
        LLMEngine(model, block_size=4, num_blocks=8, max_model_len=bad)


class RaisesOn(torch.nn.Module):
    """The test model, except that its forward pass raises whenever token `bad` is among its inputs:
    a request-specific failure (think of a kernel bug at one shape) rather than a broken model."""

    def __init__(self, inner, bad=13, always=False):
        super().__init__()
        self.inner, self.config, self.bad, self.always = inner, inner.config, bad, always

    def forward(self, input_ids, *args, **kwargs):
        if self.always or bool((input_ids == self.bad).any()):
            raise RuntimeError("kernel failed (simulated)")
        return self.inner(input_ids, *args, **kwargs)


def test_a_forward_pass_that_fails_for_one_request_ends_only_that_one(model):
    """The forward pass raised on every step while the request that made it fail was in the batch:
    every other request was stuck behind it (generate() raised, and raised again when called anew,
    since the request stayed queued). Now it ends with finish_reason "error" and the rest go on."""
    others = [[5, 6, 7], [10, 11, 12], [14, 15]]
    sp = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.8, seed=3)
    expected = LLMEngine(model, block_size=4, num_blocks=40, max_batch_size=4).generate(others, sp, use_tqdm=False)
    bad = min(set(range(1, VOCAB)) - {t for o in expected for t in o.prompt_token_ids + o.token_ids})
    prompts = others[:1] + [[8, bad, 9]] + others[1:]
    engine = LLMEngine(RaisesOn(model, bad), block_size=4, num_blocks=40, max_batch_size=4, debug=True,
                       enable_prefix_caching=True)
    outs = engine.generate(prompts, sp, use_tqdm=False)
    assert outs[1].finish_reason == "error" and "forward pass failed for it" in outs[1].error
    assert "kernel failed (simulated)" in outs[1].error
    assert [o.token_ids for i, o in enumerate(outs) if i != 1] == [o.token_ids for o in expected]
    assert not engine.requests and engine.allocator.num_free == engine.num_blocks


@pytest.mark.parametrize("prompts", [[[1, 2], [3, 4]], [[13, 2]]])
def test_a_broken_model_or_a_lone_request_still_raises(model, prompts):
    """Not one request's problem (every request fails alone), or nothing to compare with (a batch
    of one): the step raises as before and the engine stands as before the step."""
    engine = LLMEngine(RaisesOn(model, always=len(prompts) > 1), block_size=4, num_blocks=40, debug=True)
    ids = [engine.add_request(p) for p in prompts]
    with pytest.raises(RuntimeError, match="simulated"):
        engine.step()
    engine.check_invariants()
    assert list(engine.requests) == ids and engine.allocator.num_free == engine.num_blocks


def test_aborting_the_last_unfinished_request_leaves_an_idle_engine_holding_no_blocks(model):
    """A request that ended in a step while another was still waiting stays in the running queue
    until the next step reaps it. Aborting that other one left the engine idle — no unfinished
    request, so no next step may come for a while — yet holding the ended request's blocks."""
    engine = LLMEngine(model, block_size=2, num_blocks=8, max_batch_size=1, debug=True)
    done = engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    other = engine.add_request([4, 5], SamplingParams(max_tokens=2, ignore_eos=True))
    finished = []
    while not finished:
        finished = [o.request_id for o in engine.step() if o.finished]
    assert finished == [done] and engine.allocator.num_used > 0  # ended, not reaped yet
    engine.abort_request(other)
    assert not engine.has_unfinished_requests()
    assert engine.allocator.num_used == 0
    engine.check_invariants()


def test_a_swap_pool_too_big_for_the_host_is_a_clear_value_error(model):
    """The device pool's allocation failure was a clear ValueError, the CPU swap pool's was torch's
    raw RuntimeError; and swap_blocks beyond int64 was refused under the name "num_blocks"."""
    with pytest.raises(ValueError, match="could not allocate a CPU swap pool of 1000000000000 blocks"):
        LLMEngine(model, block_size=4, num_blocks=8, preemption="swap", swap_blocks=10**12)
    with pytest.raises(ValueError, match="swap_blocks must be <="):
        LLMEngine(model, block_size=4, num_blocks=8, preemption="swap", swap_blocks=2**63)
