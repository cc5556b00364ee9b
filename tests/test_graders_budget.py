"""The budget grader (chapter 6): right answers in any form pass, a stub is "not implemented yet",
and each classic mistake — written here independently of the package's mutants — is named as itself."""
import random

from inflight.engine.block_manager import BlockAllocator, blocks_needed
from inflight.engine.budget import Budget, BudgetInputs, PlannedRequest, compute_budget
from inflight.engine.scheduler import Scheduler, SchedulerConfig
from inflight.engine.sampling import SamplingParams
from inflight.engine.sequence import Sequence
from inflight.exercises.engine_budget import MISTAKES, check_budget, measure_budget


def right(state):
    bs = state.block_size
    promised = 0
    for r in state.running:
        promised += max(0, -(-(r.num_computed_tokens + r.num_scheduled_tokens) // bs) - r.num_blocks)
    return Budget(state.num_free_blocks - promised - state.watermark_blocks,
                  state.max_batched_tokens - sum(r.num_scheduled_tokens for r in state.running),
                  state.max_batch_size - len(state.running))


def test_right_answers_pass_in_any_form():
    assert check_budget(compute_budget, quiet=True)
    assert check_budget(right, quiet=True)
    # a tuple, and a budget clamped at zero blocks (admission behaves the same), pass too
    assert check_budget(lambda s: (right(s).blocks, right(s).tokens, right(s).slots), quiet=True)
    assert check_budget(lambda s: Budget(max(0, right(s).blocks), right(s).tokens, right(s).slots), quiet=True)


def test_stub_is_not_implemented_yet():
    def stub(state):
        raise NotImplementedError("Your turn")
    result = check_budget(stub, quiet=True)
    assert not result and result.not_implemented and "not implemented yet" in result.report


def test_wrong_return_type_is_explained():
    result = check_budget(lambda s: {"blocks": 1}, quiet=True)
    assert not result and "Budget" in result.report


# -- mutants, one per classic mistake ------------------------------------------------------------
def _need(state, tokens_of):
    return sum(max(0, blocks_needed(tokens_of(r), state.block_size) - r.num_blocks) for r in state.running)


def _left_tokens(state):
    return state.max_batched_tokens - sum(r.num_scheduled_tokens for r in state.running)


def forgets_watermark(state):
    free = state.num_free_blocks - _need(state, lambda r: r.num_computed_tokens + r.num_scheduled_tokens)
    return Budget(free, _left_tokens(state), state.max_batch_size - len(state.running))


def reserves_nothing(state):
    return Budget(state.num_free_blocks - state.watermark_blocks, _left_tokens(state),
                  state.max_batch_size - len(state.running))


def every_decode_takes_a_block(state):
    promised = len([r for r in state.running if r.num_scheduled_tokens == 1])
    promised += sum(blocks_needed(r.num_scheduled_tokens, state.block_size)
                    for r in state.running if r.num_scheduled_tokens > 1)
    return Budget(state.num_free_blocks - promised - state.watermark_blocks, _left_tokens(state),
                  state.max_batch_size - len(state.running))


def counts_held_blocks_again(state):
    promised = sum(blocks_needed(r.num_computed_tokens + r.num_scheduled_tokens, state.block_size)
                   for r in state.running)
    return Budget(state.num_free_blocks - promised - state.watermark_blocks, _left_tokens(state),
                  state.max_batch_size - len(state.running))


def full_token_budget(state):
    b = right(state)
    return Budget(b.blocks, state.max_batched_tokens, b.slots)


def full_slots(state):
    b = right(state)
    return Budget(b.blocks, b.tokens, state.max_batch_size)


def one_token_per_request(state):
    promised = _need(state, lambda r: r.num_computed_tokens + 1)
    return Budget(state.num_free_blocks - promised - state.watermark_blocks,
                  state.max_batched_tokens - len(state.running), state.max_batch_size - len(state.running))


def rounds_down(state):
    bs = state.block_size
    promised = sum(max(0, (r.num_computed_tokens + r.num_scheduled_tokens) // bs - r.num_blocks) for r in state.running)
    return Budget(state.num_free_blocks - promised - state.watermark_blocks, _left_tokens(state),
                  state.max_batch_size - len(state.running))


def tokens_per_request(state):
    b = right(state)
    return Budget(b.blocks, state.max_batched_tokens - len(state.running), b.slots)


MUTANTS = [
    (rounds_down, "blocks needed rounded down", "floor division"),
    (tokens_per_request, "tokens counted per request", "chunk"),
    (forgets_watermark, "the watermark is forgotten", "watermark"),
    (reserves_nothing, "nothing reserved for the running requests", "preemptions"),
    (every_decode_takes_a_block, "a new block for every decode", "last block is full"),
    (counts_held_blocks_again, "the blocks already held are not subtracted", "already holds"),
    (full_token_budget, "the token budget ignores the running requests", "max_batched_tokens"),
    (full_slots, "the slots ignore the running requests", "max_batch_size"),
    (one_token_per_request, "every running request plans one token", "chunk"),
]


def test_every_mistake_is_named_as_itself_with_measured_numbers():
    assert {name for _, name, _ in MUTANTS} == set(MISTAKES)
    for mutant, name, words in MUTANTS:
        result = check_budget(mutant, quiet=True)
        assert not result, name
        assert result.mistake == name, (name, result.mistake, result.report)
        assert result.report.count("💡") == 1 and "🤔" not in result.report
        assert words in result.explanation, (name, result.explanation)
        assert any(ch.isdigit() for ch in result.explanation), "explanations quote measured numbers"


def test_a_slip_in_one_field_is_located():
    """No known mistake, but the report says which of the three numbers is wrong, and by how much."""
    def off_by_one_slot(state):
        b = right(state)
        return Budget(b.blocks, b.tokens, b.slots - 1)
    result = check_budget(off_by_one_slot, quiet=True)
    assert not result and result.mistake == "only slots is wrong", result.report
    assert "always -1" in result.explanation and "max_batch_size − len(running)" in result.explanation


def test_numpy_ints_pass_and_floats_are_named():
    import numpy as np

    assert check_budget(lambda s: Budget(*(np.int64(v) for v in (right(s).blocks, right(s).tokens, right(s).slots))),
                        quiet=True)
    result = check_budget(lambda s: Budget(right(s).blocks * 1.0, right(s).tokens, right(s).slots), quiet=True)
    assert not result and result.mistake == "is a float" and "Budget.blocks is a float" in result.explanation


def test_the_measured_consequences_are_real():
    ref = measure_budget(right, "growing requests, watermark 3")
    assert measure_budget(forgets_watermark, "growing requests, watermark 3")["preemptions"] > ref["preemptions"]
    chunks = measure_budget(full_token_budget, "long prompts in chunks")
    assert chunks["most tokens in a step"] > 12 >= measure_budget(right, "long prompts in chunks")["most tokens in a step"]
    assert measure_budget(full_slots, "many small requests")["most requests running"] > 3


def test_the_engine_budgets_with_compute_budget():
    # the scheduler's own budget() is compute_budget over its plan: same numbers on random states
    rng = random.Random(0)
    for trial in range(30):
        bs = rng.choice([2, 4, 16])
        alloc = BlockAllocator(64, bs)
        cfg = SchedulerConfig(max_batch_size=8, max_batched_tokens=rng.choice([16, 64]),
                              watermark_blocks=rng.randint(0, 3))
        sched = Scheduler(alloc, cfg)
        for i in range(rng.randint(0, 6)):
            n = rng.randint(1, 30)
            seq = Sequence(str(i), list(range(1, n + 1)), SamplingParams(max_tokens=8, ignore_eos=True),
                           arrival_time=float(i), seq_no=i)
            seq.num_computed_tokens = rng.randint(0, n - 1)
            seq.block_table = alloc.allocate(blocks_needed(seq.num_computed_tokens, bs))
            sched.running.append(seq)
        seen = []
        got = sched.budget(lambda state: seen.append(state) or compute_budget(state))
        state = seen[0]
        assert got == compute_budget(state)
        assert state.num_free_blocks == alloc.num_free and len(state.running) == len(sched.running)
        assert [r.num_scheduled_tokens for r in state.running] == [s.num_scheduled_tokens for s in sched.running]
        assert isinstance(state, BudgetInputs) and all(isinstance(r, PlannedRequest) for r in state.running)
