"""The diagnosis line of a failure report: which one thing is most likely wrong.

`choose` goes through steps 1-5 of `inflight.exercises.grading`'s list (a wrong type, the
exercise's structural check, a known mistake, a rule the answers break, another finding of a
case); `find_pattern` through step 6, the patterns any grader can see in its failures without
knowing the exercise:

* every failing case carries one tag that passing cases don't all carry ("num_tokens is an exact
  multiple of block_size"): the bug is in how the code treats that situation;
* only one part of a dict answer is ever wrong ("only throughput is wrong");
* the answer is a list of the wrong length on every failing case;
* on every failing case the answer (or its first differing number) is the same multiple of the
  right one (a factor missing, bits for bytes, milliseconds for seconds) or off by the same amount
  (an off-by-one);
* the answer is a different kind of value (a tuple where an id was expected);
* the code raised: the exception and the learner's own line that raised it.

Each is a statement of fact about the learner's answers, never a guess; when none holds the report
says it does not know the mistake.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Callable, Sequence

from inflight.exercises import outcomes
from inflight.exercises.answers import Flaw, type_name
from inflight.exercises.diff import describe_path, first_difference, same_values

from inflight.exercises.outcomes import Case, Diagnosis, Mistake
from inflight.exercises.timelimit import CodeTimeout, call_with_time_limit

__all__ = ["Diagnosis", "choose", "find_pattern", "recognise_mistake", "repeat_case", "MISTAKE_MIN_SHARE"]


def choose(candidate: Any, reference: Any, cases: Sequence[Case], mistakes: Sequence[Mistake],
           failures: list, mine: dict, diagnose: Callable | None = None,
           explain: Callable | None = None) -> Diagnosis | None:
    """Steps 1-5 of `inflight.exercises.grading`'s list."""
    flawed = [(c, got.flaw) for c, _, got in failures if isinstance(got, outcomes._Flawed)]
    for c, flaw in flawed:
        if flaw.first:
            return Diagnosis(flaw.name, flaw.hint, c, kind="type")
    if diagnose is not None:
        found = _ask(diagnose, candidate, failures)
        if found is not None:
            found.kind = "structure" if found.kind == "pattern" else found.kind
            return found
    plain = [f for f in failures if not isinstance(f[2], outcomes._Flawed)]
    if plain and mistakes:
        mistake, counts = recognise_mistake(candidate, reference, plain[0][0], cases, mistakes, mine=mine)
        if mistake is not None:
            return Diagnosis(mistake.name, mistake.explanation, plain[0][0], kind="mistake", counts=counts)
    if explain is not None and plain:
        found = _ask(explain, candidate, plain)
        if found is not None:
            return found
    if flawed:
        c, flaw = flawed[0]
        return Diagnosis(flaw.name, flaw.hint, c, kind="flaw")
    return None


def _ask(hook: Callable, candidate: Any, failures: list) -> Diagnosis | None:
    """An exercise's own check, on answers that may hold the learner's strange objects: one that
    raises or hangs inside it gives no diagnosis rather than a broken report."""
    try:
        return call_with_time_limit(hook, candidate, failures)
    except (Exception, CodeTimeout):
        return None


# A known mistake is named only when it gives the learner's exact (wrong) answer on the first failing
# case shown AND on at least this share of all the cases the learner failed. One shared case proves
# little: a shortest-job-first scheduler and a LIFO one both put B before A in the spec's example,
# yet LIFO reproduces only 2 of its 28 failures. Every mistake the test suite writes independently is
# reproduced on >= 75 % of its failures (most on all of them; a few learner-style mutants carry a
# second slip, e.g. a free() without a double-free check that also drops reference counts: 9 of 12).
MISTAKE_MIN_SHARE = 0.75
# ... and only when it does not fail many cases the learner gets right: a learner whose one failure
# is a rounding of fractional memory costs is not "checking memory after admission" just because
# that mistake also fails that one case (it fails four more that the learner passes).
MISTAKE_MAX_CONTRADICTED = 0.25


