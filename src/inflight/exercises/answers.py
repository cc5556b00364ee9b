"""What a learner's answer must BE before it is compared: the strict type checks every grader uses,
and the checks that a call left its inputs alone.

A case calls these on what the learner's code returned. Each returns the value in its plain Python
form (a numpy int becomes an `int`, a tuple of slots a `list`) or raises `Flaw`: a finding precise
enough to be the report's diagnosis on its own ("returned a float; block counts are ints"). The
checks are as strict as the code that will consume the answer — for counts what
`inflight.checks.integer` accepts (Python and numpy ints, never bools, floats or strings) — because an
answer of the wrong type that compares equal (`2.0 == 2`) would pass here and fail two cells later.
"""
from __future__ import annotations

import copy
import numbers
import operator
from collections.abc import Iterator, Mapping
from typing import Any, Iterable

from inflight.exercises.diff import _is_bool, describe_path, first_difference, type_name

__all__ = ["Flaw", "type_name", "as_int", "as_number", "as_optional_number", "as_int_list", "as_list",
           "unchanged", "snapshot", "call_unchanged"]


class Flaw(Exception):
    """Raised by a case that found exactly what is wrong (a wrong type, a changed input, a scan of
    the pool, state shared between calls). `name` is the diagnosis's title, `shown` what the report
    prints as "got", `hint` the explanation. `first`: report it before any known mistake (a wrong
    type makes every other comparison meaningless)."""

    def __init__(self, name: str, shown: str, hint: str, *, first: bool = False):
        super().__init__(f"{name}: {shown}")
        self.name, self.shown, self.hint, self.first = name, shown, hint, first


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = repr(value)
    except Exception:  # a learner's __repr__ may raise
        text = f"<a {type(value).__name__} whose repr() failed>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _int_or_none(value: Any) -> int | None:
    """`value` as an int if it is an integer of any kind (Python, numpy, 0-d tensor), else None."""
    if type(value) is int:
        return value
    if _is_bool(value) or getattr(value, "ndim", 0) != 0:
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def as_int(value: Any, what: str, kind: str = "ints") -> int:
    """An integer answer (Python or numpy int, never a bool, float or string), as a plain int.
    `what` names the answer ("blocks_needed(17, 16)"), `kind` what it counts ("block counts are ints")."""
    out = _int_or_none(value)
    if out is not None:
        return out
    shown = f"{_short(value)} ({type_name(value)})"
    hint = f"{what} {_verb(what)} {type_name(value)}; {kind}."
    if isinstance(value, float) or type_name(value).startswith("a numpy float"):
        hint += (" A `/` gives a float even when it divides exactly: use integer arithmetic (`//`, and "
                 "`int(...)` only around a value that is already whole)")
        if isinstance(value, float) and value.is_integer():
            hint += f" — {value!r} looks right but is not an int, and the code that consumes it refuses it"
        hint += "."
    elif isinstance(value, str):
        hint += " Return the number itself, not text."
    elif _is_bool(value):
        hint += " A bool is not a count (True is not 1 block)."
    elif value is None:
        hint += " Did the function reach a `return`?"
    return _raise(f"{_verb(what)} {type_name(value)}", shown, hint)


def _verb(what: str) -> str:
    """"blocks_needed(1, 16) returned a float", but "Budget.blocks is a float"."""
    return "returned" if what.endswith(")") else "is"


def as_number(value: Any, what: str, kind: str = "a number of seconds") -> float | int:
    """A real number (int, float, numpy scalar), never a bool, string, None or a container."""
    if not _is_bool(value) and isinstance(value, numbers.Real):
        return value if type(value) in (int, float) else float(value)
    if not _is_bool(value) and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    shown = f"{_short(value)} ({type_name(value)})"
    hint = f"{what} {_verb(what)} {type_name(value)}; it should be {kind}."
    if isinstance(value, str):
        hint += " Return the number itself, not text."
    return _raise(f"{_verb(what)} {type_name(value)}", shown, hint)


def as_optional_number(value: Any, what: str, kind: str) -> float | int | None:
    return None if value is None else as_number(value, what, kind)


def _raise(name: str, shown: str, hint: str):
    raise Flaw(name, shown, hint, first=True)


