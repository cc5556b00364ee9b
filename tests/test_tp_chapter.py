"""Chapter 10's pieces without processes: the rank_heads grader (every known mistake named, odd but
right answers accepted), the capacity arithmetic the chapter quotes, and the explorer."""
from __future__ import annotations

import numpy as np
import pytest

from inflight.exercises.parallel import MISTAKES, check_rank_heads, rank_heads
from inflight.model.tp_layout import kv_heads_per_rank
from inflight.sim.tp_capacity import (GB, H100_NVLINK, H100_PCIE, LLAMA_8B, LLAMA_70B, all_reduce_bytes_per_token,
                                      decode_step_cost, device_share)


def test_the_reference_passes_and_each_mistake_is_named():
    assert check_rank_heads(rank_heads, quiet=True)
    for m in MISTAKES:
        r = check_rank_heads(m.impl, quiet=True)
        assert not r and r.mistake == m.name, (m.name, r.report)


@pytest.mark.parametrize("style", ["ranges", "numpy", "tuples", "generator-free sets sorted"])
def test_right_answers_in_other_styles_pass(style):
    def answer(h, kv, n, r):
        q, k = rank_heads(h, kv, n, r)
        if style == "ranges":
            return range(q[0], q[-1] + 1), range(k[0], k[-1] + 1)
        if style == "numpy":
            return np.array(q), np.array(k, dtype=np.int64)
        if style == "tuples":
            return tuple(q), tuple(k)
        return sorted(set(q)), sorted(set(k))

    assert check_rank_heads(answer, quiet=True)


def test_wrong_shapes_get_a_named_diagnosis():
    assert "not a pair" in check_rank_heads(lambda h, kv, n, r: [0], quiet=True).report.lower()
    def split_like_q(h, kv, n, r):  # kv // n is 0 when there are fewer KV heads than ranks
        return rank_heads(h, kv, n, r)[0], list(range(r * (kv // n), (r + 1) * (kv // n)))

    r = check_rank_heads(split_like_q, quiet=True)
    assert not r and "a rank with no kv head" in r.report.lower() and "Replicate" in r.report

    def stub(h, kv, n, r):
        raise NotImplementedError

    assert check_rank_heads(stub, quiet=True).not_implemented


def test_capacity_figures_the_chapter_quotes():
    one, two, four, eight = (device_share(LLAMA_70B, tp, H100_NVLINK.memory) for tp in (1, 2, 4, 8))
    assert 70e9 < LLAMA_70B.params < 71e9
    assert not one.fits and not two.fits and four.fits and eight.fits
    assert device_share(LLAMA_70B, 2, H100_NVLINK.memory, vocab_split=True).fits  # vLLM's choice would fit
    assert eight.kv_bytes_per_token * 8 == one.kv_bytes_per_token  # each device a slice of every token
    assert eight.kv_tokens > 2 * four.kv_tokens  # weights shrink too
    sixteen = device_share(LLAMA_70B, 16, H100_NVLINK.memory)
    assert sixteen.kv_heads == kv_heads_per_rank(8, 16) == 1  # replicated: no further KV saving
    assert sixteen.kv_bytes_per_token == eight.kv_bytes_per_token
    assert all_reduce_bytes_per_token(LLAMA_70B) == 2 * 80 * 8192 * 2
    assert device_share(LLAMA_8B, 1, 80 * GB).fits


def test_decode_step_cost():
    assert decode_step_cost(LLAMA_8B, H100_NVLINK, 1, 64, 2048).communicate == 0
    nv = decode_step_cost(LLAMA_70B, H100_NVLINK, 8, 64, 2048)
    pc = decode_step_cost(LLAMA_70B, H100_PCIE, 8, 64, 2048)
    assert nv.read == pc.read and pc.communicate > nv.communicate > 0
    assert decode_step_cost(LLAMA_70B, H100_NVLINK, 8, 64, 2048).total < decode_step_cost(
        LLAMA_70B, H100_NVLINK, 4, 64, 2048).total
    with pytest.raises(ValueError):
        device_share(LLAMA_70B, 3, 80 * GB)


def test_tp_explorers_build_and_redraw():
    from inflight.book import explore_tp
    from inflight.book.widgets import check_redraw

    site = explore_tp.tp_site()
    assert site.nbytes < 100 * 1024
    assert "redraws" in check_redraw(explore_tp.tp_live(tps=(2, 4)))
    assert "does not fit" in explore_tp.headline("70B", 2) and "KV for" in explore_tp.headline("70B", 8)
