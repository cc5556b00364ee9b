"""Properties of the five-step scheduler over a simulated pool (no model): for any workload, pool
size, token budget, chunking and preemption mode, the invariants hold after every step, every
request ends exactly once with exactly max_tokens tokens, and nothing leaks."""
from hypothesis import given, settings, strategies as st

from inflight.engine.block_manager import blocks_needed
from inflight.exercises.engine_loop import reference_step
from inflight.sim.engine_sim import SimEngine
from inflight.sim.workloads import Request

lengths = st.lists(st.tuples(st.integers(1, 20), st.integers(1, 15), st.integers(0, 10)), min_size=1, max_size=12)
requests = lengths.map(lambda specs: [Request(str(i), p, o, a) for i, (p, o, a) in enumerate(specs)])


@settings(max_examples=60, deadline=None)
@given(reqs=requests, block_size=st.integers(1, 6), extra_blocks=st.integers(0, 12), batch=st.integers(1, 5),
       tokens=st.integers(0, 30), chunked=st.booleans(), preemption=st.sampled_from(["recompute", "swap"]),
       watermark=st.integers(0, 2))
def test_invariants_and_completion(reqs, block_size, extra_blocks, batch, tokens, chunked, preemption, watermark):
    biggest = max(blocks_needed(r.prompt_len + r.output_len - 1, block_size) for r in reqs)
    engine = SimEngine(reqs, num_blocks=biggest + watermark + extra_blocks, block_size=block_size, max_batch_size=batch,
                       max_batched_tokens=batch + tokens, enable_chunked_prefill=chunked, preemption=preemption,
                       watermark_blocks=watermark)
    sched = engine.scheduler
    while not engine.done():
        rec = engine.run_step(reference_step)
        sched.check_invariants()
        assert rec["wasted_tokens"] == rec["tokens_without_kv"] == rec["overcommitted_blocks"] == 0
        assert rec["tokens"] <= batch + tokens or rec["batch"] == 1  # an over-long prompt may run alone
        assert len(sched.running) <= batch
        assert engine.step_no < 2000, "no progress: livelock"
    sched.reap()
    assert all(s.num_output_tokens == reqs[int(s.request_id)].output_len for s in engine.seqs)
    assert all(s.finish_reason == "length" for s in engine.seqs) and len(engine.seqs) == len(reqs)
    assert sched.allocator.num_free == sched.allocator.num_blocks
    if sched.cpu_allocator is not None:
        assert sched.cpu_allocator.num_free == sched.cpu_allocator.num_blocks
