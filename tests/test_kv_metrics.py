"""KV utilization measurement: paged sits at its ceiling (the allocator adds no waste beyond each
request's last block), contiguous reservation wastes most memory, and every request finishes."""
import pytest

from inflight.sim import kv_sim as km
from inflight.sim import workloads as W


@pytest.fixture(scope="module")
def short_runs():
    return km.utilization_table(W.short_chat(600, seed=1))


def test_paged_is_at_its_ceiling_and_far_above_contiguous(short_runs):
    c = short_runs["contiguous"]
    assert 0.15 < c.utilization < 0.45
    for bs in (8, 16, 32):
        r = short_runs[f"paged-{bs}"]
        assert abs(r.utilization - r.ceiling) < 0.005
        assert r.utilization > 0.85 and r.finished == c.finished == 600
    assert short_runs["paged-8"].utilization > short_runs["paged-16"].utilization > short_runs["paged-32"].utilization


def test_rule_of_thumb_matches_measurement(short_runs):
    w = W.short_chat(600, seed=1)
    assert abs(km.tail_waste_estimate(w, 16) - short_runs["paged-16"].ceiling) < 0.01


def test_more_requests_fit_paged(short_runs):
    assert short_runs["paged-16"].mean_running > 2 * short_runs["contiguous"].mean_running
    assert short_runs["paged-16"].steps < short_runs["contiguous"].steps


def test_reserved_never_exceeds_pool_and_tokens_never_exceed_reserved(short_runs):
    for r in short_runs.values():
        assert (r.reserved <= r.pool_slots).all() and (r.tokens <= r.reserved).all()
        assert (r.ceiling_reserved <= r.reserved).all()


def test_tight_pool_preempts_but_finishes():
    w = [(100, 200)] * 6
    r = km.simulate_kv(w, "paged", block_size=16, pool_slots=700, watermark=0)
    assert r.finished == 6 and r.preemptions > 0


def test_bad_inputs():
    with pytest.raises(ValueError, match="layout"):
        km.simulate_kv([(1, 1)], "ring")
    with pytest.raises(ValueError, match="longest"):
        km.simulate_kv([(10, 10)], max_len=5)
    with pytest.raises(ValueError, match="output_len"):
        km.simulate_kv([(10, 0)])


def test_requests_that_fit():
    fit = km.requests_that_fit(1 << 20, 1024, max_len=256, typical_len=40, block_size=16)
    assert fit == {"slots": 1024, "contiguous": 4, "paged": 21}


def test_sharegpt_lengths_fit_max_len():
    fitted = W.clip_to_context(W.sharegpt_like(300, seed=0), 2048)
    assert all(r.prompt_len + r.output_len <= 2048 and r.output_len >= 1 for r in fitted)
    # a prompt that fills the context keeps max_len - 1 tokens and one output token
    assert W.clip_to_context([W.Request("a", 3000, 50)], 2048)[0] == W.Request("a", 2047, 1)
    with pytest.raises(ValueError, match="max_len"):
        W.clip_to_context(fitted, 1)
