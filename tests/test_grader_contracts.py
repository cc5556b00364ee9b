"""Every clause of every exercise's contract has a case that a violating answer fails, with a named
diagnosis; and correct answers in unusual styles (numpy ints, generators, sets, heaps, dict access,
tuples) pass (issue 23). The wrong code here is written independently of the package's `Mistake`s,
the way a learner would write it: each entry is (grader, wrong code, the diagnosis it must get)."""
from __future__ import annotations

import heapq
import math
import statistics
from collections import Counter, deque

import numpy as np
import pytest

from inflight.engine.block_manager import NoFreeBlocksError
from inflight.engine.budget import Budget
from inflight.engine.prefix_cache import ROOT_KEY, block_key
from inflight.exercises.batching import check_kv_bytes_per_token
from inflight.exercises.engine_budget import check_budget
from inflight.exercises.engine_loop import check_engine_loop
from inflight.exercises.paged import StarterAllocator, check_allocator, check_blocks_needed, check_slot_mapping
from inflight.exercises.scheduling import check_continuous_scheduler, check_memory_scheduler, check_static_scheduler
from inflight.exercises.serving import check_serving_metrics
from inflight.exercises.sharing import check_choose_victim, check_prefix_hit


# --- chapter 1 ------------------------------------------------------------------------------------------
def kv_by_key(config, nbytes):  # config.json style
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * nbytes


def kv_numpy(config, nbytes):
    return np.prod([2, config.num_hidden_layers, config.num_key_value_heads, config.head_dim, nbytes])


def kv_float(config, nbytes):  # right number, wrong type: the allocator would refuse it
    return 2.0 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * nbytes


def kv_kib(config, nbytes):
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * nbytes // 1024


def kv_group_size(config, nbytes):
    group = config.num_attention_heads // config.num_key_value_heads
    return 2 * config.num_hidden_layers * group * config.head_dim * nbytes


def kv_fp16_only(config, nbytes):
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2


def kv_patches_config(config, nbytes):
    config.head_dim = config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * nbytes


def kv_heads_and_no_layers(config, nbytes):  # two slips at once: query heads, and one layer
    return 2 * config.num_attention_heads * config.head_dim * nbytes


def kv_extra_layer(config, nbytes):
    return 2 * (config.num_hidden_layers + 1) * config.num_key_value_heads * config.head_dim * nbytes


# --- chapter 5: blocks and slots ---------------------------------------------------------------------------
def blocks_true_division(n, bs):
    return (n + bs - 1) / bs


def blocks_minus_one(n, bs):
    return (n - 1) // bs


def blocks_divmod(n, bs):  # correct
    q, r = divmod(n, bs)
    return q + (r > 0)


def blocks_loop(n, bs):  # correct, slowly
    k = 0
    while k * bs < n:
        k += 1
    return k


def blocks_rounding_trick(n, bs):  # round(x + 0.49) is not a ceiling when x is 1/128 past an integer
    return round(n / bs + 0.49)


