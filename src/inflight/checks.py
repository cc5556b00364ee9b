"""One rule, in one place, for what an integer, a number, a token id and a prompt are.

Every layer validates its inputs through these functions, so the engine, the block allocators and
the Part I schedulers accept and refuse exactly the same things and say so in the same words. Each
returns the value in its plain Python form (numpy and torch scalars become `int`/`float`) or raises
`TypeError` (wrong kind of thing) or `ValueError` (right kind, wrong value), naming the argument.

Torch-free on purpose: tensors and arrays are recognised by what they can do (`ndim`, `tolist`),
so the scheduling chapters can use these checks where torch is not installed.
"""
from __future__ import annotations

import math
import os
import numbers
import operator
from typing import Any

__all__ = ["show", "integer", "number", "flag", "switched_off", "priority", "seed", "token_ids", "prompt", "prompt_list", "is_token_sequence",
           "INT64_MAX", "PRIORITY_RANGE", "SEED_RANGE"]

#: The largest size a container or tensor can have (C's ssize_t): bigger counts are refused by name.
INT64_MAX = 2**63 - 1
#: Priorities are 64-bit integers: any ranking scheme fits, and with aging (`arrival + priority *
#: aging`) the product stays a float instead of overflowing (10**400 * 1.0 raises OverflowError).
PRIORITY_RANGE = (-2**63, 2**63 - 1)
#: Seeds are 64-bit, as `torch.Generator.manual_seed` takes them (negative ones wrap around).
SEED_RANGE = (-2**63, 2**64 - 1)


def show(value: Any, limit: int = 60) -> str:
    """`repr(value)` cut to `limit` characters for error messages: a huge int or a long list must
    not turn an error message into megabytes (and Python refuses to print ints over 4300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"{'-' if value < 0 else ''}an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _is_bool(value: Any) -> bool:
    # bool is a subclass of int, and numpy/torch have booleans of their own: True is not token 1
    if isinstance(value, bool):
        return True
    dtype = getattr(value, "dtype", None)
    return dtype is not None and str(dtype) in ("bool", "torch.bool")


def integer(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """`value` as an `int` (Python, numpy or 0-d torch integers; never a bool or a float), checked
    against the inclusive bounds."""
    if type(value) is int:  # the common case, on hot paths (the engine sizes blocks every step)
        out = value
    elif _is_bool(value):
        raise TypeError(f"{name} must be an int, got a bool ({show(value)})")
    else:
        try:
            if getattr(value, "ndim", 0) != 0:  # a one-element tensor has __index__ too, but is not a number
                raise TypeError
            out = operator.index(value)
        except TypeError:
            raise TypeError(f"{name} must be an int, got {type(value).__name__} ({show(value)})") from None
    if minimum is not None and out < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {show(out)}")
    if maximum is not None and out > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {show(out)}")
    return out


def number(name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
           above: float | None = None, finite: bool = True) -> float:
    """`value` as a `float` (any real number type; never a bool), NaN always refused, infinities
    unless `finite=False`; `minimum`/`maximum` are inclusive bounds, `above` an exclusive one."""
    if _is_bool(value):
        raise TypeError(f"{name} must be a number, got a bool ({show(value)})")
    if not isinstance(value, numbers.Real):
        try:  # 0-d tensors and numpy scalars are real numbers in all but their class
            if getattr(value, "ndim", 0) != 0 or not hasattr(value, "item"):
                raise TypeError
            value = value.item()
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be a number, got {type(value).__name__} ({show(value)})") from None
    try:
        out = float(value)
    except OverflowError:  # an int or Fraction beyond float range: as far as a float can say, infinite
        out = math.inf if value > 0 else -math.inf
    if math.isnan(out):
        raise ValueError(f"{name} must be a number, got NaN")
    if finite and math.isinf(out):
        raise ValueError(f"{name} must be finite, got {show(value)}")
    if minimum is not None and out < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {show(value)}")
    if maximum is not None and out > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {show(value)}")
    if above is not None and not out > above:
        raise ValueError(f"{name} must be > {above}, got {show(value)}")
    return out


def flag(name: str, value: Any) -> bool:
    """`value` as a `bool`: True or False (Python or numpy/torch booleans), never a truthy stand-in
    such as the string "False", 0 or None."""
    if isinstance(value, bool):
        return value
    if _is_bool(value) and getattr(value, "ndim", 0) == 0:
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {type(value).__name__} ({show(value)})")


def switched_off(var: str) -> bool:
    """Whether the environment turns off the switch `var` (an `INFLIGHT_*` variable): set to 0, false,
    no or off, in any case; unset or anything else leaves it on."""
    return os.environ.get(var, "1").strip().lower() in ("0", "false", "no", "off")


def priority(name: str, value: Any) -> int:
    """A request's priority: an integer in `PRIORITY_RANGE` (lower = served sooner)."""
    return _int_in(name, value, PRIORITY_RANGE, "a 64-bit integer (-2**63 .. 2**63-1)")