def recognise_mistake(candidate: Any, reference: Any, failing: Case, cases: Sequence[Case],
                      mistakes: Sequence[Mistake], *, mine: dict[str, Any] | None = None
                      ) -> tuple[Mistake | None, tuple[int, int]]:
    """The known mistake that reproduces the candidate's wrong answers, with (reproduced, failed) counts.

    A mistake qualifies when it gives the candidate's answer on `failing` and on at least
    `MISTAKE_MIN_SHARE` of the cases the candidate fails, and fails no more than
    `MISTAKE_MAX_CONTRADICTED` times as many cases as it reproduces among those the candidate passes;
    the one reproducing the most failures
    wins (ties: the most agreement over all cases). None when no mistake qualifies. `mine`: the
    candidate's outcomes by case name, when the grader already has them.
    """
    if mine is None:
        mine = {}
        for c in cases:  # after one case that hangs, don't wait for the others
            hung = any(isinstance(v, outcomes._TimedOut) for v in mine.values())
            mine[c.name] = outcomes._TimedOut(CodeTimeout("your code", 0)) if hung else _safe(c, candidate)
    expected = {c.name: _safe(c, reference) for c in cases}
    failed = [c for c in cases if not outcomes.same(mine[c.name], expected[c.name], hang=True)]
    passed = [c for c in cases if c not in failed]
    best, best_key = None, (-1, -1)
    for mistake in mistakes:
        first = _safe(failing, mistake.impl)
        if not outcomes.same(first, mine[failing.name], hang=True):
            continue
        theirs = {c.name: _safe(c, mistake.impl) for c in cases}
        reproduced = sum(outcomes.same(theirs[c.name], mine[c.name], hang=True) for c in failed)
        # cases the learner gets right and the mistake gets wrong are evidence against it
        contradicted = sum(not outcomes.same(theirs[c.name], expected[c.name], hang=True) for c in passed)
        key = (reproduced, sum(outcomes.same(theirs[c.name], mine[c.name], hang=True) for c in cases))
        if (reproduced >= MISTAKE_MIN_SHARE * len(failed) and contradicted <= MISTAKE_MAX_CONTRADICTED * reproduced
                and key > best_key):
            best, best_key = mistake, key
    return best, (max(best_key[0], 0), len(failed))


def _safe(case: Case, impl: Any) -> Any:
    try:
        return outcomes.outcome(case, impl)
    except NotImplementedError as exc:
        return outcomes._Raised(exc)


def repeat_case(cases: Sequence[Case], picks: Sequence[int] = (0, 1, 2)) -> Case:
    """A case that asks a function the same questions again, in reverse order, after it answered
    them once: a function that keeps state between calls (a global, a mutable default argument, a
    cache keyed wrongly) answers differently, and the case names that."""
    chosen = [cases[i] for i in picks if i < len(cases)]

    def run(impl: Any) -> str:
        first = [_try(c, impl) for c in chosen]
        again = [_try(c, impl) for c in reversed(chosen)][::-1]
        for c, a, b in zip(chosen, first, again):
            if not same_values(a, b):
                raise Flaw("state kept across calls",
                           f"on '{c.name}' it answered {outcomes.short(a, 80)} the first time and {outcomes.short(b, 80)} when asked again",
                           "your function answers the same input differently the second time, so it keeps state "
                           "between calls: a global or module-level variable, a mutable default argument "
                           "(`def f(x, seen=[])`), a cache or a counter. Compute the answer from the call's "
                           "arguments alone.")
        return "the same answers when asked again"

    return outcomes.Case("the same inputs again", run, "the first cases once more, in reverse order, after all the others")


def _try(case: Case, impl: Any) -> Any:
    try:
        return case.run(impl)
    except Flaw as flaw:
        return f"<{flaw.name}>"
    except Exception as exc:
        return f"<raised {type(exc).__name__}>"