def slots_numpy(table, positions, bs):  # correct: an array of numpy ints
    p = np.asarray(positions, dtype=np.int64)
    return np.asarray(table)[p // bs] * bs + p % bs


def slots_generator(table, positions, bs):  # correct, lazily
    return (table[p // bs] * bs + p % bs for p in positions)


def slots_last_block(table, positions, bs):
    return [table[-1] * bs + p % bs for p in positions]


def slots_sorted_table(table, positions, bs):
    table = sorted(table)
    return [table[p // bs] * bs + p % bs for p in positions]


def slots_sorts_table_in_place(table, positions, bs):
    out = [table[p // bs] * bs + p % bs for p in positions]
    table.sort()
    return out


def slots_relative(table, positions, bs):
    start = positions[0] if positions else 0
    return [table[(p - start) // bs] * bs + (p - start) % bs for p in positions]


def slots_skip_first(table, positions, bs):
    return [table[p // bs] * bs + p % bs for p in positions[1:]]


# --- chapter 5: the allocator ------------------------------------------------------------------------------
class Right(StarterAllocator):
    def allocate(self, n):
        if n > self.num_blocks:
            raise ValueError(n)
        if n > len(self.free_list):
            raise NoFreeBlocksError(n)
        out = [self.free_list.popleft() for _ in range(n)]
        for b in out:
            self.ref_counts[b] = 1
        return out

    def free(self, blocks):
        times = Counter(blocks)
        for b, k in times.items():
            if not 0 <= b < self.num_blocks or self.ref_counts[b] < k:
                raise ValueError(b)
        for b, k in times.items():
            self.ref_counts[b] -= k
            if self.ref_counts[b] == 0:
                self.free_list.append(b)


class HeapAllocator(StarterAllocator):
    """Correct: smallest free id first from a heap, counts in a dict."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.heap = list(range(num_blocks))
        self.refs = {}

    @property
    def num_free(self):
        return len(self.heap)

    def incref(self, blocks):
        for b in blocks:
            if b not in self.refs:
                raise ValueError(b)
        for b in blocks:
            self.refs[b] += 1

    def allocate(self, n):
        if n > self.num_blocks:
            raise ValueError(n)
        if n > len(self.heap):
            raise NoFreeBlocksError(n)
        out = [heapq.heappop(self.heap) for _ in range(n)]
        self.refs.update({b: 1 for b in out})
        return out

    def free(self, blocks):
        need = Counter(blocks)
        if any(not 0 <= b < self.num_blocks or self.refs.get(b, 0) < k for b, k in need.items()):
            raise ValueError(blocks)
        for b, k in need.items():
            self.refs[b] -= k
            if not self.refs[b]:
                del self.refs[b]
                heapq.heappush(self.heap, b)


class HintLedFree(Right):  # the old hint's code: checks each id's count, not how often it is listed
    def free(self, blocks):
        for b in blocks:
            if not 0 <= b < self.num_blocks or self.ref_counts[b] == 0:
                raise ValueError(b)
        for b in blocks:
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_list.append(b)


class SortsFreeList(Right):  # lowest id first, by sorting on every call: O(pool)
    def allocate(self, n):
        self.free_list = deque(sorted(self.free_list))
        return super().allocate(n)


class MembershipDoubleFree(Right):  # double free found by searching the free list: O(pool)
    def free(self, blocks):
        for b in blocks:
            if b in self.free_list:
                raise ValueError(b)
        super().free(blocks)


class ScansRefCounts(Right):  # finds free blocks by their count, walking the whole pool
    def allocate(self, n):
        if n > self.num_blocks:
            raise ValueError(n)
        if n > len(self.free_list):
            raise NoFreeBlocksError(n)
        out = []
        for b in range(self.num_blocks):
            if len(out) == n:
                break
            if self.ref_counts[b] == 0 and b in self.free_list:
                out.append(b)
        for b in out:
            self.free_list.remove(b)
            self.ref_counts[b] = 1
        return out


class ReturnsTuple(Right):
    def allocate(self, n):
        return tuple(super().allocate(n))


class ClearsItsArgument(Right):
    def free(self, blocks):
        super().free(blocks)
        blocks.clear()


class ExactFitRefused(Right):
    def allocate(self, n):
        if n and n >= len(self.free_list) and n <= self.num_blocks:
            raise NoFreeBlocksError(n)
        return super().allocate(n)


class WrongErrorType(Right):
    def free(self, blocks):
        try:
            super().free(blocks)
        except ValueError:
            raise KeyError(blocks) from None


# --- chapters 2-4: schedulers --------------------------------------------------------------------------------
class Sched:
    def __init__(self, max_batch_size, max_memory=None):
        self.max_batch_size, self.max_memory = max_batch_size, max_memory
        self.queue, self.batch = deque(), {}

    def add_request(self, request_id, num_tokens, memory_cost=1):
        self.queue.append((request_id, num_tokens, memory_cost))

    def used(self):
        return sum(c for _, c in self.batch.values())

    def tick(self):
        ids = sorted(self.batch)
        for rid in ids:
            self.batch[rid][0] -= 1
            if self.batch[rid][0] == 0:
                del self.batch[rid]
        return ids


class HeapFifo(Sched):  # correct: FIFO kept by a sequence number in a heap; returns a tuple
    def __init__(self, max_batch_size, max_memory=None):
        super().__init__(max_batch_size, max_memory)
        self.heap, self.seq = [], 0

    def add_request(self, request_id, num_tokens, memory_cost=1):
        heapq.heappush(self.heap, (self.seq, request_id, num_tokens, memory_cost))
        self.seq += 1

    def step(self):
        while self.heap and len(self.batch) < self.max_batch_size:
            _, rid, n, c = self.heap[0]
            if self.max_memory is not None and self.used() + c > self.max_memory:
                break
            heapq.heappop(self.heap)
            self.batch[rid] = [n, c]
        return tuple(self.tick())


class StaticBySlices(Sched):  # correct static batching: a list as the queue, slices, a tuple back
    def __init__(self, max_batch_size, max_memory=None):
        super().__init__(max_batch_size, max_memory)
        self.queue = []

    def step(self):
        if not self.batch:
            chosen, self.queue = self.queue[: self.max_batch_size], self.queue[self.max_batch_size:]
            self.batch = {rid: [n, c] for rid, n, c in chosen}
        return tuple(self.tick())


class ClassLevelQueue(Sched):  # the queue lives on the class: every scheduler shares it
    queue = deque()

    def __init__(self, max_batch_size, max_memory=None):
        self.max_batch_size, self.max_memory, self.batch = max_batch_size, max_memory, {}

    def step(self):
        while self.queue and len(self.batch) < self.max_batch_size:
            rid, n, c = self.queue.popleft()
            self.batch[rid] = [n, c]
        return self.tick()


class ReturnsGenerator(Sched):
    def step(self):
        while self.queue and len(self.batch) < self.max_batch_size:
            rid, n, c = self.queue.popleft()
            self.batch[rid] = [n, c]
        return (rid for rid in self.tick())


class OnlyNewcomers(Sched):  # returns the requests admitted in this step
    def step(self):
        new = []
        while self.queue and len(self.batch) < self.max_batch_size:
            rid, n, c = self.queue.popleft()
            self.batch[rid] = [n, c]
            new.append(rid)
        self.tick()
        return sorted(new)


class AdmitsIfBatchHalfEmpty(Sched):
    def step(self):
        if len(self.batch) <= self.max_batch_size // 2:
            while self.queue and len(self.batch) < self.max_batch_size:
                rid, n, c = self.queue.popleft()
                self.batch[rid] = [n, c]
        return self.tick()


class StringIds(Sched):
    def step(self):
        while self.queue and len(self.batch) < self.max_batch_size:
            rid, n, c = self.queue.popleft()
            self.batch[str(rid)] = [n, c]
        return self.tick()


class StaticSortedByLength(Sched):
    def step(self):
        if not self.batch:
            pending = sorted(self.queue, key=lambda r: r[1])
            for rid, n, c in pending[: self.max_batch_size]:
                self.batch[rid] = [n, c]
                self.queue.remove((rid, n, c))
        return self.tick()


class StaticTopsUp(Sched):  # refills whenever fewer than half remain
    def step(self):
        if len(self.batch) < (self.max_batch_size + 1) // 2:
            while self.queue and len(self.batch) < self.max_batch_size:
                rid, n, c = self.queue.popleft()
                self.batch[rid] = [n, c]
        return self.tick()


class MemoryDefaultZero(Sched):
    def add_request(self, request_id, num_tokens, memory_cost=0):
        self.queue.append((request_id, num_tokens, memory_cost))

    def step(self):
        while self.queue and len(self.batch) < self.max_batch_size:
            rid, n, c = self.queue[0]
            if self.max_memory is not None and self.used() + c > self.max_memory:
                break
            self.queue.popleft()
            self.batch[rid] = [n, c]
        return self.tick()


class MemoryDropsHopeless(Sched):  # throws away a request that can never fit
    def step(self):
        while self.queue and len(self.batch) < self.max_batch_size:
            rid, n, c = self.queue[0]
            if self.max_memory is not None and c > self.max_memory:
                self.queue.popleft()
                continue
            if self.max_memory is not None and self.used() + c > self.max_memory:
                break
            self.queue.popleft()
            self.batch[rid] = [n, c]
        return self.tick()


class MemoryRunsHopelessAlone(Sched):
    def step(self):
        while self.queue and len(self.batch) < self.max_batch_size:
            rid, n, c = self.queue[0]
            if self.max_memory is not None and self.used() + c > self.max_memory and self.batch:
                break
            self.queue.popleft()
            self.batch[rid] = [n, c]
            if self.max_memory is not None and self.used() > self.max_memory:
                break
        return self.tick()


class MemoryRoundsCosts(Sched):
    def step(self):
        while self.queue and len(self.batch) < self.max_batch_size:
            rid, n, c = self.queue[0]
            if self.max_memory is not None and round(self.used() + c) > self.max_memory:
                break
            self.queue.popleft()
            self.batch[rid] = [n, c]
        return self.tick()


# --- chapter 6 ---------------------------------------------------------------------------------------------
def _need(state, extra=0):
    bs = state.block_size
    return sum(max(0, -(-(r.num_computed_tokens + r.num_scheduled_tokens + extra) // bs) - r.num_blocks)
               for r in state.running)


def budget_numpy(state):  # correct, in numpy ints and a plain tuple
    return (np.int64(state.num_free_blocks - _need(state) - state.watermark_blocks),
            np.int32(state.max_batched_tokens - sum(r.num_scheduled_tokens for r in state.running)),
            state.max_batch_size - len(state.running))


def budget_as_dict(state):
    return {"blocks": state.num_free_blocks - _need(state), "tokens": 0, "slots": 0}


def budget_watermark_twice(state):
    return Budget(state.num_free_blocks - _need(state) - 2 * state.watermark_blocks,
                  state.max_batched_tokens - sum(r.num_scheduled_tokens for r in state.running),
                  state.max_batch_size - len(state.running))


def budget_next_token_too(state):
    return Budget(state.num_free_blocks - _need(state, extra=1) - state.watermark_blocks,
                  state.max_batched_tokens - sum(r.num_scheduled_tokens for r in state.running),
                  state.max_batch_size - len(state.running))


def budget_float_tokens(state):
    return Budget(state.num_free_blocks - _need(state) - state.watermark_blocks,
                  state.max_batched_tokens - math.fsum(r.num_scheduled_tokens for r in state.running),
                  state.max_batch_size - len(state.running))


def loop_decode_before_admit(engine):
    engine.reap()
    engine.budget()
    engine.decode()
    engine.admit()
    engine.preempt()


def loop_admit_first(engine):
    engine.admit()
    engine.reap()
    engine.budget()
    engine.preempt()
    engine.decode()


def loop_decodes_twice(engine):
    for name in ("reap", "budget", "admit", "preempt", "decode", "decode"):
        getattr(engine, name)()


def loop_reaps_every_other_step(engine, _n=[0]):  # noqa: B006 - the state is the bug
    _n[0] += 1
    if _n[0] % 2:
        engine.reap()
    engine.budget()
    engine.admit()
    engine.preempt()
    engine.decode()


# --- chapter 7 ---------------------------------------------------------------------------------------------
def _metrics(timeline, tpot=None, throughput=None):
    ttft = {r["id"]: r["token_times"][0] - r["arrival"] for r in timeline}
    gaps = {r["id"]: (r["token_times"][-1] - r["token_times"][0]) / (len(r["token_times"]) - 1)
            if len(r["token_times"]) > 1 else None for r in timeline}
    tokens = sum(len(r["token_times"]) for r in timeline)
    span = max(r["token_times"][-1] for r in timeline) - min(r["arrival"] for r in timeline)
    return {"ttft": ttft, "tpot": gaps if tpot is None else tpot(timeline),
            "throughput": tokens / span if throughput is None else throughput(timeline)}


def metrics_numpy(timeline):  # correct: numpy means of the gaps, numpy floats
    out = _metrics(timeline)
    out["tpot"] = {r["id"]: np.mean(np.diff(r["token_times"])) if len(r["token_times"]) > 1 else None
                   for r in timeline}
    out["ttft"] = {k: np.float64(v) for k, v in out["ttft"].items()}
    return out


def metrics_float32(timeline):  # correct, in numpy float32: a relative error of ~1e-7
    out = _metrics(timeline)
    out["ttft"] = {k: np.float32(v) for k, v in out["ttft"].items()}
    out["throughput"] = np.float32(out["throughput"])
    return out


def metrics_statistics(timeline):  # correct: statistics.mean of the gaps, in a different order
    out = _metrics(list(reversed(timeline)))
    out["tpot"] = {r["id"]: statistics.mean(b - a for a, b in zip(r["token_times"], r["token_times"][1:]))
                   if len(r["token_times"]) > 1 else None for r in timeline}
    return out


def metrics_gap_over_wait(timeline):  # TPOT from arrival over the gaps
    return _metrics(timeline, tpot=lambda tl: {r["id"]: (r["token_times"][-1] - r["arrival"]) / (len(r["token_times"]) - 1)
                                              if len(r["token_times"]) > 1 else None for r in tl})


def metrics_gaps_counted(timeline):  # throughput counts the gaps, not the tokens
    def rate(tl):
        span = max(r["token_times"][-1] for r in tl) - min(r["arrival"] for r in tl)
        return sum(len(r["token_times"]) - 1 for r in tl) / span
    return _metrics(timeline, throughput=rate)


def metrics_list_ends(timeline):
    return _metrics(timeline, throughput=lambda tl: sum(len(r["token_times"]) for r in tl)
                    / (tl[-1]["token_times"][-1] - tl[0]["arrival"]))


def metrics_sorts_timeline(timeline):
    timeline.sort(key=lambda r: r["arrival"])
    return _metrics(timeline)


def metrics_ms(timeline):
    out = _metrics(timeline)
    out["ttft"] = {k: 1e3 * v for k, v in out["ttft"].items()}
    out["tpot"] = {k: None if v is None else 1e3 * v for k, v in out["tpot"].items()}
    return out


def metrics_ttft_from_first_listed(timeline):
    out = _metrics(timeline)
    out["ttft"] = {r["id"]: r["token_times"][0] - timeline[0]["arrival"] for r in timeline}
    return out


def metrics_throughput_per_request_mean(timeline):  # a mean of rates over the whole run: no known slip
    def rate(tl):
        end = max(r["token_times"][-1] for r in tl)
        return statistics.mean(len(r["token_times"]) / (end - r["arrival"]) for r in tl) * len(tl) / 2
    return _metrics(timeline, throughput=rate)


def metrics_ttft_as_list(timeline):
    out = _metrics(timeline)
    out["ttft"] = list(out["ttft"].values())
    return out


# --- chapter 8 ---------------------------------------------------------------------------------------------
def _keys(tokens, bs):
    keys, parent = [], ROOT_KEY
    for start in range(0, len(tokens) - bs + 1, bs):
        parent = block_key(parent, tokens[start:start + bs])
        keys.append(parent)
    return keys


def prefix_tuple_style(tokens, bs, cached):  # correct: a tuple of keys, a generator for the count
    keys = tuple(_keys(tokens, bs))
    hit = next((i for i, k in enumerate(keys) if k not in cached), len(keys))
    return keys, min(hit, (len(tokens) - 1) // bs) * bs


def prefix_one_block_short(tokens, bs, cached):  # caps one block too low
    keys = _keys(tokens, bs)
    hit = next((i for i, k in enumerate(keys) if k not in cached), len(keys))
    return keys, min(hit, len(tokens) // bs - 1) * bs


def prefix_whole_prefix_hashed(tokens, bs, cached):
    keys, parent = [], ROOT_KEY
    for end in range(bs, len(tokens) + 1, bs):
        parent = block_key(parent, tokens[:end])
        keys.append(parent)
    hit = next((i for i, k in enumerate(keys) if k not in cached), len(keys))
    return keys, min(hit, (len(tokens) - 1) // bs) * bs


def prefix_hex_keys(tokens, bs, cached):
    keys = _keys(tokens, bs)
    hit = next((i for i, k in enumerate(keys) if k not in cached), len(keys))
    return [k.hex() for k in keys], min(hit, (len(tokens) - 1) // bs) * bs


def victim_loop(running):  # correct: a scan with >=, no sorting
    best = None
    for rid, prio, arrival in running:
        if best is None or (prio, arrival) >= best[1:]:
            best = (rid, prio, arrival)
    return best[0]


def victim_sorted_copy(running):  # correct: sort a copy, stable, last wins
    return sorted(running, key=lambda r: (r[1], r[2]))[-1][0]


def victim_sorts_in_place(running):
    running.sort(key=lambda r: (r[1], r[2]))
    return running[-1][0]


def victim_whole_tuple(running):
    return max(running, key=lambda r: (r[1], r[2]))


def victim_index(running):
    return max(range(len(running)), key=lambda i: (running[i][1], running[i][2], i))


def victim_admit_order(running):
    return min(running, key=lambda r: (r[1], r[2]))[0]


def victim_latest_listed_of_lowest(running):
    worst = max(p for _, p, _ in running)
    return [rid for rid, p, _ in running if p == worst][-1]


RIGHT = [
    (check_kv_bytes_per_token, kv_by_key), (check_kv_bytes_per_token, kv_numpy),
    (check_blocks_needed, blocks_divmod), (check_blocks_needed, blocks_loop),
    (check_slot_mapping, slots_numpy), (check_slot_mapping, slots_generator),
    (check_allocator, Right), (check_allocator, HeapAllocator),
    (check_continuous_scheduler, HeapFifo), (check_memory_scheduler, HeapFifo),
    (check_static_scheduler, StaticBySlices),
    (check_budget, budget_numpy),
    (check_serving_metrics, metrics_numpy), (check_serving_metrics, metrics_statistics),
    (check_serving_metrics, metrics_float32),
    (check_prefix_hit, prefix_tuple_style),
    (check_choose_victim, victim_loop), (check_choose_victim, victim_sorted_copy),
]

WRONG = [
    (check_kv_bytes_per_token, kv_float, "returned a float"),
    (check_kv_bytes_per_token, kv_kib, "your answer is 1/1024 of the right one"),
    (check_kv_bytes_per_token, kv_group_size, "group size instead of KV heads"),
    (check_kv_bytes_per_token, kv_fp16_only, "bytes fixed at 2 (fp16)"),
    (check_kv_bytes_per_token, kv_patches_config, "changed its input"),
    (check_kv_bytes_per_token, kv_heads_and_no_layers, "a different product of the fields"),
    (check_kv_bytes_per_token, kv_extra_layer, "a term added or left out"),
    (check_blocks_needed, blocks_true_division, "returned a float"),
    (check_blocks_needed, blocks_minus_one, "one block too few"),
    (check_blocks_needed, blocks_rounding_trick,
     "you fail only where the last block is only partly filled (17 tokens in blocks of 16)"),
    (check_slot_mapping, slots_last_block, "every token in the last block"),
    (check_slot_mapping, slots_sorted_table, "right offset, wrong block"),
    (check_slot_mapping, slots_sorts_table_in_place, "changed its input"),
    (check_slot_mapping, slots_relative, "positions counted from the first new token"),
    (check_slot_mapping, slots_skip_first, "fewer items than expected"),
    (check_allocator, HintLedFree, "a block freed twice in one call"),
    (check_allocator, SortsFreeList, "the pool is scanned"),
    (check_allocator, MembershipDoubleFree, "the pool is scanned"),
    (check_allocator, ScansRefCounts, "the pool is scanned"),
    (check_allocator, ReturnsTuple, "returned a tuple"),
    (check_allocator, ClearsItsArgument, "changed its input"),
    (check_allocator, ExactFitRefused, "exact fit refused"),
    (check_allocator, WrongErrorType, "operation 3 breaks a rule"),
    (check_continuous_scheduler, ClassLevelQueue, "state shared between schedulers"),
    (check_continuous_scheduler, ReturnsGenerator, "returned a generator"),
    (check_continuous_scheduler, OnlyNewcomers, "a rule of the schedule is broken"),
    (check_continuous_scheduler, AdmitsIfBatchHalfEmpty, "a rule of the schedule is broken"),
    (check_continuous_scheduler, StringIds, "a rule of the schedule is broken"),
    (check_static_scheduler, StaticSortedByLength, "a rule of the schedule is broken"),
    (check_static_scheduler, StaticTopsUp, "a rule of the schedule is broken"),
    (check_memory_scheduler, MemoryDefaultZero, "default memory_cost is not 1"),
    (check_memory_scheduler, MemoryDropsHopeless, "a rule of the schedule is broken"),
    (check_memory_scheduler, MemoryRunsHopelessAlone, "over-budget request admitted when the batch is empty"),
    (check_memory_scheduler, MemoryRoundsCosts, "a rule of the schedule is broken"),
    (check_budget, budget_as_dict, "returned a dict"),
    (check_budget, budget_watermark_twice, "only blocks is wrong"),
    (check_budget, budget_next_token_too, "only blocks is wrong"),
    (check_budget, budget_float_tokens, "is a float"),
    (check_engine_loop, loop_decode_before_admit, "decode runs before admit"),
    (check_engine_loop, loop_admit_first, "admit before budget"),
    (check_engine_loop, loop_decodes_twice, "your step() calls decode more than once"),
    (check_serving_metrics, metrics_gap_over_wait, "tpot includes the wait"),
    (check_serving_metrics, metrics_gaps_counted, "first tokens not counted"),
    (check_serving_metrics, metrics_list_ends, "span from the list's first and last entries"),
    (check_serving_metrics, metrics_sorts_timeline, "changed its input"),
    (check_serving_metrics, metrics_ms, "milliseconds instead of seconds"),
    (check_serving_metrics, metrics_ttft_as_list, "ttft is not a dict"),
    (check_serving_metrics, metrics_ttft_from_first_listed, "ttft from the first arrival"),
    (check_serving_metrics, metrics_throughput_per_request_mean, "only throughput is wrong"),
    (check_prefix_hit, prefix_one_block_short, "your keys are right, the token count is not"),
    (check_prefix_hit, prefix_whole_prefix_hashed, "key 1 is wrong while key 0 is right"),
    (check_prefix_hit, prefix_hex_keys, "keys that are not bytes"),
    (check_choose_victim, victim_sorts_in_place, "changed its input"),
    (check_choose_victim, victim_whole_tuple, "returned the whole tuple"),
    (check_choose_victim, victim_index, "returned a position in the list"),
    (check_choose_victim, victim_admit_order, "the request to serve next"),
    (check_choose_victim, victim_latest_listed_of_lowest, "list position instead of arrival"),
]


def _id(x):
    return getattr(x, "__name__", str(x))


@pytest.mark.parametrize("check, impl", RIGHT, ids=[f"{_id(c)}-{_id(i)}" for c, i in RIGHT])
def test_correct_answers_in_unusual_styles_pass(check, impl):
    result = check(impl, quiet=True)
    assert result, result.report


@pytest.mark.parametrize("check, impl, diagnosis", WRONG, ids=[f"{_id(c)}-{_id(i)}" for c, i, _ in WRONG])
def test_each_contract_clause_catches_its_violation_by_name(check, impl, diagnosis):
    result = check(impl, quiet=True)
    assert not result, f"{_id(impl)} passed"
    assert result.mistake == diagnosis, result.report
    assert result.explanation and result.report.count("💡") == 1 and "🤔" not in result.report


def test_a_step_that_changes_its_order_between_steps_is_named():
    result = check_engine_loop(loop_reaps_every_other_step, quiet=True)
    assert not result and result.mistake in ("your step() never calls reap",
                                             "your step() changes its order from one step to the next"), result.report


def test_the_allocator_cost_check_does_not_depend_on_time():
    """The same verdict twice, and the reference's counts the same on both pools."""
    from inflight.exercises import allocator_cases
    from inflight.exercises.paged_allocators import ReferenceAllocator

    case = allocator_cases.cost_case()
    assert case.run(ReferenceAllocator) == case.run(Right) == case.run(HeapAllocator)
    for _ in range(2):
        assert not check_allocator(SortsFreeList, quiet=True)
