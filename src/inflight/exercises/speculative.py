"""Chapter 12's grader: the accept/reject step of speculative decoding (`verify`).

The learner writes `verify(p, q, draft, accept_u, draw_u)` (`inflight.engine.spec_decode.rule`):
given the target's rows `p`, the proposer's rows `q`, the proposals and the random numbers, the
tokens one verifying step emits. Every case fixes the random numbers, so a right answer is exactly
the reference's; the mistakes are the classic slips of the rule (resampling from `p` instead of the
residual, accepting only when p >= q, the ratio upside down, no bonus token, ...).
"""
from __future__ import annotations

import random
from typing import Any, Callable

from inflight.engine.spec_decode.rule import draw, verify
from inflight.exercises.answers import Flaw, call_unchanged
from inflight.exercises.grading import Case, GradeResult, Mistake, grade, repeat_case

__all__ = ["check_verify", "verify", "draw", "VERIFY_MISTAKES"]


def _dist(rng: random.Random, v: int, peaked: float = 1.0, zeros: int = 0) -> list[float]:
    w = [rng.random() ** peaked for _ in range(v)]
    for i in rng.sample(range(v), min(zeros, v - 1)):
        w[i] = 0.0
    s = sum(w)
    return [x / s for x in w]


def _one_hot(v: int, x: int) -> list[float]:
    return [1.0 if i == x else 0.0 for i in range(v)]


def _case(rng: random.Random, v: int, k: int, kind: str) -> tuple:
    """A verifying step: rows p (k + 1), rows q (k), proposals drawn from q, and the random numbers."""
    p = [_dist(rng, v, peaked=rng.choice([1, 3, 6]), zeros=rng.randint(0, 2)) for _ in range(k + 1)]
    if kind == "greedy draft":
        draft = [rng.randrange(v) for _ in range(k)]
        q = [_one_hot(v, x) for x in draft]
    else:
        q = [p[i][:] if kind == "perfect draft" else _dist(rng, v, peaked=rng.choice([1, 3])) for i in range(k)]
        draft = [draw(q[i], rng.random()) for i in range(k)]
    return p, q, draft, [rng.random() for _ in range(k)], rng.random()


def _cases() -> list[Case]:
    rng = random.Random("verify")
    specs = []
    fixed_p = [[0.5, 0.3, 0.2, 0.0], [0.1, 0.6, 0.3, 0.0], [0.25, 0.25, 0.25, 0.25]]
    fixed_q = [[0.2, 0.7, 0.1, 0.0], [0.1, 0.2, 0.7, 0.0]]
    specs += [("the chapter's example: both accepted", (fixed_p, fixed_q, [0, 1], [0.5, 0.9], 0.6), set()),
              ("the chapter's example: the first rejected", (fixed_p, fixed_q, [1, 2], [0.6, 0.1], 0.3), {"rejected"}),
              ("no proposals: one token from p[0]", ([fixed_p[0]], [], [], [], 0.7), {"k = 0"}),
              ("p(x) above q(x): always accepted", ([[0.9, 0.1], [0.3, 0.7]], [[0.5, 0.5]], [0], [0.99], 0.5), set())]
    for n in range(36):
        kind = ("sampled draft", "greedy draft", "perfect draft")[n % 3]
        v, k = rng.randint(2, 8), rng.randint(1, 5)
        specs.append((f"{kind} #{n} (vocabulary {v}, k = {k})", _case(rng, v, k, kind), {kind}))
    cases = []
    for name, (p, q, d, au, du), tags in specs:
        out = verify(p, q, d, au, du)
        tags = set(tags) | ({"rejected"} if len(out) <= len(d) else {"all accepted"})
        cases.append(Case(name, lambda f, a=(p, q, d, au, du): _verify(f, *a),
                          f"draft = {d}, accept_u = {[round(u, 3) for u in au]}, draw_u = {du:.3f}; "
                          f"p[i][x] = {[round(p[i][x], 3) for i, x in enumerate(d)]}, "
                          f"q[i][x] = {[round(q[i][x], 3) for i, x in enumerate(d)]}",
                          tags=frozenset(tags), unit="token"))
    return cases + [repeat_case(cases)]


def _verify(f: Callable, p, q, draft, accept_u, draw_u) -> list[int]:
    got = call_unchanged(f, [p, q, draft, accept_u, draw_u], ["p", "q", "draft", "accept_u", "draw_u"],
                         "verify reads the rows and the random numbers; it must not change them.")
    if isinstance(got, tuple):
        got = list(got)
    if not isinstance(got, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in got):
        raise Flaw("not a list of token ids", f"{got!r}", "verify returns the list of tokens the step emits: "
                   "the accepted proposals, then one token (ints).", first=True)
    return got


