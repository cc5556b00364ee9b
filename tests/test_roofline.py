"""The decode-step roofline (`inflight.sim.roofline`) and the numbers chapters 1 and 6 quote from it:
where batching stops being nearly free (KV reads = weight reads), why a long-context decode step is
memory-bound at every batch, and the context at which recomputing a token costs as much in
attention as in the matmuls."""
from __future__ import annotations

import matplotlib
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inflight.exercises.batching import MODEL_SHAPES, kv_bytes_per_token
from inflight.sim.roofline import (PUBLISHED_PARAMETERS, attention_intensity, compute_bound_context_limit,
                                   decode_step, intensity_limit, kv_crossover_batch, kv_crossover_context,
                                   llama_weights, recompute_attention_crossover, weight_ridge_batch)

matplotlib.use("Agg")

A100 = dict(peak_flops=312e12, bandwidth=2.0e12)  # the datasheet numbers chapter 1 uses
H100 = dict(peak_flops=989e12, bandwidth=3.35e12)
GPU_BYTES = 80 * 2**30 * 0.9                      # chapter 1: 90% of an 80 GB A100 (80 GiB: 81,920 MiB)


def model(name: str) -> tuple[float, float, float]:
    """(params, fp16 weight bytes, fp16 KV bytes per token) of a model the chapter prices."""
    params = PUBLISHED_PARAMETERS[name]
    return params, 2 * params, kv_bytes_per_token(MODEL_SHAPES[name], 2)


