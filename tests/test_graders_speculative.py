"""Chapter 12's grader (`check_verify`) accepts correct code in several styles and names each
classic mistake of the accept/reject rule; the mutants are written here, not imported from the
package. Also: the plain-Python rule and the engine's torch rejection sampler agree when fed the
same random numbers."""
import random

import pytest
import torch

from inflight.engine.spec_decode.rejection_sampler import rejection_sample
from inflight.engine.spec_decode.rule import draw, verify
from inflight.exercises.speculative import check_verify


def good_loop(p, q, draft, accept_u, draw_u):
    out = []
    for i, x in enumerate(draft):
        ratio = p[i][x] / q[i][x]
        if accept_u[i] < (ratio if ratio < 1 else 1.0):
            out.append(x)
        else:
            res = [a - b if a > b else 0.0 for a, b in zip(p[i], q[i])]
            return out + [draw(res, draw_u)]
    return out + [draw(p[len(draft)], draw_u)]


def good_numpy(p, q, draft, accept_u, draw_u):
    import numpy as np

    P = np.array(p, dtype=float)
    Q = np.array(q, dtype=float).reshape(len(draft), P.shape[1])
    for i, x in enumerate(draft):
        if not accept_u[i] < min(1.0, P[i, x] / Q[i, x]):
            return list(draft[:i]) + [draw(list(np.maximum(P[i] - Q[i], 0.0)), draw_u)]
    return list(draft) + [draw(list(P[len(draft)]), draw_u)]


@pytest.mark.parametrize("fn", [good_loop, good_numpy, verify])
def test_correct_answers_pass(fn):
    assert check_verify(fn, quiet=True)


def _stub(*args):
    raise NotImplementedError


def test_stub_is_not_implemented():
    r = check_verify(_stub, quiet=True)
    assert not r and r.not_implemented


def from_p_again(p, q, draft, accept_u, draw_u):
    for i, x in enumerate(draft):
        if accept_u[i] >= min(1.0, p[i][x] / q[i][x]):
            return draft[:i] + [draw(p[i], draw_u)]
    return draft + [draw(p[-1], draw_u)]


def only_if_more_likely(p, q, draft, accept_u, draw_u):
    for i, x in enumerate(draft):
        if p[i][x] < q[i][x]:
            return draft[:i] + [draw([max(0, a - b) for a, b in zip(p[i], q[i])], draw_u)]
    return draft + [draw(p[-1], draw_u)]


def no_bonus(p, q, draft, accept_u, draw_u):
    for i, x in enumerate(draft):
        if accept_u[i] >= min(1.0, p[i][x] / q[i][x]):
            return draft[:i] + [draw([max(0, a - b) for a, b in zip(p[i], q[i])], draw_u)]
    return list(draft) if draft else [draw(p[0], draw_u)]


def keeps_going(p, q, draft, accept_u, draw_u):
    kept = [x for i, x in enumerate(draft) if accept_u[i] < min(1.0, p[i][x] / q[i][x])]
    return kept + [draw(p[-1], draw_u)]


def p_alone(p, q, draft, accept_u, draw_u):
    for i, x in enumerate(draft):
        if accept_u[i] >= p[i][x]:
            return draft[:i] + [draw([max(0, a - b) for a, b in zip(p[i], q[i])], draw_u)]
    return draft + [draw(p[-1], draw_u)]


@pytest.mark.parametrize("fn, name", [(from_p_again, "resampling from p instead of the residual"),
                                      (only_if_more_likely, "accepting only when p ≥ q"),
                                      (no_bonus, "no bonus token"),
                                      (keeps_going, "going on after a rejection"),
                                      (p_alone, "treating every proposal as certain")])
def test_each_mistake_is_named(fn, name):
    r = check_verify(fn, quiet=True)
    assert not r and r.mistake == name, (r.mistake, r.report)


def test_changing_the_inputs_is_reported():
    def pops(p, q, draft, accept_u, draw_u):
        out = verify(p, q, draft, accept_u, draw_u)
        accept_u.clear()
        return out
    r = check_verify(pops, quiet=True)
    assert not r and "accept_u" in r.report


def test_the_plain_rule_and_the_torch_sampler_agree():
    rng = random.Random(0)
    for _ in range(300):
        v, k = rng.randint(2, 9), rng.randint(0, 5)
        logits = torch.randn(k + 1, v, dtype=torch.float64) * rng.choice([0.5, 2.0, 5.0])
        temp = rng.choice([0.5, 1.0, 1.7])
        p = torch.softmax(logits / temp, -1)
        q = torch.softmax(torch.randn(k, v, dtype=torch.float64), -1) if rng.random() < 0.5 else None
        draft = [int(torch.multinomial(q[i], 1)) if q is not None else rng.randrange(v) for i in range(k)]
        qq = q.tolist() if q is not None else [[1.0 if j == x else 0.0 for j in range(v)] for x in draft]
        us = [rng.random() for _ in range(k + 1)]
        it = iter(us)
        got = rejection_sample(logits, draft, temp, 1.0, lambda: next(it), q)
        a = len(got) - 1
        want = verify(p.tolist(), qq, draft, us[:k], us[a + (a < k)] if a < k else us[k])
        assert got == want
