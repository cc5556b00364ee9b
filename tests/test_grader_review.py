"""Wrong answers from the independent review of the graders (issue 23, review/RESULTS.md) that got
no diagnosis, or an inaccurate one: each is written here as a learner wrote it, and the grader must
fail it and name what it does. A right answer written the same way must still pass."""
import asyncio
from collections import deque

import pytest

from inflight.engine.budget import Budget
from inflight.engine.prefix_cache import ROOT_KEY, block_key
from inflight.exercises.engine_budget import check_budget
from inflight.exercises.output_collector import check_output_collector
from inflight.exercises.scheduling import (check_continuous_scheduler, check_memory_scheduler,
                                           check_static_scheduler)
from inflight.exercises.sharing import check_prefix_hit
from inflight.serve.output_collector import StreamDelta


# --- chapters 2-4: admitted requests must leave the queue; memory counted as requests come in ------
class Slots:
    def __init__(self, max_batch_size, max_memory=None):
        self.max_batch_size, self.max_memory = max_batch_size, max_memory
        self.waiting, self.active = deque(), {}

    def add_request(self, request_id, num_tokens, memory_cost=1):
        self.waiting.append((request_id, num_tokens, memory_cost))

    def serve(self):
        served = sorted(self.active)
        for rid in served:
            self.active[rid][0] -= 1
            if not self.active[rid][0]:
                self.active.pop(rid)
        return served


class StaticReadsQueue(Slots):
    """Builds each batch from the front of the queue by index and never removes it."""

    def step(self):
        if not self.active:
            for i in range(min(self.max_batch_size, len(self.waiting))):
                rid, n, cost = self.waiting[i]
                self.active[rid] = [n, cost]
        return self.serve()


class ContinuousReadsQueue(Slots):
    """Walks the queue for requests not running yet, but never removes the ones it admits."""

    def step(self):
        for rid, n, cost in self.waiting:
            if len(self.active) >= self.max_batch_size:
                break
            if rid not in self.active:
                self.active[rid] = [n, cost]
        return self.serve()


def test_static_batch_left_in_the_queue_is_named():
    r = check_static_scheduler(StaticReadsQueue, quiet=True)
    assert not r.passed and r.mistake == "admitted requests left in the queue"


def test_continuous_request_admitted_twice_is_said_so():
    r = check_continuous_scheduler(ContinuousReadsQueue, quiet=True)
    assert not r.passed
    # B is re-admitted the step after it finished, which the steps alone cannot tell from a request
    # kept in the batch: the report names both, the queue first among what to check when retiring is right
    assert "admitted a second time" in r.report and "popleft" in r.report


class RoomReadOnce(Slots):
    """Computes the room left once per step and never spends it as requests come in."""

    def step(self):
        room = None if self.max_memory is None else self.max_memory - sum(c for _, c in self.active.values())
        while self.waiting and len(self.active) < self.max_batch_size:
            rid, n, cost = self.waiting[0]
            if room is not None and cost > room:
                break
            self.waiting.popleft()
            self.active[rid] = [n, cost]
        return self.serve()


class RoomSpent(RoomReadOnce):
    def step(self):
        room = None if self.max_memory is None else self.max_memory - sum(c for _, c in self.active.values())
        while self.waiting and len(self.active) < self.max_batch_size:
            rid, n, cost = self.waiting[0]
            if room is not None:
                if cost > room:
                    break
                room -= cost
            self.waiting.popleft()
            self.active[rid] = [n, cost]
        return self.serve()


def test_memory_read_once_per_step_is_named():
    r = check_memory_scheduler(RoomReadOnce, quiet=True)
    assert not r.passed and r.mistake == "memory in use not updated while admitting"
    assert check_memory_scheduler(RoomSpent, quiet=True).passed


