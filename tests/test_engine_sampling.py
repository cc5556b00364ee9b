"""The sampler: greedy is argmax, top-p never leaves the nucleus, seeds reproduce a row's draws
whatever else is in the batch."""
import torch
from hypothesis import given, settings, strategies as st

from inflight.model.sampler import Sampler, make_generator


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), top_p=st.floats(0.05, 1.0), temperature=st.floats(0.1, 2.0))
def test_top_p_stays_in_the_nucleus(seed, top_p, temperature):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, 50, generator=g) * 3
    token = Sampler()(logits, [temperature], [top_p], [make_generator(seed)])[0]
    probs = torch.softmax(logits[0] / temperature, -1, dtype=torch.float64)
    order = torch.argsort(probs, descending=True, stable=True)
    before = probs[order].cumsum(0) - probs[order]
    nucleus = set(order[before < top_p].tolist())
    assert token in nucleus


def test_greedy_is_argmax_and_seeds_ignore_batch_neighbours():
    torch.manual_seed(0)
    logits = torch.randn(4, 30)
    assert Sampler()(logits, [0.0] * 4, [1.0] * 4, [None] * 4) == logits.argmax(-1).tolist()
    alone = Sampler()(logits[2:3], [1.0], [1.0], [make_generator(5)])[0]
    mixed = Sampler(seed=123)(logits, [0.7, 0.0, 1.0, 0.0], [1.0] * 4, [None, None, make_generator(5), None])
    assert mixed[2] == alone and mixed[1] == logits[1].argmax().item()


def test_a_row_that_cannot_be_sampled_fails_alone():
    import math

    import pytest

    from inflight.model.sampler import SamplingError

    torch.manual_seed(1)
    logits = torch.randn(7, 50)
    logits[1] = math.nan
    logits[2, 3] = math.inf
    logits[3] = -math.inf
    logits[4, :10] = -math.inf  # some tokens masked out: a perfectly good row
    temps = [0.9, 0.0, 0.9, 0.9, 0.9, 5e-324, 0.9]  # row 5: a temperature that overflows even float64
    gens = [make_generator(i) for i in range(7)]
    gens[6] = object()  # a random stream that fails
    tokens, failures = Sampler().sample(logits, temps, [1.0] * 7, gens)
    assert sorted(failures) == [1, 2, 3, 5, 6] and all(tokens[i] == -1 for i in failures)
    assert "not finite" in failures[1] and "NaN" in failures[5] and "generator" in failures[6]
    for i in (0, 4):  # the others sample exactly what they sample alone
        assert tokens[i] == Sampler()(logits[i:i + 1], [temps[i]], [1.0], [make_generator(i)])[0]
    assert tokens[4] >= 10
    with pytest.raises(SamplingError, match="could not be sampled"):
        Sampler()(logits, temps, [1.0] * 7, [make_generator(i) for i in range(7)])