def fit(name: str, context: int, bytes_per_value: int = 2) -> int:
    """Chapter 1's count of `context`-token requests that fit next to the weights."""
    params = PUBLISHED_PARAMETERS[name]
    return int((GPU_BYTES - 2 * params) // (kv_bytes_per_token(MODEL_SHAPES[name], bytes_per_value) * context))


# -- the numbers the chapters quote --------------------------------------------------------------
def test_weight_ridge_is_the_ridge_of_the_matmuls():
    assert weight_ridge_batch(A100["peak_flops"], A100["bandwidth"], 2) == pytest.approx(156)
    assert weight_ridge_batch(H100["peak_flops"], H100["bandwidth"], 2) == pytest.approx(295.2, abs=0.1)


def test_llama2_7b_at_4k_is_far_from_free():
    # the expert's example (27 requests with 80e9 bytes; 29 with the card's real 80 GiB): 29 requests
    # at 4k read about 62 GB of KV against 13.5 GB of weights, a step about 4.8x as long as at batch 1
    params, weights, kv = model("Llama-2-7B")
    assert kv == 512 * 1024
    batch = fit("Llama-2-7B", 4096)
    assert batch == 29
    full = decode_step(params, weights, kv, batch, 4096, **A100)
    one = decode_step(params, weights, kv, 1, 4096, **A100)
    assert full.kv_bytes / 1e9 == pytest.approx(62.28, abs=0.01)
    assert full.weight_bytes / 1e9 == pytest.approx(13.48)
    assert full.time_s / one.time_s == pytest.approx(4.85, abs=0.01)
    assert full.bound == one.bound == "memory"
    assert full.time_s * 1e3 == pytest.approx(37.9, abs=0.1)
    # batching still pays, just not 29x
    assert (full.batch / full.time_s) / (one.batch / one.time_s) == pytest.approx(5.98, abs=0.01)


def test_crossover_batches_at_4k():
    p7, w7, kv7 = model("Llama-2-7B")
    p8, w8, kv8 = model("Llama-3-8B")
    assert kv_crossover_batch(w7, 4096, kv7) == pytest.approx(6.28, abs=0.01)
    assert kv_crossover_batch(w8, 4096, kv8) == pytest.approx(29.9, abs=0.05)
    # at the crossover the KV reads are the weight reads, and the step takes twice the weights' time
    for params, weights, kv in ((p7, w7, kv7), (p8, w8, kv8)):
        b = kv_crossover_batch(weights, 4096, kv)
        step = decode_step(params, weights, kv, b, 4096, **A100)
        assert step.kv_bytes == pytest.approx(weights)
        assert step.time_s == pytest.approx(2 * weights / A100["bandwidth"])


def test_intensity_caps_and_the_context_beyond_which_nothing_is_compute_bound():
    p7, _, kv7 = model("Llama-2-7B")
    p8, _, kv8 = model("Llama-3-8B")
    assert intensity_limit(p7, 4096, kv7) == pytest.approx(6.28, abs=0.01)   # "near 6 FLOP/byte"
    assert intensity_limit(p8, 4096, kv8) == pytest.approx(29.9, abs=0.05)   # "near 30"
    assert compute_bound_context_limit(p7, kv7, **A100) == pytest.approx(164.8, abs=0.1)
    assert compute_bound_context_limit(p8, kv8, **A100) == pytest.approx(785.4, abs=0.1)
    # attention over the cache: the GQA group size in 16-bit
    assert attention_intensity(32, 32, 2) == 1
    assert attention_intensity(32, 8, 2) == 4


def test_int8_kv_doubles_the_batch_for_the_same_bytes():
    params, weights, kv = model("Llama-2-7B")
    assert fit("Llama-2-7B", 4096, 1) == 59
    fp16 = decode_step(params, weights, kv, 29, 4096, **A100)
    int8 = decode_step(params, weights, kv / 2, 58, 4096, **A100)
    assert int8.kv_bytes == fp16.kv_bytes
    assert int8.time_s == fp16.time_s
    assert intensity_limit(params, 4096, kv / 2) == pytest.approx(12.6, abs=0.05)


def test_long_context_exercise():
    _, w8, kv8 = model("Llama-3-8B")
    assert kv_crossover_context(w8, 32, kv8) == pytest.approx(3829, abs=1)


def test_recompute_crossover_of_chapter_6():
    # Llama-3.2-1B: 16 layers, hidden 2048, 8 KV heads of 64, MLP 8192 (its config.json)
    weights = llama_weights(16, 2048, 8 * 64, 8192)
    assert weights == 973_078_528
    c = recompute_attention_crossover(weights, 16, 2048)
    assert c == 14_848
    # at c the attention FLOPs of one token (2·2·L·H·d·c) equal its matmul FLOPs (2·W)
    assert 2 * 2 * 16 * 2048 * c == 2 * weights
    # a request of 2c tokens sees c earlier tokens on average: 29,696, the number the old text called a context
    assert 2 * c == 29_696


# -- properties ----------------------------------------------------------------------------------
sizes = st.floats(1e6, 1e12)
per_token = st.floats(1e3, 1e7)
batches = st.floats(1, 4096)
contexts = st.floats(1, 1e6)


@given(params=sizes, kv=per_token, batch=batches, context=contexts, grow=st.floats(1, 10))
def test_step_time_never_falls_as_batch_or_context_grow(params, kv, batch, context, grow):
    step = decode_step(params, 2 * params, kv, batch, context, **A100)
    assert decode_step(params, 2 * params, kv, batch * grow, context, **A100).time_s >= step.time_s
    assert decode_step(params, 2 * params, kv, batch, context * grow, **A100).time_s >= step.time_s
    assert step.intensity < intensity_limit(params, context, kv) * (1 + 1e-9)


@given(params=sizes, kv=per_token, batch=batches, over=st.floats(1.0001, 100))
def test_beyond_the_context_limit_every_batch_is_memory_bound(params, kv, batch, over):
    context = compute_bound_context_limit(params, kv, **A100) * over
    assert decode_step(params, 2 * params, kv, batch, context, **A100).bound == "memory"


@given(params=sizes, kv=per_token, context=contexts)
def test_intensity_approaches_its_limit(params, kv, context):
    far = 1e6 * kv_crossover_batch(2 * params, context, kv)  # KV reads a million times the weights'
    huge = decode_step(params, 2 * params, kv, far, context, **A100)
    assert huge.intensity == pytest.approx(intensity_limit(params, context, kv), rel=1e-5)


@pytest.mark.parametrize("call", [
    lambda: decode_step(1e9, 2e9, 1e5, 0, 10, **A100),
    lambda: decode_step(1e9, 2e9, 1e5, 4, -1, **A100),
    lambda: decode_step(1e9, 2e9, float("nan"), 4, 10, **A100),
    lambda: weight_ridge_batch(312e12, 0, 2),
    lambda: kv_crossover_batch(1e9, 0, 1e5),
    lambda: recompute_attention_crossover(1e9, 16, -2048),
    lambda: attention_intensity(32, 0, 2),
])
def test_bad_values_are_refused_by_name(call):
    with pytest.raises(ValueError, match="must be"):
        call()


def test_bad_types_are_refused():
    with pytest.raises(TypeError, match="batch"):
        decode_step(1e9, 2e9, 1e5, "4", 10, **A100)
    with pytest.raises(TypeError, match="context"):
        kv_crossover_batch(1e9, True, 1e5)


# -- the picture ---------------------------------------------------------------------------------
def test_crossover_picture_marks_the_crossover_and_the_full_memory():
    from inflight.book.roofline_plots import plot_batching_crossover

    params, weights, kv = model("Llama-2-7B")
    contexts = [256, 1024, 4096, 16384]
    fig = plot_batching_crossover(params, weights, kv, contexts, kv_room_bytes=GPU_BYTES - weights, **A100)
    ax_t, ax_r = fig.axes
    dots = [ln for ln in ax_t.lines if ln.get_marker() == "o"]
    crosses = [ln for ln in ax_t.lines if ln.get_marker() == "x"]
    assert len(dots) == len(crosses) == len(contexts)
    for ctx, dot, cross in zip(contexts, dots, crosses):
        b = kv_crossover_batch(weights, ctx, kv)
        assert dot.get_xdata()[0] == pytest.approx(b)
        assert dot.get_ydata()[0] == pytest.approx(2 * weights / A100["bandwidth"] * 1e3)  # twice the weights' time
        assert cross.get_xdata()[0] == pytest.approx((GPU_BYTES - weights) / (ctx * kv))
    # every curve ends on the same step time: a full memory reads weights + KV room, whatever the context
    ends = [c.get_ydata()[0] for c in crosses]
    assert max(ends) == pytest.approx(min(ends)) == pytest.approx(GPU_BYTES / A100["bandwidth"] * 1e3)
    matplotlib.pyplot.close(fig)