# --- chapter 6: the budget ------------------------------------------------------------------------
def _ceil(a, b):
    return -(-a // b)


def budget_next_token_too(state):
    """Reserves room for the token after this step as well."""
    extra = 0
    for r in state.running:
        extra += max(0, _ceil(r.num_computed_tokens + r.num_scheduled_tokens + 1, state.block_size) - r.num_blocks)
    return Budget(state.num_free_blocks - extra - state.watermark_blocks,
                  state.max_batched_tokens - sum(r.num_scheduled_tokens for r in state.running),
                  state.max_batch_size - len(state.running))


def budget_clamped(state):
    """Right, clamped at zero blocks (the chapter says that is accepted)."""
    extra = sum(max(0, _ceil(r.num_computed_tokens + r.num_scheduled_tokens, state.block_size) - r.num_blocks)
                for r in state.running)
    return Budget(max(0, state.num_free_blocks - extra - state.watermark_blocks),
                  state.max_batched_tokens - sum(r.num_scheduled_tokens for r in state.running),
                  state.max_batch_size - len(state.running))


def test_budget_a_block_for_the_next_token_is_named_and_shown_as_its_number():
    r = check_budget(budget_next_token_too, quiet=True)
    assert not r.passed and r.mistake == "a block for the token after this step"
    assert "'none'" not in r.report and "a str given" not in r.report  # the learner returned an int: show it
    assert "got:      (-1, 3, 2)" in r.report


def test_budget_clamped_at_zero_still_passes():
    assert check_budget(budget_clamped, quiet=True).passed


# --- chapter 8: the prefix hit's cap --------------------------------------------------------------
def _keys(tokens, bs):
    out, parent = [], ROOT_KEY
    for i in range(len(tokens) // bs):
        parent = block_key(parent, tokens[i * bs:(i + 1) * bs])
        out.append(parent)
    return out


def prefix_cap_short(tokens, bs, cached):
    """'A prompt of k blocks takes k - 1': caps at len // bs - 1 for every prompt."""
    keys = _keys(list(tokens), bs)
    n = 0
    while n < len(keys) and n < len(tokens) // bs - 1 and keys[n] in cached:
        n += 1
    return keys, n * bs


def prefix_serves_nothing(tokens, bs, cached):
    return _keys(list(tokens), bs), 0


def test_prefix_cap_one_block_short_is_named():
    r = check_prefix_hit(prefix_cap_short, quiet=True)
    assert not r.passed and r.mistake == "the cap one block short when the prompt ends mid-block"


def test_prefix_count_report_does_not_claim_other_kinds_of_slip():
    r = check_prefix_hit(prefix_serves_nothing, quiet=True)
    assert not r.passed and "where 3 are cached and allowed" in r.report
    assert "other ways" not in r.report  # every failing case is the same slip: too few blocks served


# --- chapter 9: a get_nowait() mistake beside a put() written differently from the reference's ----
class SetsReadyEveryPut:
    def __init__(self):
        self.output, self.ready = None, asyncio.Event()

    def put(self, item):
        if isinstance(self.output, BaseException):
            return
        if isinstance(self.output, StreamDelta) and isinstance(item, StreamDelta):
            ended = item if item.finish_reason is not None else self.output
            item = StreamDelta(self.output.token_ids + item.token_ids, self.output.text + item.text,
                               ended.finish_reason, ended.error)
        self.output = item
        self.ready.set()

    def get_nowait(self):
        item, self.output = self.output, None
        self.ready.clear()
        if isinstance(item, BaseException):
            raise item
        return item

    async def get(self):
        while self.output is None:
            await self.ready.wait()
        return self.get_nowait()


class LeavesItPending(SetsReadyEveryPut):
    def get_nowait(self):
        self.ready.clear()
        if isinstance(self.output, BaseException):
            raise self.output
        return self.output


class NeverClearsReady(SetsReadyEveryPut):
    def get_nowait(self):
        item, self.output = self.output, None
        if isinstance(item, BaseException):
            raise item
        return item


def test_collector_with_its_own_put_passes():
    assert check_output_collector(SetsReadyEveryPut, quiet=True).passed


@pytest.mark.parametrize("cls, mistake", [(LeavesItPending, "the delta is not taken"),
                                          (NeverClearsReady, "ready is never cleared")])
def test_collector_get_nowait_mistakes_named_beside_another_put(cls, mistake):
    r = check_output_collector(cls, quiet=True)
    assert not r.passed and r.mistake == mistake
