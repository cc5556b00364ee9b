"""inflight.checks, the one rule for what an integer, a number, a flag, a priority, a seed, a token
id and a prompt are: each accepts exactly its kind (in any of Python's, numpy's and torch's
spellings), refuses everything else with a TypeError (wrong kind) or ValueError (wrong value)
that names the argument, and never lets a huge value blow up the error message itself."""
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from inflight import checks

# anything at all: the checks must answer every one of these with a value or a TypeError/ValueError
anything = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-10**500, max_value=10**500),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5), st.binary(max_size=3),
    st.lists(st.integers(-3, 3), max_size=4), st.tuples(st.integers(), st.text(max_size=2)),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2), st.fractions(),
    st.sampled_from([np.int64(3), np.float32(2.5), np.bool_(True), torch.tensor(4), torch.tensor(1.5),
                     torch.tensor([1, 2]), torch.tensor(True), np.array([1, 2]), object(), range(3), 1j]),
)


@settings(max_examples=400, deadline=None)
@given(value=anything)
def test_every_check_answers_anything_with_a_value_or_a_named_error(value):
    for check, call in [
        ("integer", lambda v: checks.integer("arg", v, minimum=0, maximum=100)),
        ("number", lambda v: checks.number("arg", v, minimum=-1.0, maximum=1e300)),
        ("flag", lambda v: checks.flag("arg", v)),
        ("priority", lambda v: checks.priority("arg", v)),
        ("seed", lambda v: checks.seed("arg", v)),
        ("token_ids", lambda v: checks.token_ids("arg", v, vocab_size=50)),
        ("prompt", lambda v: checks.prompt(v, 50, name="arg")),
    ]:
        try:
            out = call(value)
        except (TypeError, ValueError) as exc:
            msg = str(exc)
            assert "arg" in msg, f"{check}({value!r}): the message does not name the argument: {msg}"
            assert len(msg) < 400, f"{check}: message too long ({len(msg)} chars)"
            continue
        if check == "integer":
            assert type(out) is int and 0 <= out <= 100 and not isinstance(value, (bool, float))
        elif check == "number":
            assert type(out) is float and math.isfinite(out) and -1 <= out <= 1e300
        elif check == "flag":
            assert type(out) is bool and bool(value) == out
        elif check in ("priority", "seed"):
            assert type(out) is int and out == value
        else:
            assert isinstance(out, list) and all(type(t) is int and 0 <= t < 50 for t in out)


def test_bools_are_never_integers_ids_or_numbers():
    for b in (True, False, np.bool_(True), torch.tensor(True)):
        for call in (lambda v: checks.integer("n", v), lambda v: checks.number("x", v),
                     lambda v: checks.token_ids("ids", [1, v]), lambda v: checks.priority("p", v)):
            with pytest.raises(TypeError, match="bool"):
                call(b)
    with pytest.raises(TypeError, match="bools"):
        checks.token_ids("ids", torch.tensor([True, False]))


def test_integer_spellings_are_plain_ints():
    for v in (3, np.int64(3), np.uint8(3), torch.tensor(3)):
        out = checks.integer("n", v)
        assert out == 3 and type(out) is int
    for v in (3.0, "3", None, torch.tensor([3]), Fraction(3, 1)):
        with pytest.raises(TypeError, match="n must be an int"):
            checks.integer("n", v)


def test_numbers_nan_infinity_and_beyond_float_range():
    with pytest.raises(ValueError, match="NaN"):
        checks.number("t", float("nan"))
    with pytest.raises(ValueError, match="finite"):
        checks.number("t", math.inf)
    with pytest.raises(ValueError, match="finite"):
        checks.number("t", 10**400)  # an int beyond float range is infinite as far as a float can say
    assert checks.number("t", 10**400, finite=False) == math.inf
    assert checks.number("t", -Fraction(10**400, 3), finite=False) == -math.inf
    assert checks.number("t", np.float32(0.5)) == 0.5 and checks.number("t", torch.tensor(0.25)) == 0.25
    with pytest.raises(ValueError, match="> 0"):
        checks.number("top_p", 0.0, above=0.0)


