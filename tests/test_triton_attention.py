"""The Triton paged-decode kernels against a plain-torch reference: block sizes 8/16/32/50, ragged
context lengths (0 included), MHA and GQA 2/3/4/8, head size 48, scrambled block tables, strided
views, fp32/fp16/bf16 — in one pass and split into partitions (several partitions, contexts that are
not a multiple of the partition size, partitions left empty by short sequences beside long ones,
more partitions than the reduction loads at once, scores far apart between partitions), plus the
reduction on its own and the partition heuristic.

Without a GPU the kernel runs under Triton's CPU interpreter, which must be switched on
(`TRITON_INTERPRET=1`) before triton is imported. So that the setting cannot leak into other
tests, every kernel check runs in ONE child process (this file run as a script); pytest only reads
its JSON report. On a CUDA machine the child runs the real kernels on the GPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import NamedTuple

import pytest

_INTERPRET_AT_IMPORT = os.environ.get("TRITON_INTERPRET")


class Case(NamedTuple):
    name: str
    block_size: int
    num_heads: int
    kv_heads: int
    head_dim: int
    context_lens: list
    dtype: str
    partition_size: int | None = None  # None: the kernel's own plan
    block_n: int | None = None
    q_gain: float = 1.0  # > 1 spreads the scores, so partitions' maxima lie far apart


CONFIGS = [
    Case("mha-bs8-fp32", 8, 4, 4, 32, [1, 8, 9, 57], "float32"),
    Case("gqa2-bs16-fp32", 16, 8, 4, 64, [16, 17, 100, 3], "float32"),
    Case("gqa4-bs32-fp16", 32, 8, 2, 32, [33, 1, 64, 95, 128], "float16"),
    Case("mqa-bs16-bf16", 16, 8, 1, 16, [5, 77, 48], "bfloat16"),
    Case("gqa8-bs8-fp16-d48", 8, 16, 2, 48, [130, 2, 31], "float16"),
    Case("gqa3-bs32-fp32", 32, 6, 2, 32, [200, 63], "float32"),
    Case("empty-context", 16, 4, 2, 32, [0, 20], "float32"),
    Case("contiguous-bs50", 50, 4, 2, 32, [50, 7, 33], "float32"),  # a contiguous cache: one block of max length
    # split into partitions: 100 is not a multiple of 32; 3 and 0 leave partitions empty beside 100
    Case("split-gqa4-bs16-fp16", 16, 8, 2, 32, [100, 3, 0, 64], "float16", 32, 16),
    Case("split-mha-bs8-fp32-d48", 8, 2, 2, 48, [57, 16, 1], "float32", 16, 16),
    Case("split-gqa8-bs32-bf16", 32, 16, 2, 32, [130, 20], "bfloat16", 64, 32),
    Case("split-gqa3-bs50-fp32", 50, 6, 2, 32, [50, 7, 33], "float32", 16, 16),  # partitions cross blocks
    Case("split-19-partitions-mqa", 16, 4, 1, 16, [300, 45], "float32", 16, 16),  # > 16: two reduction steps
    Case("split-peaky-scores", 16, 4, 2, 32, [200, 90], "float32", 64, 16, 6.0),
    Case("split-by-heuristic", 16, 4, 1, 32, [300, 120], "float32", None, 16),
]
TOL = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 2e-2}


def gather_reference(q, k_cache, v_cache, block_tables, context_lens, scale):
    """Gather each sequence's K/V slot by slot, then ordinary softmax attention in fp32."""
    import torch

    S, H, D = q.shape
    _, bs, kvh, _ = k_cache.shape
    out = torch.zeros(S, H, D, dtype=torch.float32)
    k_flat, v_flat = k_cache.reshape(-1, kvh, D).float(), v_cache.reshape(-1, kvh, D).float()
    for i in range(S):
        n = int(context_lens[i])
        if n == 0:
            continue
        pos = torch.arange(n)
        slots = block_tables[i, pos // bs].long() * bs + pos % bs
        k = k_flat[slots].repeat_interleave(H // kvh, dim=1)  # [n, H, D]
        v = v_flat[slots].repeat_interleave(H // kvh, dim=1)
        w = (torch.einsum("hd,nhd->hn", q[i].float(), k) * scale).softmax(-1)
        out[i] = torch.einsum("hn,nhd->hd", w, v)
    return out


def package_reference(q, k_cache, v_cache, block_tables, context_lens, scale):
    """The model helper's `inflight.model.attention.paged_attention`, when it exists and accepts a decode batch."""
    from inflight.model.attention import paged_attention
    from inflight.model.attention_metadata import AttentionMetadata

    S = q.shape[0]
    meta = AttentionMetadata.build([1] * S, context_lens.tolist(),
                                   [row.tolist() for row in block_tables], k_cache.shape[1], q.device)
    return paged_attention(q, k_cache, v_cache, meta, scale).float()


def _check_case(case: Case, device: str, package_available: bool) -> dict:
    """One config through the kernel, against the gather reference (and the package's, when it applies)."""
    import torch

    from inflight.model.triton_attention import paged_decode_attention, plan_decode, sm_count

    dt = getattr(torch, case.dtype)
    lens, bs, D = case.context_lens, case.block_size, case.head_dim
    S = len(lens)
    max_blocks = max(1, max(-(-n // bs) for n in lens))
    num_blocks = S * max_blocks + 5
    k_cache = torch.randn(num_blocks, bs, case.kv_heads, D).to(dt)
    v_cache = torch.randn(num_blocks, bs, case.kv_heads, D).to(dt)
    q = (case.q_gain * torch.randn(S, case.num_heads, D)).to(dt)
    # scrambled block tables: each sequence gets random, non-contiguous, non-sorted blocks
    block_tables = torch.randperm(num_blocks)[: S * max_blocks].reshape(S, max_blocks).to(torch.int32)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    scale = D ** -0.5
    args = [t.to(device) for t in (q, k_cache, v_cache, block_tables, context_lens)]
    out = paged_decode_attention(*args, scale, partition_size=case.partition_size, block_n=case.block_n).cpu()
    plan = plan_decode(S, case.kv_heads, D, max_blocks * bs, sm_count(torch.device(device)),
                       partition_size=case.partition_size, block_n=case.block_n)
    entry = {"shape_ok": tuple(out.shape) == (S, case.num_heads, D) and out.dtype == dt,
             "partitions": plan.num_partitions, "partition_size": plan.partition_size,
             "err_gather": (out.float() - gather_reference(q, k_cache, v_cache, block_tables, context_lens,
                                                           scale)).abs().max().item()}
    if package_available and min(lens) > 0:  # a decode step has >= 1 token
        try:
            ref = package_reference(*args, scale).cpu()
            entry["err_package"] = (out.float() - ref).abs().max().item()
        except Exception as exc:
            entry["err_package"] = f"{type(exc).__name__}: {exc}"
    return entry


def _strided_views(device: str) -> dict:
    """Non-contiguous cache views (a layer slice of a bigger tensor) go through strides, both paths."""
    import torch

    from inflight.model.triton_attention import paged_decode_attention

    big = torch.randn(2, 12, 16, 2, 32)
    k_view, v_view = big[0], big[1]
    q = torch.randn(2, 4, 32)
    bt = torch.randperm(12)[:8].reshape(2, 4).to(torch.int32)
    cl = torch.tensor([50, 64], dtype=torch.int32)
    ref = gather_reference(q, k_view, v_view, bt, cl, 0.17)
    errs = {}
    for label, ps in (("single", None), ("split", 16)):
        out = paged_decode_attention(*(t.to(device) for t in (q, k_view, v_view, bt, cl)), 0.17,
                                     partition_size=ps, block_n=16).cpu()
        errs[label] = (out - ref).abs().max().item()
    return errs


def _reduction_alone(device: str) -> dict:
    """The reduction on hand-made partials: maxima 300 apart (base 2), unused partitions poisoned with NaN."""
    import torch

    from inflight.model.triton_attention import combine_partitions

    S, H, P, D, psize = 3, 2, 20, 24, 8
    lens = torch.tensor([8 * 19 + 3, 9, 0], dtype=torch.int32)  # 20 partitions, 2 partitions, none
    m = torch.randn(S, H, P) * 100
    m[0, :, 5] = 300.0  # one partition dominates the first sequence
    l = torch.rand(S, H, P) * 7 + 0.5
    o = torch.randn(S, H, P, D)
    used = torch.arange(P)[None, :] < torch.div(lens + psize - 1, psize, rounding_mode="floor")[:, None]  # [S, P]
    w = torch.where(used[:, None, :], l * torch.exp2(m - m.masked_fill(~used[:, None, :], float("-inf"))
                                                     .amax(-1, keepdim=True).clamp_min(-1e30)), 0.0)
    expected = (w[..., None] * o).sum(2) / w.sum(2, keepdim=True).clamp_min(1e-30)
    poison = ~used[:, None, :].expand(S, H, P)
    m, l = m.masked_fill(poison, float("nan")), l.masked_fill(poison, float("nan"))
    o = o.masked_fill(poison[..., None], float("nan"))
    out = torch.full((S, H, D), float("nan"), device=device)
    got = combine_partitions(*(t.to(device) for t in (o, m, l, lens)), psize, P * psize, out).cpu()
    return {"err": (got - expected).abs().max().item(), "finite": bool(torch.isfinite(got).all())}


def _run_checks() -> dict:
    """Executed in the child process: every config, both references; returns max errors."""
    import torch

    device = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    torch.manual_seed(0)
    report = {"device": device, "results": {}, "package_reference": None}
    try:
        from inflight.model.attention import paged_attention  # noqa: F401
        from inflight.model.attention_metadata import AttentionMetadata  # noqa: F401
        report["package_reference"] = "available"
    except Exception as exc:  # the reference module may not import here
        report["package_reference"] = f"unavailable: {type(exc).__name__}: {exc}"
    for case in CONFIGS:
        report["results"][case.name] = _check_case(case, device, report["package_reference"] == "available")
    report["strided_views"] = _strided_views(device)
    report["reduction"] = _reduction_alone(device)
    # the benchmark's code path (timing with the wall clock here, CUDA events on a GPU), tiny sizes
    from inflight.bench.kernels.triton_decode import kernel_benchmark, kernel_report_lines, kernel_summary, tile_sweep

    tiny = {"num_heads": 4, "kv_heads": 2, "head_dim": 16, "dtype": "float32", "device": device}
    rows = kernel_benchmark(batches=(2,), contexts=(80,), repeats=1, sweep=(16,), **tiny)
    tune = tile_sweep(((2, 80),), block_ns=(16,), num_warps=(4,), num_stages=(2,), **tiny)
    report["bench_rows"], report["bench_tune"] = rows, tune
    report["bench_summary"] = kernel_summary(rows)
    report["bench_report"] = kernel_report_lines({"kernel": rows, "kernel_summary": report["bench_summary"],
                                                  "kernel_tune": tune})
    report["bad_inputs"] = _bad_input_errors(device)
    return report


@pytest.fixture(scope="module")
def report():
    pytest.importorskip("triton")
    env = dict(os.environ)
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if not cuda:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_CASES = {c.name: c for c in CONFIGS}


@pytest.mark.parametrize("name", list(_CASES))
def test_kernel_matches_gather_reference(report, name):
    entry = report["results"][name]
    assert entry["shape_ok"]
    assert entry["err_gather"] < TOL[_CASES[name].dtype], entry


@pytest.mark.parametrize("name", list(_CASES))
def test_kernel_matches_package_reference(report, name):
    if report["package_reference"] != "available":
        pytest.skip(f"inflight.model.attention.paged_attention {report['package_reference']}")
    if "err_package" not in report["results"][name]:
        pytest.skip("an empty context is not a decode step for the reference")
    err = report["results"][name]["err_package"]
    assert isinstance(err, float), err
    assert err < TOL[_CASES[name].dtype]


@pytest.mark.parametrize("name", [n for n in _CASES if n.startswith("split-")])
def test_split_cases_really_split(report, name):
    """Each split case runs several partitions, some of them past the end of a shorter sequence."""
    entry, case = report["results"][name], _CASES[name]
    assert entry["partitions"] > 1, entry
    assert min(case.context_lens) <= (entry["partitions"] - 1) * entry["partition_size"], entry
    assert any(n % entry["partition_size"] for n in case.context_lens), "no partial last partition"


def test_reduction_alone(report):
    """Far-apart maxima rescaled without overflow; partitions past a context (NaN here) never read."""
    assert report["reduction"]["finite"], report["reduction"]
    assert report["reduction"]["err"] < 1e-5, report["reduction"]


def test_strided_cache_views(report):
    assert report["strided_views"]["single"] < 1e-4, report["strided_views"]
    assert report["strided_views"]["split"] < 1e-4, report["strided_views"]


def test_benchmark_code_path_runs(report):
    (row,) = report["bench_rows"]
    assert row["max_abs_err_vs_sdpa"] < 1e-4 and row["single_pass_err_vs_sdpa"] < 1e-4
    assert row["triton_ms"] > 0 and row["single_pass_ms"] > 0 and row["sdpa_ms"] > 0 and row["triton_gbs"] > 0
    assert row["ratio_to_sdpa"] == pytest.approx(row["triton_ms"] / row["sdpa_ms"])
    assert row.get("torch_paged_ms") is None or row["torch_paged_ms"] > 0
    assert list(row["sweep_ms"]) == ["64", "single"], row["sweep_ms"]  # 16 tokens round up to one tile of 64
    assert report["bench_summary"]["sizes"] == 1
    (tuned,) = report["bench_tune"]
    assert tuned["err_vs_sdpa"] < 1e-4 and tuned["ms"] > 0 and tuned["partitions"] >= 1, tuned
    assert any(line.startswith("  tune batch 2 ctx 80") for line in report["bench_report"]), report["bench_report"]


def test_interpreter_did_not_leak_into_this_process(report):
    assert report["device"] in ("cpu", "cuda")
    assert os.environ.get("TRITON_INTERPRET") == _INTERPRET_AT_IMPORT, "the child's setting leaked into pytest"


def test_plan_falls_back_to_one_partition_for_big_batches():
    """Llama-3-8B layer (8 kv heads) on a 132-SM GPU: a batch big enough fills the SMs alone, batch
    32 splits; partitions never get shorter than MIN_PARTITION_TILES tiles and cover the context."""
    from inflight.model.triton_attention import MIN_PARTITION_TILES, PROGRAMS_PER_SM, plan_decode

    filling = -(-PROGRAMS_PER_SM * 132 // 8)
    assert plan_decode(filling, 8, 128, 4096, 132).num_partitions == 1
    assert plan_decode(filling // 2, 8, 128, 4096, 132).num_partitions == 2
    assert plan_decode(32, 8, 128, 4096, 132).num_partitions > 1
    assert plan_decode(32, 8, 128, 128, 132).num_partitions == 1  # too short to be worth splitting
    for batch in (1, 8, 32, 64, 128, 256):
        for ctx in (1, 100, 512, 1000, 4096, 32768):
            plan = plan_decode(batch, 8, 128, ctx, 132)
            assert plan.partition_size % plan.block_n == 0
            assert plan.num_partitions * plan.partition_size >= ctx > (plan.num_partitions - 1) * plan.partition_size
            if plan.split:
                assert plan.partition_size >= MIN_PARTITION_TILES * plan.block_n


def test_plan_honours_a_given_partition_size():
    from inflight.model.triton_attention import plan_decode

    a = plan_decode(4, 2, 32, 100, 1, partition_size=32, block_n=16)
    b = plan_decode(4, 2, 32, 100, 1, partition_size=17, block_n=32)  # rounded up to one tile of 32
    assert (a.partition_size, a.num_partitions) == (b.partition_size, b.num_partitions) == (32, 4)
    assert plan_decode(4, 2, 32, 100, 1, partition_size=40, block_n=16).partition_size == 48
    assert plan_decode(4, 2, 32, 100, 1, partition_size=1000).num_partitions == 1
    with pytest.raises(ValueError, match="partition_size"):
        plan_decode(4, 2, 32, 100, 1, partition_size=0)
    with pytest.raises(ValueError, match="block_n"):
        plan_decode(4, 2, 32, 100, 1, block_n=24)


def _bad_input_errors(device: str) -> dict:
    """Executed in the child: the error each malformed call raises (type name and message)."""
    import torch

    from inflight.model.triton_attention import paged_decode_attention

    kc = torch.randn(4, 16, 4, 32, device=device)
    bt = torch.zeros(2, 2, dtype=torch.int32, device=device)
    cl = torch.ones(2, dtype=torch.int32, device=device)
    q = torch.randn(2, 8, 32, device=device)
    calls = {
        "gqa": ((torch.randn(2, 6, 32, device=device), kc, kc, bt, cl), {}),
        "int32": ((q, kc, kc, bt.long(), cl), {}),
        "head_dim": ((torch.randn(2, 8, 16, device=device), kc, kc, bt, cl), {}),
        "dtype": ((q.half(), kc, kc, bt, cl), {}),
        "partition_size": ((q, kc, kc, bt, cl), {"partition_size": -5}),
        "block_n": ((q, kc, kc, bt, cl), {"block_n": 48}),
    }
    out = {}
    for name, (args, kwargs) in calls.items():
        try:
            paged_decode_attention(*args, **kwargs)
            out[name] = ["no error", ""]
        except Exception as exc:
            out[name] = [type(exc).__name__, str(exc)]
    return out


@pytest.mark.parametrize("name,error,words", [
    ("gqa", "ValueError", "multiple of kv_heads"),
    ("int32", "TypeError", "int32"),
    ("head_dim", "ValueError", "head_dim"),
    ("dtype", "TypeError", "dtype"),
    ("partition_size", "ValueError", "partition_size"),
    ("block_n", "ValueError", "block_n"),
])
def test_bad_inputs_are_named(report, name, error, words):
    got_error, message = report["bad_inputs"][name]
    assert got_error == error and words in message, (got_error, message)


if __name__ == "__main__":
    print(json.dumps(_run_checks()))
