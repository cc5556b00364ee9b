"""Grader for chapter 6's second exercise: the budget of one step (`compute_budget`).

The learner writes `my_budget(state)`: given a `BudgetInputs` (the running requests' plan for this
step, the free blocks, the block size, the watermark and the limits) it returns a `Budget` of blocks,
tokens and slots left for admission. The grader checks it two ways:

* on prepared states, value by value (a budget of zero or fewer blocks counts as "none": admission
  behaves the same whatever the negative number);
* inside `SimEngine` — the engine's own scheduler over a simulated KV pool — on whole workloads,
  where the learner's budget decides admission: it measures what admission then did (preemptions,
  blocks handed out that running requests needed, tokens and requests per step, time to first
  token, steps).

A wrong budget is recognised by behaving like a classic mistake on every case, and explained with
the numbers that mistake measured.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from inflight.engine.block_manager import blocks_needed
from inflight.engine.budget import Budget, BudgetInputs, PlannedRequest, compute_budget
from inflight.exercises.grading import Case, GradeResult, Mistake, grade
from inflight.sim.engine_sim import SimEngine
from inflight.sim.workloads import Request

__all__ = ["check_budget", "reference_budget", "STATES", "WORKLOADS", "measure_budget", "MISTAKES"]

reference_budget = compute_budget


class _Seen(NamedTuple):
    """A budget as the grader compares it (blocks <= 0 all read "none": admission does the same)."""

    blocks: int | str
    tokens: int
    slots: int

    def __repr__(self) -> str:
        return f"blocks={self.blocks}, tokens={self.tokens}, slots={self.slots}"


def _as_triple(result: Any) -> _Seen:
    """(blocks or "none", tokens, slots) of whatever the learner returned (a Budget or a 3-tuple)."""
    if isinstance(result, Budget):
        blocks, tokens, slots = result.blocks, result.tokens, result.slots
    elif isinstance(result, (tuple, list)) and len(result) == 3:
        blocks, tokens, slots = result
    else:
        raise TypeError(f"return a Budget(blocks=..., tokens=..., slots=...), not {type(result).__name__}")
    for name, v in (("blocks", blocks), ("tokens", tokens), ("slots", slots)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"Budget.{name} must be an int, got {v!r}")
    return _Seen("none" if blocks <= 0 else blocks, tokens, slots)


def _budget_fn(impl: Callable[[BudgetInputs], Any]) -> Callable[[BudgetInputs], Budget]:
    def fn(state: BudgetInputs) -> Budget:
        blocks, tokens, slots = _as_triple(impl(state))
        return Budget(0 if blocks == "none" else blocks, tokens, slots)
    return fn


# -- prepared states -----------------------------------------------------------------------------
def _state(running, free, *, block_size=4, watermark=0, max_tokens=32, max_batch=4) -> BudgetInputs:
    return BudgetInputs(tuple(PlannedRequest(*r) for r in running), free, block_size, watermark, max_tokens, max_batch)


#: name → (state, what it shows). Running requests are (num_computed_tokens, num_scheduled_tokens, num_blocks).
STATES = {
    "two decodes, both with room in their last block": (
        _state([(5, 1, 2), (9, 1, 3)], 6, watermark=1), "blocks of 4; the new tokens land in blocks they hold"),
    "a decode whose last block is full": (
        _state([(8, 1, 2), (6, 1, 2)], 3), "token 9 of the first request starts its third block"),
    "a prompt prefilled in chunks beside a decode": (
        _state([(8, 12, 2), (3, 1, 1)], 5, watermark=1, max_tokens=16),
        "the chunk of 12 tokens covers positions 8..19: three more blocks"),
    "a watermark of 2": (_state([(2, 1, 1)], 4, watermark=2), "one decode with room, 4 free blocks"),
    "the batch is full": (_state([(1, 1, 1)] * 4, 7), "max_batch_size = 4 requests already run"),
    "nothing is running": (_state([], 10, watermark=1, max_tokens=24, max_batch=3), "an idle engine"),
    "the running requests need more than is free": (
        _state([(4, 1, 1), (8, 1, 2), (12, 1, 3)], 2, watermark=1), "three decodes, each starting a new block"),
    "blocks of 16, long contexts": (
        _state([(47, 1, 3), (48, 1, 3), (100, 28, 7)], 9, block_size=16, watermark=1, max_tokens=64, max_batch=8),
        "two decodes around a block boundary and a chunk of 28"),
}


def _state_case(name: str) -> Case:
    state, what = STATES[name]
    return Case(f"state: {name}", lambda impl, s=state: _as_triple(impl(s)),
                describe=f"{what}; running (computed, scheduled, held) = "
                         f"{[(r.num_computed_tokens, r.num_scheduled_tokens, r.num_blocks) for r in state.running]}, "
                         f"free={state.num_free_blocks}, block_size={state.block_size}, "
                         f"watermark={state.watermark_blocks}, max_batched_tokens={state.max_batched_tokens}, "
                         f"max_batch_size={state.max_batch_size}")


# -- whole workloads in SimEngine ----------------------------------------------------------------
def _requests(*specs: tuple) -> list[Request]:
    return [Request(str(i), p, o, *rest) for i, (p, o, *rest) in enumerate(specs)]


WORKLOADS = {
    "tight pool": dict(requests=_requests((6, 3), (5, 9), (7, 4), (4, 12), (6, 2, 1), (5, 6, 2), (8, 5, 3),
                                          (3, 8, 4), (6, 3, 6), (4, 10, 7)),
                       num_blocks=10, block_size=4, max_batch_size=4, max_batched_tokens=32),
    "growing requests, watermark 3": dict(requests=_requests((6, 11, 3), (6, 13, 1), (3, 12, 3), (6, 6, 0), (5, 8, 1),
                                                             (2, 12, 6), (2, 13, 3), (5, 14, 5)),
                                          num_blocks=10, block_size=4, max_batch_size=4, max_batched_tokens=32,
                                          watermark_blocks=3),
    "long prompts in chunks": dict(requests=_requests((3, 12), (4, 12), (30, 4, 2), (26, 4, 3), (5, 6, 4), (3, 5, 5)),
                                   num_blocks=24, block_size=4, max_batch_size=6, max_batched_tokens=12),
    "many small requests": dict(requests=_requests(*[(2, 3, i // 3) for i in range(12)]),
                                num_blocks=40, block_size=4, max_batch_size=3, max_batched_tokens=32),
}


def measure_budget(impl: Callable[[BudgetInputs], Any], workload: str, max_steps: int = 300) -> dict:
    """Run a workload in `SimEngine` with `impl` as the budget (the rest is the engine's own code)."""
    cfg = WORKLOADS[workload]
    engine = SimEngine(**cfg)
    fn = _budget_fn(impl)

    def step(e: SimEngine) -> None:
        e.reap()
        e.budget(fn)
        e.admit()
        e.preempt()
        e.decode()

    max_tokens = max_running = 0
    while not engine.done() and engine.step_no < max_steps:
        rec = engine.run_step(step)
        max_tokens = max(max_tokens, rec["tokens"])
        max_running = max(max_running, len(engine.scheduler.running))
    ttft = [s.first_token_time - s.arrival_time for s in engine.seqs if s.first_token_time is not None]
    log = engine.log
    return {
        "finished": sum(s.finish_reason is not None for s in engine.seqs),
        "steps": engine.step_no,
        "preemptions": sum(r["preempted"] for r in log),
        "blocks taken from running requests": sum(r["overcommitted_blocks"] for r in log),
        "most requests running": max_running,
        "most tokens in a step": max_tokens,
        "mean TTFT (steps)": round(sum(ttft) / len(ttft), 2) if ttft else None,
    }


def _workload_case(name: str) -> Case:
    cfg = WORKLOADS[name]
    return Case(f"workload: {name}", lambda impl, n=name: measure_budget(impl, n),
                describe=f"{len(cfg['requests'])} requests through SimEngine with your budget "
                         f"({cfg['num_blocks']} blocks of {cfg['block_size']}, "
                         f"watermark {cfg.get('watermark_blocks', 0)}, max_batch_size {cfg['max_batch_size']}, "
                         f"max_batched_tokens {cfg['max_batched_tokens']})")


def _cases() -> list[Case]:
    return [_state_case(n) for n in STATES] + [_workload_case(n) for n in WORKLOADS]


# -- classic mistakes, as code -------------------------------------------------------------------
def _promised(state: BudgetInputs) -> int:
    return sum(max(0, blocks_needed(r.num_computed_tokens + r.num_scheduled_tokens, state.block_size) - r.num_blocks)
               for r in state.running)


def _tokens(state: BudgetInputs) -> int:
    return state.max_batched_tokens - sum(r.num_scheduled_tokens for r in state.running)


def _slots(state: BudgetInputs) -> int:
    return state.max_batch_size - len(state.running)


def no_watermark(state: BudgetInputs) -> Budget:
    return Budget(state.num_free_blocks - _promised(state), _tokens(state), _slots(state))


def nothing_reserved(state: BudgetInputs) -> Budget:
    return Budget(state.num_free_blocks - state.watermark_blocks, _tokens(state), _slots(state))


def new_block_per_decode(state: BudgetInputs) -> Budget:
    promised = sum(blocks_needed(r.num_scheduled_tokens, state.block_size) for r in state.running)
    return Budget(state.num_free_blocks - promised - state.watermark_blocks, _tokens(state), _slots(state))


def whole_requests_reserved(state: BudgetInputs) -> Budget:
    promised = sum(blocks_needed(r.num_computed_tokens + r.num_scheduled_tokens, state.block_size)
                   for r in state.running)
    return Budget(state.num_free_blocks - promised - state.watermark_blocks, _tokens(state), _slots(state))


def tokens_not_spent(state: BudgetInputs) -> Budget:
    return Budget(state.num_free_blocks - _promised(state) - state.watermark_blocks, state.max_batched_tokens,
                  _slots(state))


def slots_not_spent(state: BudgetInputs) -> Budget:
    return Budget(state.num_free_blocks - _promised(state) - state.watermark_blocks, _tokens(state),
                  state.max_batch_size)


def one_token_each(state: BudgetInputs) -> Budget:
    promised = sum(max(0, blocks_needed(r.num_computed_tokens + 1, state.block_size) - r.num_blocks)
                   for r in state.running)
    return Budget(state.num_free_blocks - promised - state.watermark_blocks,
                  state.max_batched_tokens - len(state.running), _slots(state))


# name → (mutant, explanation template filled with the mutant's and the reference's measurements)
MISTAKES: dict[str, tuple[Callable, str]] = {
    "the watermark is forgotten": (
        no_watermark,
        "admission handed out the blocks the watermark keeps free for growth. On the 'growing requests, "
        "watermark 3' workload that made {w_pre} preemptions where the right budget made {ref_w_pre}. "
        "Subtract watermark_blocks."),
    "nothing reserved for the running requests": (
        nothing_reserved,
        "the blocks the running requests' planned tokens need were not subtracted, so admission gave them "
        "away and preemption had to take them back: {t_pre} preemptions on the 'tight pool' workload "
        "(right budget: {ref_t_pre}), {t_taken} block(s) handed to newcomers that running requests needed. "
        "Reserve max(0, blocks_needed(computed + scheduled) - held) for each running request."),
    "a new block for every decode": (
        new_block_per_decode,
        "every running request was charged at least one new block, but a decode needs one only when its "
        "last block is full (the token lands in a block it holds otherwise). The budget came out too small: "
        "mean time to first token {t_ttft} steps on the 'tight pool' workload instead of {ref_t_ttft}. "
        "Compare blocks_needed(computed + scheduled) with the blocks the request already holds."),
    "the blocks already held are not subtracted": (
        whole_requests_reserved,
        "each running request was charged all the blocks it will occupy, not just the ones it lacks, so "
        "blocks it already holds were counted twice and admission stalled: mean time to first token "
        "{t_ttft} steps on the 'tight pool' workload instead of {ref_t_ttft}, {t_steps} steps instead of "
        "{ref_t_steps}. Subtract num_blocks."),
    "the token budget ignores the running requests": (
        tokens_not_spent,
        "the running requests' planned tokens were not subtracted from max_batched_tokens, so admission "
        "packed a step with more tokens than the budget allows: up to {c_tok} tokens in one step on the "
        "'long prompts in chunks' workload, whose limit is {c_limit}."),
    "the slots ignore the running requests": (
        slots_not_spent,
        "the requests already running were not subtracted from max_batch_size, so up to {s_run} requests "
        "ran at once on the 'many small requests' workload, whose max_batch_size is {s_limit}."),
    "every running request plans one token": (
        one_token_each,
        "you counted one token (and at most one block) per running request, but a request whose prompt is "
        "still being prefilled computes a whole chunk this step: its chunk's tokens and blocks were handed "
        "out again. On the 'long prompts in chunks' workload: up to {c_tok} tokens in a step (limit "
        "{c_limit}) and {c_pre} preemption(s) (right budget: {ref_c_pre}). Use num_scheduled_tokens."),
}


def _evidence(impl) -> dict:
    t = measure_budget(impl, "tight pool")
    w = measure_budget(impl, "growing requests, watermark 3")
    c = measure_budget(impl, "long prompts in chunks")
    s = measure_budget(impl, "many small requests")
    return {"t_pre": t["preemptions"], "t_taken": t["blocks taken from running requests"],
            "t_ttft": t["mean TTFT (steps)"], "t_steps": t["steps"], "w_pre": w["preemptions"],
            "c_tok": c["most tokens in a step"], "c_taken": c["blocks taken from running requests"],
            "c_pre": c["preemptions"], "c_limit": WORKLOADS["long prompts in chunks"]["max_batched_tokens"],
            "s_run": s["most requests running"], "s_limit": WORKLOADS["many small requests"]["max_batch_size"]}


_MISTAKES_CACHE: list[Mistake] = []


def _mistakes() -> list[Mistake]:
    if not _MISTAKES_CACHE:
        ref = {f"ref_{k}": v for k, v in _evidence(reference_budget).items()}
        for name, (impl, template) in MISTAKES.items():
            _MISTAKES_CACHE.append(Mistake(name, template.format(**_evidence(impl), **ref), impl))
    return _MISTAKES_CACHE


def check_budget(my_budget: Callable[[BudgetInputs], Any], *, quiet: bool = False) -> GradeResult:
    """Grade `my_budget(state) -> Budget` on prepared states and on whole workloads run in SimEngine."""
    if not callable(my_budget):
        result = GradeResult("the step's budget", False,
                             report="❌ the step's budget: pass your function, e.g. check_budget(my_budget)")
        if not quiet:
            print(result.report)
        return result
    return grade("the step's budget", my_budget, reference_budget, _cases(), _mistakes(), quiet=quiet)
