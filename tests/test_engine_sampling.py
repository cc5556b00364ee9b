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