# --- step 5: patterns in the failures ------------------------------------------------------------
def find_pattern(cases: Sequence[Any], failures: list, tags: dict[str, tuple[str, str]],
                 factors: dict[float, str], short: Callable[[Any, int], str],
                 fields: dict[str, str] | None = None) -> Diagnosis | None:
    """The first pattern (module docstring) that every failure shows, or None."""
    raised = [f for f in failures if isinstance(f[2], outcomes._Raised) and not isinstance(f[1], outcomes._Raised)]
    if raised and len(raised) == len(failures):
        return _by_exception(raised[0])
    return (_by_tag(cases, failures, tags) or _by_field(failures, fields or {}, short) or _by_length(failures)
            or _by_number(failures, factors) or _by_kind(failures, short)
            or (_by_exception(raised[0]) if raised else None))


def _by_field(failures: list, rules: dict[str, str], short: Callable[[Any, int], str]) -> Diagnosis | None:
    """Answers made of named parts (a dict's keys) where only one part is ever wrong."""
    if not rules or not all(type(e) is dict and type(g) is dict and e.keys() == g.keys() for _, e, g in failures):
        return None
    wrong = {k for _, e, g in failures for k in e if not same_values(e[k], g[k])}
    if len(wrong) != 1:
        return None
    key = wrong.pop()
    others = [k for k in failures[0][1] if k != key]
    case, e, g = next(f for f in failures if not same_values(f[1][key], f[2][key]))
    path, want, have = _leaves(e[key], g[key]) or ([], e[key], g[key])
    where = f"[{key!r}]" + "".join(f"[{p!r}]" for p in path)
    rule = f" {key} is {rules[key]}." if key in rules else ""
    return Diagnosis(f"only {key} is wrong", f"{' and '.join(map(str, others))} are right on every case, {key} is "
                     f"not: on '{case.name}' {where} should be {short(want, 60)}, yours is {short(have, 60)}.{rule}",
                     case)


def _by_length(failures: list) -> Diagnosis | None:
    """Answers that are lists of a different length than expected, on every failing case."""
    lengths = [(len(e), len(g)) for c, e, g in failures  # (a trace that stops at a wrong step has depth 1)
               if type(e) is list and type(g) is list and c.depth is None]
    if not lengths or len(lengths) != len(failures) or any(a == b for a, b in lengths):
        return None
    case, expected, got = failures[0]
    more = all(b > a for a, b in lengths)
    fewer = all(b < a for a, b in lengths)
    how = "more" if more else "fewer" if fewer else "a different number of"
    return Diagnosis(f"{how} items than expected", f"on every case you fail your list has {how} items than the "
                     f"right one (here {len(got)} instead of {len(expected)}): check which items your loop keeps "
                     "or adds — one item per input, none skipped, none twice.", case)


def _by_exception(failure: tuple) -> Diagnosis:
    case, _, got = failure
    where = f" It was raised at {got.where}." if got.where else ""
    return Diagnosis(f"your code raised {got.type}", f"{got.type}: {got.message}.{where} The case above does not "
                     "call for an exception: look at what that line assumes about its input.", case)


def _by_tag(cases: Sequence[Any], failures: list, tags: dict[str, tuple[str, str]]) -> Diagnosis | None:
    best = None
    for tag, (what, hint) in tags.items():
        tagged = [c for c in cases if tag in c.tags]
        if not tagged or len(tagged) == len(cases) or not all(tag in c.tags for c, _, _ in failures):
            continue
        if best is None or len(tagged) < best[0]:
            best = (len(tagged), what, hint)
    if best is None:
        return None
    n_tagged, what, hint = best
    share = "all of them" if len(failures) == n_tagged else f"{len(failures)} of the {n_tagged}"
    return Diagnosis(f"you fail only where {what}",
                     f"every case you fail has this ({share}), and you pass every case without it: "
                     f"{hint[:1].lower()}{hint[1:]}",
                     failures[0][0])


def _leaves(expected: Any, got: Any) -> tuple[list, Any, Any] | None:
    """The path to the first difference and the two values there (None if they can't be reached)."""
    path = first_difference(expected, got) or []
    e, g = expected, got
    try:
        for p in path:
            e, g = e[p], g[p]
    except Exception:
        return None
    return path, e, g


