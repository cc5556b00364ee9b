"""Do the books balance? The checks `LLMEngine(debug=True)` runs after every step (and the tests
run everywhere): every block has as many holders as its reference count says, free + held = total,
each running request holds exactly the blocks its computed tokens need, no request sits in two
queues, and the engine holds exactly the requests that have not ended. For parallel sampling:
each sample belongs to its request's group once, the batch never holds more samples (and slots
reserved for samples to come) than `max_batch_size`, a block shared without the prefix cache is
shared only by samples of one request — and, checked before each forward pass
(`check_batch_writes`), no token is ever written into a block someone else still holds.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from inflight.engine.block_manager import blocks_needed
from inflight.engine.parallel_sampling import draws, request_finished
from inflight.engine.sequence import SequenceStatus

if TYPE_CHECKING:  # pragma: no cover
    from inflight.engine.block_manager import BlockAllocator
    from inflight.engine.scheduler import Scheduler
    from inflight.engine.scheduler_types import SchedulerOutput
    from inflight.engine.sequence import Sequence

__all__ = ["check_scheduler", "check_requests", "check_batch_writes"]


def _check_queues(sched: "Scheduler") -> None:
    seen: set[int] = set()
    for name, queue in (("waiting", sched.waiting), ("running", sched.running), ("swapped", sched.swapped)):
        for s in queue:
            assert id(s) not in seen, f"request {s.request_id} is in two queues"
            seen.add(id(s))
            assert s.finish_reason is None or name == "running", f"finished request {s.request_id} still {name}"
    for s in sched.waiting:
        assert s.status is SequenceStatus.WAITING and not s.block_table and s.num_computed_tokens == 0, \
            f"waiting request {s.request_id} holds blocks or computed tokens"
    for s in sched.swapped:
        assert s.status is SequenceStatus.SWAPPED and not s.block_table, f"swapped {s.request_id} holds device blocks"
        assert len(s.cpu_block_table) == blocks_needed(s.num_computed_tokens, sched.block_size), \
            f"swapped {s.request_id}: wrong CPU blocks"


def _check_blocks(sched: "Scheduler") -> None:
    owners: dict[int, int] = {}
    for s in sched.running:
        assert s.status is SequenceStatus.RUNNING, f"{s.request_id}: running queue but status {s.status}"
        want = blocks_needed(s.num_computed_tokens, sched.block_size)
        assert len(s.block_table) == want, (f"request {s.request_id} holds {len(s.block_table)} blocks but its "
                                            f"{s.num_computed_tokens} computed tokens need {want}")
        for b in s.block_table:
            owners[b] = owners.get(b, 0) + 1
    alloc = sched.allocator
    for b, n in owners.items():
        assert alloc.ref_count(b) == n, f"block {b} owned {n} times, ref count {alloc.ref_count(b)}"
    assert alloc.num_free + len(owners) == alloc.num_blocks, (
        f"free ({alloc.num_free}) + owned ({len(owners)}) != total ({alloc.num_blocks}): blocks leaked")
    if sched.cpu_allocator is not None:
        cpu_owned = sum(len(s.cpu_block_table) for s in sched.swapped)
        assert sched.cpu_allocator.num_used == cpu_owned, "CPU pool blocks leaked"


def _check_prefix_cache(sched: "Scheduler") -> None:
    sched.allocator.check_invariants()  # free / evictable / in use add up, key maps agree
    for s in sched.running:  # a cached block holds exactly the content its key names
        for i, b in enumerate(s.block_table):
            key = sched.allocator.key_of(b)
            assert key is None or (i < len(s.block_hashes) and key == s.block_hashes[i]), \
                f"request {s.request_id}: block {b} (logical {i}) is cached under another prefix's key"


def _check_samples(sched: "Scheduler") -> None:
    slots = sum(draws(s) for s in sched.running)
    assert slots <= sched.config.max_batch_size, (f"the batch holds {slots} samples and reserved slots, more than "
                                                  f"max_batch_size ({sched.config.max_batch_size})")
    sharers: dict[int, str] = {}
    for s in (*sched.waiting, *sched.running, *sched.swapped):
        g = s.group
        if g is None:
            continue
        assert sum(x is s for x in g.samples) == 1, f"request {s.request_id}: sample {s.index} not once in its group"
        assert g.samples[s.index] is s and (g.forked or s.index == 0), \
            f"request {s.request_id}: sample {s.index} out of place (or a sibling before the fork)"
        assert len(g.samples) in (1, g.n), f"request {s.request_id}: {len(g.samples)} of {g.n} samples exist"
    if sched.config.enable_prefix_caching:
        return  # (the prefix cache shares full blocks between any requests with the same prefix)
    for s in sched.running:
        for b in s.block_table:
            if sched.allocator.ref_count(b) > 1:
                owner = sharers.setdefault(b, s.request_id)
                assert owner == s.request_id, f"block {b} is shared by requests {owner} and {s.request_id}"


def check_batch_writes(batch: "SchedulerOutput", allocator: "BlockAllocator") -> None:
    """Before a forward pass: every block the batch's new tokens are written into is held by the
    writing sequence alone (copy-on-write happened), and exists (the table has grown)."""
    bs = allocator.block_size
    for s in batch.seqs:
        c, q = s.num_computed_tokens, s.num_scheduled_tokens
        for i in range(c // bs, blocks_needed(c + q, bs)):
            assert i < len(s.block_table), f"request {s.request_id}: no block for position {i * bs} yet"
            held = allocator.ref_count(s.block_table[i])
            assert held == 1, (f"request {s.request_id} (sample {s.index}) would write into block "
                               f"{s.block_table[i]}, which {held} sequences hold")


def check_scheduler(sched: "Scheduler") -> None:
    """Raise AssertionError if the scheduler's queues and block pools don't balance."""
    _check_queues(sched)
    _check_blocks(sched)
    _check_samples(sched)
    if sched.config.enable_prefix_caching:
        _check_prefix_cache(sched)


def check_requests(sched: "Scheduler", requests: Iterable["Sequence"], arrived: Iterable["Sequence"] = ()) -> None:
    """The engine holds exactly the unfinished requests: each one it holds is live in a queue (or,
    prefilled by another engine, waiting for blocks here: `arrived`), and each live one is held (a
    request that ended has been handed out and forgotten)."""
    live = {s.request_id for q in (sched.waiting, sched.running, sched.swapped, arrived) for s in q
            if s.finish_reason is None}
    tracked = {s.request_id: s for s in requests}
    ended = sorted(rid for rid, s in tracked.items() if request_finished(s))
    assert not ended, f"requests that ended are still held: {ended[:5]}"
    lost = set(tracked) - live
    assert not lost, f"requests lost: {sorted(lost)[:5]}"
    untracked = live - set(tracked)
    assert not untracked, f"requests running that the engine does not hold: {sorted(untracked)[:5]}"