TAGS = {
    "rejected": ("a proposal is rejected", "at the first rejection, draw the last token from the RESIDUAL "
                 "max(0, p[i] − q[i]) (renormalised: `draw` does that), and stop."),
    "all accepted": ("every proposal is accepted", "when all k are accepted the step still emits one more token: "
                     "a bonus drawn from p[k], the row after the last proposal."),
    "greedy draft": ("the proposer was certain (q is one-hot)", "with q(x) = 1 the rule accepts with probability "
                     "p(x), and the residual is p without x."),
    "perfect draft": ("q equals p", "then p/q = 1: every proposal is accepted (u < 1 always)."),
    "k = 0": ("there are no proposals", "with k = 0 the step is an ordinary decode: one token drawn from p[0]."),
}


def _mk_resample_p(p, q, d, au, du):
    for i, x in enumerate(d):
        if au[i] < min(1.0, p[i][x] / q[i][x]):
            continue
        return list(d[:i]) + [draw(p[i], du)]
    return list(d) + [draw(p[len(d)], du)]


def _mk_rule(accept):
    def impl(p, q, d, au, du):
        for i, x in enumerate(d):
            if accept(p[i][x], q[i][x], au[i]):
                continue
            return list(d[:i]) + [draw([max(0.0, a - b) for a, b in zip(p[i], q[i])], du)]
        return list(d) + [draw(p[len(d)], du)]
    return impl


def _mk_no_bonus(p, q, d, au, du):
    out = verify(p, q, d, au, du)
    return out[:len(d)] if len(out) > len(d) else out


def _mk_skip_rejected(p, q, d, au, du):
    out = [x for i, x in enumerate(d) if au[i] < min(1.0, p[i][x] / q[i][x])]
    return out + [draw(p[len(d)], du)]


def _mk_bonus_row(p, q, d, au, du):
    out = verify(p, q, d, au, du)
    if len(out) > len(d) and d:
        out[-1] = draw(p[len(d) - 1], du)
    return out


def _mk_unclamped(p, q, d, au, du):
    for i, x in enumerate(d):
        if au[i] < min(1.0, p[i][x] / q[i][x]):
            continue
        res = [a - b for a, b in zip(p[i], q[i])]
        total, acc = sum(res), 0.0
        for j, w in enumerate(res):
            acc += w
            if acc > du * total:
                return list(d[:i]) + [j]
        return list(d[:i]) + [len(res) - 1]
    return list(d) + [draw(p[len(d)], du)]


VERIFY_MISTAKES = [
    Mistake("resampling from p instead of the residual", "after a rejection, the replacement comes from "
            "max(0, p − q), renormalised: drawing from p again counts the mass where the draft already agreed twice "
            "(it was offered, and accepted, with probability min(p, q)), so the output is no longer p.",
            _mk_resample_p),
    Mistake("accepting only when p ≥ q", "a proposal with p(x) < q(x) is still accepted with probability p(x)/q(x) "
            "— rejecting it always throws away mass the target wants there.",
            _mk_rule(lambda px, qx, u: px >= qx)),
    Mistake("the ratio upside down", "accept with probability p(x)/q(x) (target over draft), capped at 1: the draft "
            "is over-represented exactly where q(x) > p(x).", _mk_rule(lambda px, qx, u: u < min(1.0, qx / px)
                                                                     if px > 0 else True)),
    Mistake("treating every proposal as certain", "comparing u with p(x) alone is the rule for a greedy draft "
            "(q(x) = 1); in general the test is u < p(x)/q(x).", _mk_rule(lambda px, qx, u: u < px)),
    Mistake("accepting when u is ABOVE the ratio", "a proposal is accepted when u < min(1, p/q): a small u means "
            "accept.", _mk_rule(lambda px, qx, u: u >= min(1.0, px / qx))),
    Mistake("no bonus token", "when every proposal is accepted, the target's row after the last proposal is already "
            "computed: the step emits one more token drawn from p[k] (that is the +1 in 1 + α + … + α^k).",
            _mk_no_bonus),
    Mistake("going on after a rejection", "the first rejection ends the step: later proposals were guessed after "
            "a token that is now replaced, so they cannot be kept.", _mk_skip_rejected),
    Mistake("the bonus from the wrong row", "the bonus token comes from p[k], the row after the last proposal "
            "(p has k + 1 rows), not from p[k − 1].", _mk_bonus_row),
    Mistake("a residual with negative weights", "clamp the residual at zero, max(0, p − q): where q > p the "
            "difference is negative, and drawing from it picks tokens the target gives no extra mass.",
            _mk_unclamped),
]


def check_verify(fn: Callable[..., Any], *, quiet: bool = False) -> GradeResult:
    """Grade `fn(p, q, draft, accept_u, draw_u) -> tokens` over fixed and random verifying steps."""
    return grade("verify", fn, verify, _cases(), VERIFY_MISTAKES, quiet=quiet, tags=TAGS)