def _numbers_at_first_difference(failures: list) -> list[tuple[float, float]] | None:
    pairs = []
    for _, expected, got in failures:
        found = _leaves(expected, got)
        if found is None:
            return None
        _, e, g = found
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in (e, g)):
            return None
        pairs.append((e, g))
    return pairs


def _nice(r: float) -> str | None:
    """"2×", "half", "1/1024 of", "1000×" — a ratio a slip produces, in words; None for 1.37."""
    if r <= 0:
        return None
    frac = Fraction(r).limit_denominator(16)
    if math.isclose(float(frac), r, rel_tol=1e-9):
        if frac == Fraction(1, 2):
            return "half"
        return f"{frac.numerator}×" if frac.denominator == 1 else f"{frac.numerator}/{frac.denominator} of"
    inverse = round(1 / r)
    if inverse > 1 and math.isclose(1 / r, inverse, rel_tol=1e-9):
        return f"1/{inverse} of"
    return None


def _scaled(e: float, r: float) -> tuple[float, ...]:
    """What a slip that scales by `r` may give: the exact product, or it rounded down or to nearest
    (integer division by 1024 gives 2 for 2048 + 100 bytes)."""
    x = e * r
    return (x, math.floor(x), round(x))


def _constant_factor(pairs: list, factors: dict[float, str]) -> float | None:
    candidates = list(factors) + [g / e for e, g in sorted(pairs, key=lambda p: -abs(p[0]))[:1] if e]
    for r in candidates:
        if r != 1 and r > 0 and _nice(r) and all(
                e != 0 and any(math.isclose(g, x, rel_tol=1e-9, abs_tol=1e-12) for x in _scaled(e, r))
                for e, g in pairs):
            return r
    return None


def _by_number(failures: list, factors: dict[float, str]) -> Diagnosis | None:
    pairs = _numbers_at_first_difference(failures)
    if not pairs:
        return None
    n = len(pairs)
    where = "on the case you fail" if n == 1 else f"on all {n} cases you fail"
    r = _constant_factor(pairs, factors)
    if r is not None:
        meaning = next((text for k, text in factors.items() if math.isclose(k, r, rel_tol=1e-9)), None)
        generic = ("a factor is missing" if r < 1 else "a factor is counted that should not be") + \
                  ": compare each factor you multiply (or divide) by with the formula in the text."
        return Diagnosis(f"your answer is {_nice(r)} the right one",
                         f"{where} your value is {_nice(r)} the expected one (rounded when it is an int), so "
                         f"{meaning or generic}", failures[0][0])
    diffs = [g - e for e, g in pairs]
    d = diffs[0]
    if d != 0 and all(math.isclose(x, d, rel_tol=1e-9, abs_tol=1e-12) for x in diffs) and (n > 1 or abs(d) == 1):
        amount = f"{d:+g}"
        hint = ("an off-by-one: look at a `<` that should be `<=` (or the other way round), a `+ 1` or `- 1`, "
                "or where you round." if abs(d) == 1 else "a constant added or left out: find the term of that size.")
        return Diagnosis(f"your answer is off by {amount}", f"{where} your value is exactly {amount} from the "
                         f"expected one: {hint}", failures[0][0])
    return None


def _by_kind(failures: list, short: Callable[[Any, int], str]) -> Diagnosis | None:
    case, expected, got = failures[0]
    if isinstance(got, (outcomes._Raised, outcomes._Flawed)):
        return None
    found = _leaves(expected, got)
    if found is None:
        return None
    path, e, g = found
    numbers = (int, float)
    if type(e) is type(g) or (isinstance(e, numbers) and isinstance(g, numbers)
                              and not isinstance(e, bool) and not isinstance(g, bool)):
        return None
    at = f" at {describe_path(path, case.unit, case.fields)}" if path else ""
    return Diagnosis("a value of the wrong kind", f"{at.strip() or 'here'} the answer should be {type_name(e)} "
                     f"like {short(e, 60)}, yours is {type_name(g)}: {short(g, 80)}.", case)
