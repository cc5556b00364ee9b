"""The lower bounds of `inflight.bench.protocol.floor`: where the linear layers are timed, how a run's steps
add up from that grid, and what the bounds say about a peer."""
import pytest
import torch

from inflight.bench.protocol import floor as fl


def test_row_grid_spans_the_rows_geometrically():
    grid = fl.row_grid([3, 1, 7, 200, 50], points=5)
    assert grid[0] == 1 and grid[-1] == 200
    assert grid == sorted(set(grid)) and len(grid) <= 5
    ratios = [b / a for a, b in zip(grid, grid[1:])]
    assert max(ratios) / min(ratios) < 1.5  # evenly spaced on a log scale (up to rounding)
    assert fl.row_grid([4, 4, 4]) == [4]
    with pytest.raises(ValueError, match=">= 1"):
        fl.row_grid([0, 3])


def test_linear_seconds_interpolates_between_measured_rows(model, monkeypatch):
    calls = []

    def fake(m, rows, repeats=5, min_seconds=0.0):  # an affine cost: 1 ms + 0.1 ms per row
        calls.append(rows)
        return 1e-3 + 1e-4 * rows

    monkeypatch.setattr(fl, "measure_linear_layers", fake)
    total, grid = fl.linear_seconds(model, [1, 10, 10, 100, 0], points=3)
    assert sorted(calls) == sorted(grid) and grid[1] == pytest.approx(1.1e-3)
    # steps with no tokens cost nothing; an affine cost is interpolated exactly
    assert total == pytest.approx(sum(1e-3 + 1e-4 * r for r in (1, 10, 10, 100)))
    assert fl.linear_seconds(model, []) == (0.0, {})


def test_the_lm_head_is_charged_at_the_sampled_rows_not_at_every_token(model, monkeypatch):
    """An engine runs the LM head on the rows it samples from (one per sequence at most): with each
    step's sequences recorded, the head is timed at those rows and the other layers at the tokens."""
    seen = []

    def fake(m, rows, repeats=5, min_seconds=0.0, layers=None):
        head = layers is not None and any(x is m.lm_head for x in layers)
        assert layers is not None and (head == (len(layers) == 1))  # the head alone, or everything else
        seen.append(("head" if head else "body", rows))
        return (1e-5 if head else 1e-4) * rows

    monkeypatch.setattr(fl, "measure_linear_layers", fake)
    total, grid = fl.linear_seconds(model, [100, 100, 3], points=2, head_rows=[2, 4, 3])
    assert total == pytest.approx(1e-4 * 203 + 1e-5 * 9)
    assert sorted(grid) == [3, 100] and {r for k, r in seen if k == "head"} == {2, 4}
    run = {"wall_s": 1.0, "useful_tokens": 9,
           "work_per_step": {"tokens": [100, 100, 3], "kv_tokens": [0] * 3, "sequences": [2, 4, 3]}}
    assert fl.time_floor(model, run, 1e6, 1000)["linear_layers_s"] == pytest.approx(total)
    with pytest.raises(ValueError, match="head_rows"):
        fl.linear_seconds(model, [1, 2], head_rows=[1])


def test_linear_seconds_measures_the_real_layers(model):
    total, grid = fl.linear_seconds(model, [1, 2, 4], points=2, min_seconds=0.001)
    assert set(grid) == {1, 4} and total > 0
    assert grid[4] > 0 and total >= grid[1]


def test_time_floor_splits_the_wall_time_and_bounds_the_peers(model, monkeypatch):
    monkeypatch.setattr(fl, "measure_linear_layers", lambda m, rows, repeats=5, min_seconds=0.0: 0.01)
    run = {"wall_s": 1.0, "useful_tokens": 40, "work_per_step": {"tokens": [8, 8, 8, 8, 8], "kv_tokens": [100] * 5}}
    f = fl.time_floor(model, run, bandwidth=1e6, kv_bytes_per_token=1000)
    assert f["linear_layers_s"] == pytest.approx(0.05)
    assert f["kv_read_s"] == pytest.approx(0.5)  # 500 tokens x 1000 bytes at 1 MB/s
    assert f["rest_s"] == pytest.approx(0.45) and f["rest_share"] == pytest.approx(0.45)
    assert f["max_tokens_per_s_linear_only"] == pytest.approx(800)
    assert f["max_tokens_per_s_linear_and_kv"] == pytest.approx(40 / 0.55)
    b = fl.ratio_bounds(f, {"hf_static": 100.0, "hf_continuous": None})
    # no prompts given: the floor is the linear layers and the KV read
    assert b == {"hf_static": {"linear_only": pytest.approx(8.0), "linear_and_kv": pytest.approx(40 / 0.55 / 100),
                               "floor": pytest.approx(40 / 0.55 / 100)}}
    with pytest.raises(ValueError, match="per-step work"):
        fl.time_floor(model, {"wall_s": 1.0, "useful_tokens": 4}, 1e6, 1000)