def seed(name: str, value: Any) -> int:
    """A random seed: an integer in `SEED_RANGE`."""
    return _int_in(name, value, SEED_RANGE, "a 64-bit integer (-2**63 .. 2**64-1)")


def _int_in(name: str, value: Any, bounds: tuple[int, int], described: str) -> int:
    # one message for both ends of the range: "must be a 64-bit integer", not "must be <= 9223372036854775807"
    try:
        return integer(name, value, minimum=bounds[0], maximum=bounds[1])
    except ValueError:
        raise ValueError(f"{name} must be {described}, got {show(value)}") from None


def _ndim(value: Any) -> int | None:
    """Dimensions of a tensor or array; None for anything else."""
    ndim = getattr(value, "ndim", None)
    return ndim if isinstance(ndim, int) and hasattr(value, "tolist") else None


def is_token_sequence(value: Any) -> bool:
    """Whether `value` is shaped like ONE prompt of token ids: a 1-D tensor/array, or a list, tuple
    or range whose items are integers (an empty list counts, so that it can be refused by name)."""
    ndim = _ndim(value)
    if ndim is not None:
        return ndim == 1
    if isinstance(value, range):
        return True
    if isinstance(value, (list, tuple)):
        return all(not isinstance(t, (str, bytes, list, tuple, range)) and _ndim(t) in (None, 0) for t in value)
    return False


def token_ids(name: str, value: Any, vocab_size: int | None = None) -> list[int]:
    """One sequence of token ids as a list of ints, each in [0, vocab_size).

    Accepted: a list, tuple or range of integers, or a 1-D tensor/array of integers. Refused: a
    string (a prompt needs a tokenizer), bools, floats, and 2-D tensors (one prompt is one row:
    pass a list of rows)."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be token ids, got a {type(value).__name__} (strings need a tokenizer)")
    ndim = _ndim(value)
    if ndim is not None:
        if ndim != 1:
            shape = tuple(getattr(value, "shape", ()))
            raise ValueError(f"{name} must be one sequence of token ids (1-D), got a {ndim}-D tensor of shape "
                             f"{shape}; for several prompts pass a list of 1-D sequences")
        if _is_bool(value):
            raise TypeError(f"{name} must hold integer token ids, got a tensor of bools")
        if "float" in str(getattr(value, "dtype", "")) or "complex" in str(getattr(value, "dtype", "")):
            raise TypeError(f"{name} must hold integer token ids, got a tensor of {value.dtype}")
        value = value.tolist()
    elif not isinstance(value, (list, tuple, range)):
        raise TypeError(f"{name} must be a list of token ids (ints), got {type(value).__name__}")
    ids = []
    for i, t in enumerate(value):
        try:
            ids.append(integer(f"{name}[{i}]", t, minimum=0))
        except TypeError:
            raise TypeError(f"{name} must hold ints (token ids), but item {i} is {show(t)} "
                            f"({'a bool' if _is_bool(t) else type(t).__name__})") from None
    if vocab_size is not None:
        bad = [(i, t) for i, t in enumerate(ids) if t >= vocab_size]
        if bad:
            i, t = bad[0]
            raise ValueError(f"{name}[{i}] = {show(t)} is outside the vocabulary [0, {vocab_size})")
    return ids


def prompt(value: Any, vocab_size: int, tokenizer: Any = None, name: str = "prompt") -> list[int]:
    """A prompt as token ids: a string (encoded with the tokenizer's special tokens, as serving
    engines do) or one sequence of token ids; never empty."""
    if isinstance(value, str):
        if tokenizer is None:
            raise TypeError(f"{name} is a string, which needs a tokenizer: pass tokenizer=... or give token ids")
        encode = getattr(tokenizer, "encode_prompt", tokenizer.encode)
        encoded = encode(value)
        try:
            encoded = list(encoded)
        except TypeError:
            raise TypeError(f"the tokenizer's encode() turned {name} {show(value)} into {type(encoded).__name__} "
                            f"({show(encoded)}), not token ids") from None
        ids = token_ids(name, encoded, vocab_size)
    else:
        ids = token_ids(name, value, vocab_size)
    if not ids:
        raise ValueError(f"empty {name}: a request needs at least one token")
    return ids


def prompt_list(prompts: Any) -> list:
    """`generate`'s prompts as a list: one prompt (a string or one sequence of token ids) becomes a
    list of one; a list or tuple of prompts stays as it is. The same tensor means the same thing to
    `generate` and to `add_request`: a 1-D tensor is one prompt, never one prompt per token."""
    if isinstance(prompts, str) or is_token_sequence(prompts) and not (isinstance(prompts, (list, tuple)) and not prompts):
        return [prompts]
    if _ndim(prompts) is not None:
        raise ValueError(f"prompts must be one prompt or a list of prompts, got a {prompts.ndim}-D tensor; "
                         "pass a list of 1-D sequences (one per prompt)")
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a string, a list of token ids, or a list of those; got {type(prompts).__name__}")
    return list(prompts)
