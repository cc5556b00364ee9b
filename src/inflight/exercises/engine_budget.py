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
from inflight.exercises.answers import Flaw, as_int, type_name
from inflight.exercises.grading import Case, Diagnosis, GradeResult, Mistake, grade
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
    """(blocks or "none", tokens, slots) of whatever the learner returned (a Budget or a 3-tuple of
    ints; numpy ints too), or `Flaw` naming what is wrong with it."""
    if isinstance(result, Budget):
        blocks, tokens, slots = result.blocks, result.tokens, result.slots
    elif isinstance(result, (tuple, list)) and len(result) == 3:
        blocks, tokens, slots = result
    else:
        raise Flaw(f"returned {type_name(result)}", f"{result!r:.80} ({type_name(result)})",
                   f"my_budget returned {type_name(result)}; return a Budget(blocks=..., tokens=..., slots=...) "
                   "(or a 3-tuple in that order).", first=True)
    blocks, tokens, slots = (as_int(v, f"Budget.{name}", "the engine counts blocks, tokens and slots in ints")
                             for name, v in (("blocks", blocks), ("tokens", tokens), ("slots", slots)))
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
    "a chunk that ends exactly on a block boundary": (
        _state([(4, 8, 1), (5, 1, 2)], 6, watermark=1, max_tokens=20),
        "the chunk covers positions 4..11: blocks 2 and 3 exactly, nothing more"),
    "blocks of one token": (_state([(3, 1, 3), (0, 5, 0)], 9, block_size=1, watermark=2, max_tokens=10),
                            "every token takes a block; a prompt starting from nothing"),
    "a watermark bigger than what is free": (_state([(6, 1, 2)], 1, watermark=3, max_batch=2),
                                             "the budget is negative: nothing may be admitted"),
}


def _state_tags(state: BudgetInputs) -> frozenset:
    tags = set()
    if any(r.num_scheduled_tokens > 1 for r in state.running):
        tags.add("chunk")
    if any(r.num_scheduled_tokens == 1 and r.num_computed_tokens % state.block_size == 0 for r in state.running):
        tags.add("full last block")
    if state.watermark_blocks:
        tags.add("watermark")
    if not state.running:
        tags.add("idle")
    return frozenset(tags)


def _state_case(name: str) -> Case:
    state, what = STATES[name]
    return Case(f"state: {name}", lambda impl, s=state: _as_triple(impl(s)), fields=("blocks", "tokens", "slots"),
                tags=_state_tags(state), data=state,
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


def floor_division(state: BudgetInputs) -> Budget:
    promised = sum(max(0, (r.num_computed_tokens + r.num_scheduled_tokens) // state.block_size - r.num_blocks)
                   for r in state.running)
    return Budget(state.num_free_blocks - promised - state.watermark_blocks, _tokens(state), _slots(state))


def tokens_one_per_request(state: BudgetInputs) -> Budget:
    return Budget(state.num_free_blocks - _promised(state) - state.watermark_blocks,
                  state.max_batched_tokens - len(state.running), _slots(state))


def one_token_each(state: BudgetInputs) -> Budget:
    promised = sum(max(0, blocks_needed(r.num_computed_tokens + 1, state.block_size) - r.num_blocks)
                   for r in state.running)
    return Budget(state.num_free_blocks - promised - state.watermark_blocks,
                  state.max_batched_tokens - len(state.running), _slots(state))


# name → (mutant, explanation template filled with the mutant's and the reference's measurements)
MISTAKES: dict[str, tuple[Callable, str]] = {
    "blocks needed rounded down": (
        floor_division,
        "you count the blocks a request needs with floor division, `(computed + scheduled) // block_size`, which "
        "drops a partly filled last block: a decode that starts a new block was promised nothing, so admission "
        "handed that block out and preemption took it back — {t_pre} preemptions on the 'tight pool' workload "
        "(right budget: {ref_t_pre}). Round up: blocks_needed(computed + scheduled, block_size)."),
    "tokens counted per request": (
        tokens_one_per_request,
        "you subtract one token per running request from max_batched_tokens, but a request being prefilled "
        "computes a whole chunk (num_scheduled_tokens) this step: up to {c_tok} tokens in a step on the 'long "
        "prompts in chunks' workload (limit {c_limit}). Subtract the sum of num_scheduled_tokens."),
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
        "Reserve max(0, blocks_needed(computed + scheduled) - held) for each running request (counting only "
        "num_computed_tokens reserves nothing either: those tokens already sit in the blocks held)."),
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


_FORMULAS = {
    "blocks": "num_free_blocks − Σ max(0, blocks_needed(num_computed_tokens + num_scheduled_tokens, block_size) − "
              "num_blocks) − watermark_blocks",
    "tokens": "max_batched_tokens − Σ num_scheduled_tokens",
    "slots": "max_batch_size − len(running)",
}


def _fields(candidate: Any, failures: list) -> Diagnosis | None:
    """Which of blocks, tokens and slots is wrong on the prepared states, when the others are right."""
    states = [(c, e, g) for c, e, g in failures if isinstance(c.data, BudgetInputs) and isinstance(g, _Seen)]
    if not states:
        return None
    wrong = [f for i, f in enumerate(_Seen._fields) if any(e[i] != g[i] for _, e, g in states)]
    if len(wrong) != 1:
        return None
    field = wrong[0]
    i = _Seen._fields.index(field)
    case, e, g = next((c, e, g) for c, e, g in states if e[i] != g[i])
    others = " and ".join(f for f in _Seen._fields if f != field)
    diffs = {g[i] - e[i] for _, e, g in states if isinstance(e[i], int) and isinstance(g[i], int) and e[i] != g[i]}
    always = f"; yours is always {diffs.pop():+d} from it" if len(diffs) == 1 else ""
    return Diagnosis(f"only {field} is wrong", f"{others} are right on every prepared state, {field} is not: on "
                     f"'{case.name[7:]}' yours is {g[i]}, the right one {e[i]}{always} ({field} = {_FORMULAS[field]}; "
                     "blocks of 0 or fewer all count as 'none').", case)


TAGS = {
    "chunk": ("a running request is prefilling a chunk (num_scheduled_tokens > 1)",
              "a chunk's tokens span positions num_computed_tokens .. num_computed_tokens + num_scheduled_tokens - 1: "
              "count its blocks (and tokens) from num_scheduled_tokens, not as one token."),
    "full last block": ("a decode's last block is full (its new token starts a block)",
                        "that token needs a new block: blocks_needed(computed + 1) is one more than the blocks held."),
}


def check_budget(my_budget: Callable[[BudgetInputs], Any], *, quiet: bool = False) -> GradeResult:
    """Grade `my_budget(state) -> Budget` on prepared states and on whole workloads run in SimEngine."""
    if not callable(my_budget):
        result = GradeResult("the step's budget", False,
                             report="❌ the step's budget: pass your function, e.g. check_budget(my_budget)")
        if not quiet:
            print(result.report)
        return result
    return grade("the step's budget", my_budget, reference_budget, _cases(), _mistakes(), quiet=quiet,
                 explain=_fields, tags=TAGS)