def as_list(value: Any, what: str, kind: str, *, accept: str = "iterable") -> list:
    """A sequence answer as a list. `accept` says what its consumer can take: "list" (a list only:
    the caller extends it), "list or tuple" (the caller tests `if not ids` and iterates twice),
    "sequence" (also deques and 1-d arrays), "iterable" (also generators: the caller iterates once).
    Never a string, a dict, None or an unordered set."""
    ok = {"list": (list,), "list or tuple": (list, tuple)}.get(accept)
    if ok is not None:
        if isinstance(value, ok):
            return list(value)
        problem = f" The code that uses it needs a {accept}"
    elif value is None or isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        problem = ""
    elif isinstance(value, (set, frozenset)):
        problem = " A set has no order"
    elif isinstance(value, Iterator) and accept != "iterable":
        problem = " A generator hands its items out once, lazily"
    elif getattr(value, "ndim", 1) != 1:
        problem = ""
    else:
        return list(value)
    hint = f"{what} returned {type_name(value)}; {kind}.{problem}"
    hint = hint + ": return a list." if problem else hint
    return _raise(f"returned {type_name(value)}", f"{_short(value)} ({type_name(value)})", hint)


def as_int_list(value: Any, what: str, kind: str, *, accept: str = "iterable") -> list[int]:
    """A list of integers (any integer kind inside what `as_list` accepts)."""
    items = as_list(value, what, kind, accept=accept)
    out = []
    for i, item in enumerate(items):
        n = _int_or_none(item)
        if n is None:
            hint = (f"{what} returned a list whose item {i} is {_short(item)}, {type_name(item)}; {kind}.")
            if isinstance(item, float):
                hint += " A `/` gives a float even when it divides exactly: use `//`."
            _raise(f"a list of {type_name(item)[2:] if type_name(item).startswith('a ') else type_name(item)}",
                   f"{_short(items, 80)} (item {i}: {type_name(item)})", hint)
        out.append(n)
    return out


# --- inputs that must not change ------------------------------------------------------------------
def snapshot(value: Any) -> Any:
    """A deep copy of an input, to compare it with after the call."""
    return copy.deepcopy(value)


def unchanged(before: Any, after: Any, what: str, why: str) -> None:
    """Raise `Flaw` when the learner's call changed an input (`before` is a snapshot taken before)."""
    if _equal_structure(before, after):
        return
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after) and \
            sorted(map(repr, before)) == sorted(map(repr, after)):
        raise Flaw("changed its input", f"{what} was reordered: {_short(before, 80)} became {_short(after, 80)}",
                   f"your function reordered {what} in place (a .sort(), or a shuffle by hand). {why} Sort a copy "
                   "(`sorted(x, key=...)`) or scan it without sorting.")
    path = first_difference(before, after, _equal_structure) or []
    place, was, now = what, before, after
    try:
        for p in path:
            was, now = was[p], now[p]
        place = what + describe_path(path)
    except Exception:
        place, was, now = what, before, after
    raise Flaw("changed its input", f"{place} was {_short(was, 100)} before the call and {_short(now, 100)} after it",
               f"your function changed {place} in place. {why} Work on a copy (`sorted(x)`, `list(x)`, "
               "`dict(x)`) instead of sorting, popping or assigning into the caller's data.")


def _equal_structure(a: Any, b: Any) -> bool:
    try:
        if type(a) is not type(b):
            return False
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(_equal_structure(x, y) for x, y in zip(a, b))
        if isinstance(a, dict):
            return list(a) == list(b) and all(_equal_structure(a[k], b[k]) for k in a)
        if hasattr(a, "__dict__") and not isinstance(a, type):
            return _equal_structure(vars(a), vars(b))
        return bool(a == b)
    except Exception:
        return False


def call_unchanged(fn: Any, args: Iterable[Any], names: Iterable[str], why: str) -> Any:
    """`fn(*args)` on deep copies of `args`; raise `Flaw` if the call changed any of them."""
    args = list(args)
    given = [snapshot(a) for a in args]
    out = fn(*given)
    for name, before, after in zip(names, args, given):
        unchanged(before, after, name, why)
    return out