def test_the_floor_counts_the_prompts_attention_arithmetic(model, monkeypatch):
    """Each prompt of P tokens: P(P+1)/2 causal (query, key) pairs at 4 x heads x head size FLOPs a
    layer, at the machine's matmul rate; decode attention stays in the KV read."""
    monkeypatch.setattr(fl, "measure_linear_layers", lambda m, rows, repeats=5, min_seconds=0.0: 0.01)
    cfg = model.config
    per_pair = 4 * cfg.num_attention_heads * cfg.head_dim * cfg.num_hidden_layers
    assert fl.prefill_attention_flops(cfg, [1, 3]) == per_pair * (1 + 6)
    run = {"wall_s": 1.0, "useful_tokens": 40, "work_per_step": {"tokens": [8] * 5, "kv_tokens": [100] * 5}}
    f = fl.time_floor(model, run, bandwidth=1e6, kv_bytes_per_token=1000, prompt_lens=[10, 20],
                      matmul_flops=per_pair * 265 / 0.1)  # 55 + 210 pairs in 0.1 s
    assert f["prefill_attention_s"] == pytest.approx(0.1)
    assert f["floor_s"] == pytest.approx(0.05 + 0.5 + 0.1) and f["rest_s"] == pytest.approx(1 - 0.65)
    assert f["max_tokens_per_s_floor"] == pytest.approx(40 / 0.65)
    assert fl.ratio_bounds(f, {"hf_static": 10.0})["hf_static"]["floor"] == pytest.approx(40 / 0.65 / 10)


def test_the_linear_layers_are_timed_with_whichever_implementation_is_faster(monkeypatch):
    """At a few rows both torch and the skinny-GEMM kernel are timed: the floor is the faster one."""
    from inflight.bench import profiling
    from inflight.model.loading import load_tiny

    model = load_tiny()[0]
    calls = []
    real = profiling._best_time
    monkeypatch.setattr(profiling, "_best_time", lambda fn, *a, **k: calls.append(fn) or real(fn, *a, **k))
    few = profiling.measure_linear_layers(model, 4, repeats=1, min_seconds=0.0)
    assert few > 0 and len(calls) == (2 if profiling.skinny_gemm.load() is not None else 1)
    calls.clear()
    many = profiling.measure_linear_layers(model, profiling.skinny_gemm.max_rows() + 1, repeats=1, min_seconds=0.0)
    assert many > 0 and len(calls) == 1  # past the kernel's rows: torch only


def test_the_matmul_roof_is_the_faster_of_torch_and_the_packages_gemm(monkeypatch):
    """The prompt attention's floor is its arithmetic at the machine's matmul rate; on a CPU the
    package's own GEMM may beat torch's BLAS (AVX-512 against 8-wide code), so both are timed on the
    same product and the shorter time sets the rate -- a floor from the slower would not bound the
    kernels that run faster. Elsewhere (another dtype) torch alone."""
    from inflight.bench import profiling

    times = iter([1.0, 0.5])  # torch's, then the kernel's
    calls = []
    monkeypatch.setattr(profiling, "_best_time", lambda fn, *a, **k: calls.append(fn) or next(times))
    rate = profiling.measure_matmul_flops("cpu", torch.float32, n=64, repeats=1, min_seconds=0.0)
    if profiling.skinny_gemm.load() is not None:
        assert len(calls) == 2 and rate == pytest.approx(2 * 64**3 / 0.5)
    else:
        assert len(calls) == 1 and rate == pytest.approx(2 * 64**3 / 1.0)
    calls.clear()
    times = iter([1.0, 0.5])
    profiling.measure_matmul_flops("cpu", torch.float64, n=64, repeats=1, min_seconds=0.0)
    assert len(calls) == 1