def test_flags_refuse_truthy_stand_ins():
    assert checks.flag("f", True) is True and checks.flag("f", np.bool_(False)) is False
    for v in ("False", "no", 0, 1, None, [], 1.0):
        with pytest.raises(TypeError, match="f must be True or False"):
            checks.flag("f", v)


def test_priority_and_seed_ranges():
    lo, hi = checks.PRIORITY_RANGE
    assert checks.priority("p", lo) == lo and checks.priority("p", hi) == hi
    for v in (lo - 1, hi + 1, 10**400, -10**400):
        with pytest.raises(ValueError, match="64-bit"):
            checks.priority("p", v)
    lo, hi = checks.SEED_RANGE
    assert checks.seed("s", lo) == lo and checks.seed("s", hi) == hi
    for v in (lo - 1, hi + 1):
        with pytest.raises(ValueError, match="64-bit"):
            checks.seed("s", v)
    with pytest.raises(TypeError, match="s must be an int"):
        checks.seed("s", "x")


def test_huge_values_keep_messages_short():
    with pytest.raises(ValueError) as exc:
        checks.integer("n", 10**5000, maximum=3)  # Python itself refuses to print ints over 4300 digits
    assert "5001 digits" in str(exc.value) and len(str(exc.value)) < 100
    with pytest.raises(TypeError) as exc:
        checks.integer("n", list(range(10**5)))
    assert len(str(exc.value)) < 150


def test_token_ids_and_prompts():
    assert checks.token_ids("ids", torch.tensor([5, 9])) == [5, 9]
    assert checks.token_ids("ids", np.array([1, 2], dtype=np.int32)) == [1, 2]
    assert checks.token_ids("ids", range(3)) == [0, 1, 2]
    with pytest.raises(ValueError, match="1-D"):
        checks.token_ids("ids", torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="float"):
        checks.token_ids("ids", torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="vocabulary"):
        checks.token_ids("ids", [1, 50], vocab_size=50)
    with pytest.raises(ValueError, match=">= 0"):
        checks.token_ids("ids", [1, -1])
    with pytest.raises(TypeError, match="tokenizer"):
        checks.token_ids("ids", "hello")
    with pytest.raises(ValueError, match="empty prompt"):
        checks.prompt([], 50)
    with pytest.raises(TypeError, match="needs a tokenizer"):
        checks.prompt("hello", 50)


@pytest.mark.parametrize("prompts, n", [
    (torch.tensor([5, 9, 2, 33]), 1),          # a 1-D tensor is ONE prompt, as for add_request
    ([5, 9, 2, 33], 1), ("text", 1), ([[1, 2], [3]], 2), ([torch.tensor([1, 2]), [3]], 2), ([], 0), ((), 0),
])
def test_prompt_list_shapes(prompts, n):
    assert len(checks.prompt_list(prompts)) == n


@pytest.mark.parametrize("prompts, error", [
    (torch.zeros(2, 3, dtype=torch.long), ValueError), (np.zeros((2, 2), dtype=int), ValueError),
    (5, TypeError), (None, TypeError), ({"a": [1]}, TypeError), (iter([[1]]), TypeError),
])
def test_prompt_list_refuses(prompts, error):
    with pytest.raises(error, match="prompt"):
        checks.prompt_list(prompts)


def test_an_inflight_switch_is_off_only_when_set_to_a_no(monkeypatch):
    from inflight.checks import switched_off

    monkeypatch.delenv("INFLIGHT_TEST_SWITCH", raising=False)
    assert not switched_off("INFLIGHT_TEST_SWITCH")
    for off in ("0", "false", "No", " OFF "):
        monkeypatch.setenv("INFLIGHT_TEST_SWITCH", off)
        assert switched_off("INFLIGHT_TEST_SWITCH")
    for on in ("1", "yes", "", "true"):
        monkeypatch.setenv("INFLIGHT_TEST_SWITCH", on)
        assert not switched_off("INFLIGHT_TEST_SWITCH")
