"""The Triton paged-decode kernel against a plain-torch reference: block sizes 8/16/32, ragged
context lengths, GQA ratios, scrambled block tables, fp32/fp16/bf16.

Without a GPU the kernel runs under Triton's CPU interpreter, which must be switched on
(`TRITON_INTERPRET=1`) before triton is imported. So that the setting cannot leak into other
tests, every check runs in ONE child process (this file run as a script); pytest only reads its
JSON report. On a CUDA machine the child runs the real kernel on the GPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_INTERPRET_AT_IMPORT = os.environ.get("TRITON_INTERPRET")

# (name, block_size, num_heads, kv_heads, head_dim, context_lens, dtype)
CONFIGS = [
    ("mha-bs8-fp32", 8, 4, 4, 32, [1, 8, 9, 57], "float32"),
    ("gqa2-bs16-fp32", 16, 8, 4, 64, [16, 17, 100, 3], "float32"),
    ("gqa4-bs32-fp16", 32, 8, 2, 32, [33, 1, 64, 95, 128], "float16"),
    ("mqa-bs16-bf16", 16, 8, 1, 16, [5, 77, 48], "bfloat16"),
    ("gqa8-bs8-fp16-d48", 8, 16, 2, 48, [130, 2, 31], "float16"),
    ("gqa3-bs32-fp32", 32, 6, 2, 32, [200, 63], "float32"),
    ("empty-context", 16, 4, 2, 32, [0, 20], "float32"),
    ("contiguous-bs50", 50, 4, 2, 32, [50, 7, 33], "float32"),  # a contiguous cache: one block of max length
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
    import torch
    from inflight.model.attention import paged_attention
    from inflight.model.attention_metadata import AttentionMetadata

    S = q.shape[0]
    meta = AttentionMetadata.build([1] * S, context_lens.tolist(),
                                   [row.tolist() for row in block_tables], k_cache.shape[1], q.device)
    return paged_attention(q, k_cache, v_cache, meta, scale).float()


def _run_checks() -> dict:
    """Executed in the child process: every config, both references; returns max errors."""
    import torch

    from inflight.model.triton_attention import paged_decode_attention

    device = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    torch.manual_seed(0)
    report = {"device": device, "results": {}, "package_reference": None}
    try:
        package_reference  # noqa: B018
        from inflight.model.attention import paged_attention  # noqa: F401
        from inflight.model.attention_metadata import AttentionMetadata  # noqa: F401
        report["package_reference"] = "available"
    except Exception as exc:  # the other helper's module may not exist yet
        report["package_reference"] = f"unavailable: {type(exc).__name__}: {exc}"
    for name, bs, H, kvh, D, lens, dtype in CONFIGS:
        dt = getattr(torch, dtype)
        S = len(lens)
        max_blocks = max(1, max(-(-n // bs) for n in lens))
        num_blocks = S * max_blocks + 5
        k_cache = torch.randn(num_blocks, bs, kvh, D).to(dt)
        v_cache = torch.randn(num_blocks, bs, kvh, D).to(dt)
        q = torch.randn(S, H, D).to(dt)
        # scrambled block tables: each sequence gets random, non-contiguous, non-sorted blocks
        block_tables = torch.randperm(num_blocks)[: S * max_blocks].reshape(S, max_blocks).to(torch.int32)
        context_lens = torch.tensor(lens, dtype=torch.int32)
        scale = D ** -0.5
        args = [t.to(device) for t in (q, k_cache, v_cache, block_tables, context_lens)]
        out = paged_decode_attention(*args, scale).cpu()
        entry = {"shape_ok": tuple(out.shape) == (S, H, D) and out.dtype == dt,
                 "err_gather": (out.float() - gather_reference(q, k_cache, v_cache, block_tables, context_lens, scale)).abs().max().item()}
        if report["package_reference"] == "available" and min(lens) > 0:  # a decode step has >= 1 token
            try:
                ref = package_reference(*args, scale).cpu()
                entry["err_package"] = (out.float() - ref).abs().max().item()
            except Exception as exc:
                entry["err_package"] = f"{type(exc).__name__}: {exc}"
        report["results"][name] = entry
    # non-contiguous cache views (a layer slice of a bigger tensor) go through strides
    big = torch.randn(2, 12, 16, 2, 32)
    k_view, v_view = big[0], big[1]
    q = torch.randn(2, 4, 32)
    bt = torch.randperm(12)[:8].reshape(2, 4).to(torch.int32)
    cl = torch.tensor([50, 64], dtype=torch.int32)
    out = paged_decode_attention(*(t.to(device) for t in (q, k_view, v_view, bt, cl)), 0.17).cpu()
    report["results"]["strided-views"] = {"shape_ok": True, "err_gather": (out - gather_reference(q, k_view, v_view, bt, cl, 0.17)).abs().max().item()}
    # the benchmark's code path (timing with the wall clock here, CUDA events on a GPU), tiny sizes
    from inflight.bench.attention import kernel_benchmark

    rows = kernel_benchmark(batches=(2,), contexts=(40,), num_heads=4, kv_heads=2, head_dim=16, dtype="float32",
                            device=device, repeats=1)
    report["bench_rows"] = rows
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


@pytest.mark.parametrize("name", [c[0] for c in CONFIGS])
def test_kernel_matches_gather_reference(report, name):
    entry = report["results"][name]
    dtype = next(c[6] for c in CONFIGS if c[0] == name)
    assert entry["shape_ok"]
    assert entry["err_gather"] < TOL[dtype], entry


@pytest.mark.parametrize("name", [c[0] for c in CONFIGS])
def test_kernel_matches_package_reference(report, name):
    if report["package_reference"] != "available":
        pytest.skip(f"inflight.model.attention.paged_attention {report['package_reference']}")
    dtype = next(c[6] for c in CONFIGS if c[0] == name)
    if "err_package" not in report["results"][name]:
        pytest.skip("an empty context is not a decode step for the reference")
    err = report["results"][name]["err_package"]
    assert isinstance(err, float), err
    assert err < TOL[dtype]


def test_strided_cache_views(report):
    assert report["results"]["strided-views"]["err_gather"] < 1e-4


def test_benchmark_code_path_runs(report):
    (row,) = report["bench_rows"]
    assert row["max_abs_err_vs_sdpa"] < 1e-4
    assert row["triton_ms"] > 0 and row["sdpa_ms"] > 0 and row["triton_gbs"] > 0
    assert row.get("torch_paged_ms") is None or row["torch_paged_ms"] > 0


def test_interpreter_did_not_leak_into_this_process(report):
    assert report["device"] in ("cpu", "cuda")
    assert os.environ.get("TRITON_INTERPRET") == _INTERPRET_AT_IMPORT, "the child's setting leaked into pytest"


def _bad_input_errors(device: str) -> dict:
    """Executed in the child: the error each malformed call raises (type name and message)."""
    import torch

    from inflight.model.triton_attention import paged_decode_attention

    kc = torch.randn(4, 16, 4, 32, device=device)
    bt = torch.zeros(2, 2, dtype=torch.int32, device=device)
    cl = torch.ones(2, dtype=torch.int32, device=device)
    calls = {
        "gqa": (torch.randn(2, 6, 32, device=device), kc, kc, bt, cl),
        "int32": (torch.randn(2, 8, 32, device=device), kc, kc, bt.long(), cl),
        "head_dim": (torch.randn(2, 8, 16, device=device), kc, kc, bt, cl),
        "dtype": (torch.randn(2, 8, 32, device=device).half(), kc, kc, bt, cl),
    }
    out = {}
    for name, args in calls.items():
        try:
            paged_decode_attention(*args)
            out[name] = ["no error", ""]
        except Exception as exc:
            out[name] = [type(exc).__name__, str(exc)]
    return out


@pytest.mark.parametrize("name,error,words", [
    ("gqa", "ValueError", "multiple of kv_heads"),
    ("int32", "TypeError", "int32"),
    ("head_dim", "ValueError", "head_dim"),
    ("dtype", "TypeError", "dtype"),
])
def test_bad_inputs_are_named(report, name, error, words):
    got_error, message = report["bad_inputs"][name]
    assert got_error == error and words in message, (got_error, message)


if __name__ == "__main__":
    print(json.dumps(_run_checks()))
