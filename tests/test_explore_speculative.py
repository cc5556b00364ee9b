"""Chapter 12's explorer: the speed-up formula over its cost tables, the site's views, the live one."""
import pytest

from inflight.book import explore_speculative as X
from inflight.engine.spec_decode import expected_tokens_per_step


def _costs(label="here"):
    target = {(b, q): 1e-3 * (1 + 0.1 * b * q) for b in (1, 8, 64) for q in (1, 2, 3, 5, 9)}
    draft = {(b, q): 1e-4 * (1 + 0.1 * b * q) for b in (1, 8, 64) for q in (1, 2)}
    return X.Costs(target, draft, label, overhead={1: 5e-4, 8: 5e-4, 64: 5e-4})


def test_speedup_is_the_formula():
    c = _costs()
    t1, t5 = 1e-3 * 1.1 + 5e-4, 1e-3 * 1.5 + 5e-4
    assert c.speedup("ngram", 0.5, 4, 1) == pytest.approx(expected_tokens_per_step(0.5, 4) * t1 / t5)
    draft = 1e-4 * 1.2 + 3 * 1e-4 * 1.1
    assert c.speedup("draft", 0.5, 4, 1) == pytest.approx(expected_tokens_per_step(0.5, 4) * t1 / (t5 + draft))
    assert c.step(8, 4) == pytest.approx(1e-3 * (1 + 0.1 * 8 * 4) + 5e-4)  # linear between q = 3 and 5
    assert c.max_batch == 64 and c.batches(X.BATCHES) == [1, 2, 4, 8, 16, 32, 64]


def test_roofline_costs_are_flat_until_the_ridge():
    g = X.roofline_costs(8e9, 1.2e9, 131072, 32768, 989e12, 4.8e12, 1024, "gpu")
    assert g.step(1, 5) / g.step(1, 1) < 1.01          # memory-bound: 5 tokens cost what 1 does
    assert g.step(512, 5) / g.step(512, 1) > 2          # past the ridge: they cost their arithmetic
    assert g.speedup("ngram", 0.7, 4, 1) > g.speedup("ngram", 0.7, 4, 512)


def test_site_and_live_explorers():
    alphas = {"ngram": 0.3, "draft": 0.8}
    site = X.spec_site(alphas, [_costs(), X.roofline_costs(8e9, 1.2e9, 131072, 32768, 989e12, 4.8e12, 1024, "gpu")])
    assert "60 views" in repr(site)
    live = X.spec_live(alphas, [_costs(), _costs("again")])
    assert live.redraws and live.redraws[-1].error is None
