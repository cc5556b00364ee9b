"""Where two answers first differ, and a view of both around that place.

A failure report must show the learner the difference, not two long lists cut off before it. So
the report names the first differing position (step 7, `["tpot"]["b"]`, operation 4) and prints
both values *windowed around it*: the items before it folded into a count, the differing item in
full, a couple of neighbours for context.

`same_values` is the equality the graders use: exact, except that floats compare with a relative
tolerance (`math.isclose`, 1e-6) so that summing in another order, or in numpy's float32, is not a
mistake (every float slip the graders know is off by a percent or more),
and two NaNs are equal (a mistake that gives NaN gives the learner's NaN).
"""
from __future__ import annotations

import math
from typing import Any, Callable

__all__ = ["same_values", "first_difference", "describe_path", "window", "type_name", "FLOAT_REL_TOL"]

FLOAT_REL_TOL = 1e-6
_MISSING = object()


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool")


def type_name(value: Any) -> str:
    """"a float", "a numpy float64", "None", "a generator" — the words a report uses for a type."""
    if value is None:
        return "None"
    cls = type(value)
    module = cls.__module__.split(".")[0]
    name = cls.__name__
    if module == "numpy":
        return "a numpy array" if name == "ndarray" else f"a numpy {name}"
    if module == "torch":
        return "a torch tensor" if name == "Tensor" else f"a torch {name}"
    if _is_bool(value):
        return "a bool"
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name}"


def _is_float(x: Any) -> bool:
    return isinstance(x, float) and not isinstance(x, bool)


def same_values(a: Any, b: Any) -> bool:
    """Equality for plain answer data (see the module docstring); objects fall back to `==`."""
    if _is_float(a) or _is_float(b):
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
                and not isinstance(b, bool):
            if math.isnan(a) and math.isnan(b):
                return True
            return math.isclose(a, b, rel_tol=FLOAT_REL_TOL, abs_tol=1e-9)
    if type(a) in (list, tuple) and type(b) in (list, tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b))
    if type(a) is dict and type(b) is dict:
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    return bool(a == b)


def _kind(x: Any) -> str:
    if isinstance(x, (list, tuple)):
        return "seq"
    if isinstance(x, dict):
        return "map"
    return "leaf"


def first_difference(expected: Any, got: Any, same: Callable[[Any, Any], bool] = same_values,
                     depth: int | None = None) -> list | None:
    """The path (indices and keys) to the first place where `got` differs from `expected`; [] when
    they differ as wholes (different kinds of thing), None when they are the same. `depth` stops the
    path that many levels down (a scheduler's step is compared as a whole list)."""
    try:
        if same(expected, got):
            return None
    except Exception:
        return []
    if _kind(expected) != _kind(got) or _kind(expected) == "leaf" or depth == 0:
        return []
    deeper = None if depth is None else depth - 1
    if _kind(expected) == "seq":
        for i, (e, g) in enumerate(zip(expected, got)):
            sub = first_difference(e, g, same, deeper)
            if sub is not None:
                return [i] + sub
        return [min(len(expected), len(got))] if len(expected) != len(got) else []
    for k in expected:
        if k not in got:
            return [k]
        sub = first_difference(expected[k], got[k], same, deeper)
        if sub is not None:
            return [k] + sub
    extra = [k for k in got if k not in expected]
    return [extra[0]] if extra else []


def _at(value: Any, path: list) -> Any:
    for p in path:
        try:
            value = value[p]
        except Exception:
            return _MISSING
    return value


def describe_path(path: list, unit: str | None = None, fields: tuple[str, ...] | None = None) -> str:
    """"step 7", "operation 4, item 1", `["tpot"]["b"]`, "num_cached_tokens" — the name of a place."""
    if not path:
        return ""
    head, rest = path[0], path[1:]
    if isinstance(head, int) and fields and head < len(fields):
        text = fields[head]
    elif isinstance(head, int) and unit:
        text = f"{unit} {head}"
    else:
        text = f"[{head!r}]"
    for p in rest:
        text += f"[{p!r}]"
    return text


def _r(value: Any, limit: int, short: Callable[[Any, int], str]) -> str:
    return "(missing)" if value is _MISSING else short(value, limit)


def window(value: Any, path: list, short: Callable[[Any, int], str], limit: int = 240) -> str:
    """`value` printed around `path`: a sequence or mapping on the way shows the item on the path in
    full (recursively) and at most two neighbours each side; the rest is folded into counts."""
    if value is _MISSING:
        return "(missing)"
    if not path or _kind(value) == "leaf":
        return short(value, limit)
    head, rest = path[0], path[1:]
    if _kind(value) == "seq":
        items = list(value)
        i = head if isinstance(head, int) else 0
        lo, hi = max(0, i - 2), min(len(items), i + 3)
        parts = [f"…{lo} equal…"] if lo > 1 else [short(items[0], 40)] if lo == 1 else []
        for j in range(lo, hi):
            parts.append(window(items[j], rest, short, limit // 2) if j == i else short(items[j], 40))
        if i >= len(items):
            parts.append("(ends here)")
        if hi < len(items):
            parts.append(f"…{len(items) - hi} more")
        open_, close = ("(", ")") if isinstance(value, tuple) else ("[", "]")
        return open_ + ", ".join(parts) + close
    keys = list(value)
    i = keys.index(head) if head in keys else len(keys)
    lo, hi = max(0, i - 2), min(len(keys), i + 3)
    parts = [f"…{lo} more"] if lo else []
    for j in range(lo, hi):
        k = keys[j]
        parts.append(f"{k!r}: " + (window(value[k], rest, short, limit // 2) if j == i else short(value[k], 40)))
    if head not in keys:
        parts.append(f"(no {head!r})")
    if hi < len(keys):
        parts.append(f"…{len(keys) - hi} more")
    return "{" + ", ".join(parts) + "}"


def difference_lines(expected: Any, got: Any, short: Callable[[Any, int], str], *, unit: str | None = None,
                     fields: tuple[str, ...] | None = None, depth: int | None = None,
                     same: Callable[[Any, Any], bool] = same_values) -> list[str]:
    """The report's lines for a failed case: both values windowed at the first difference, and a
    line naming that place when it is inside the answer."""
    path = first_difference(expected, got, same, depth)
    path = path or []
    lines = [f"   expected: {window(expected, path, short)}", f"   got:      {window(got, path, short)}"]
    if path:
        e, g = _at(expected, path), _at(got, path)
        where = describe_path(path, unit, fields)
        if e is _MISSING:
            lines.append(f"   first difference at {where}: nothing expected there, got {_r(g, 120, short)}")
        elif g is _MISSING:
            lines.append(f"   first difference at {where}: expected {_r(e, 120, short)}, got nothing (yours ends before)")
        else:
            lines.append(f"   first difference at {where}: expected {_r(e, 120, short)}, got {_r(g, 120, short)}"
                         + _type_note(e, g))
    return lines


def _type_note(e: Any, g: Any) -> str:
    """" (an int expected, a str given)" when the two differ in kind, which `repr` can hide."""
    te, tg = type(e), type(g)
    if te is tg:
        return ""
    return f" ({type_name(e)} expected, {type_name(g)} given)"
