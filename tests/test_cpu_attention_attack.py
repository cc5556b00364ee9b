"""Adversarial checks of the C decode kernel (`inflight.model.cpu_attention`): inputs the wrapper lets
through to C unchecked, and damaged or foreign libraries in the build cache. Cases that crash the
interpreter (SIGSEGV / SIGBUS / SIGILL) run in a child process, so that a failure is a failed test,
not a dead test session."""
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from inflight.model import c_build, cpu_attention
from test_kv_cache_attention import _naive, _random_batch

needs_kernel = pytest.mark.skipif(cpu_attention.load() is None, reason=f"no C kernel here: {cpu_attention.build_error()}")
SRC_ROOT = str(Path(cpu_attention.__file__).resolve().parents[2])  # the `src` folder this package came from


def _child(code: str, cache: Path, **env) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter on the same sources, with its own kernel cache folder."""
    e = dict(os.environ, PYTHONPATH=SRC_ROOT, INFLIGHT_CACHE=str(cache), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True,
                          timeout=120)


def _cache_name(cc: str, flags: list[str]) -> str:
    """The file name the loader gives a build (its key: source, compiler, flags, machine, CPU)."""
    return c_build.library_path(cpu_attention.SOURCE, [cc], flags).name


# -- inputs the wrapper passes to C without checking ------------------------------------------------

@needs_kernel
def test_a_v_cache_of_another_dtype_is_refused_not_misread():
    """supports() checks q's dtype and k_cache's, never v_cache's: a float64 value cache is read as
    float32 bit patterns and the call returns garbage without complaint."""
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(0), [1, 1], [5, 9], 4, 2, 2, 8)
    with pytest.raises((ValueError, RuntimeError)):
        cpu_attention.paged_decode_attention_cpu(q, kc, vc.double(), meta.block_tables, meta.context_lens, 0.5)


@needs_kernel
def test_a_half_precision_v_cache_does_not_crash_the_process(tmp_path):
    """The same hole as memory unsafety: a float16 value cache is half the bytes the C loop reads, so
    a table that points at the last blocks reads past the end of the allocation (SIGSEGV)."""
    r = _child("""
        import torch
        from inflight.model import cpu_attention as ca
        N, bs, D = 4096, 16, 64
        kc = torch.randn(N, bs, 1, D); vc = torch.randn(N, bs, 1, D).half()
        try:
            ca.paged_decode_attention_cpu(torch.randn(1, 1, D), kc, vc, torch.tensor([[N - 1]], dtype=torch.int32),
                                          torch.tensor([16], dtype=torch.int32), 0.1)
            print("returned")
        except (ValueError, RuntimeError) as e:
            print("refused:", e)
        """, tmp_path)
    assert r.returncode == 0, f"the child died with {r.returncode}: {r.stderr[-500:]}"
    assert "refused" in r.stdout


@needs_kernel
def test_caches_on_another_device_are_refused_not_dereferenced(tmp_path):
    """supports() checks only q's device: caches that are not CPU tensors (here `meta`, whose
    data_ptr() is 0; on a GPU machine a CUDA cache) hand C a pointer it can't read (SIGSEGV)."""
    r = _child("""
        import torch
        from inflight.model import cpu_attention as ca
        kc = torch.empty(4, 4, 2, 8, device="meta")
        try:
            ca.paged_decode_attention_cpu(torch.randn(1, 4, 8), kc, kc, torch.tensor([[1]]), torch.tensor([3]), 0.5)
            print("returned")
        except (ValueError, RuntimeError, NotImplementedError) as e:
            print("refused:", e)
        """, tmp_path)
    assert r.returncode == 0, f"the child died with {r.returncode}: {r.stderr[-500:]}"
    assert "refused" in r.stdout


@needs_kernel
@pytest.mark.parametrize("which", ["block id", "context length"])
def test_int64_tables_beyond_int32_are_refused_not_wrapped(which):
    """`.to(torch.int32)` wraps int64 values silently: block 2**32 + b becomes block b and context
    2**32 + c becomes c, both in range, so the bounds check the C kernel promises never sees them."""
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(0), [1, 1], [5, 9], 4, 2, 2, 8)
    tables, lens = meta.block_tables.long(), meta.context_lens.long()
    if which == "block id":
        tables = tables + 2**32
    else:
        lens = lens + 2**32
    with pytest.raises(ValueError):
        cpu_attention.paged_decode_attention_cpu(q, kc, vc, tables, lens, 0.5)


# -- the build cache -----------------------------------------------------------------------------

@needs_kernel
def test_a_truncated_library_in_the_cache_is_not_a_crash(tmp_path):
    """The cache trusts any file at its key's path. A truncated .so (a disk that filled up, a crash
    before the rename reached the disk, a copied cache) kills every later process with SIGBUS inside
    dlopen, and keeps doing so until someone deletes the file."""
    load = "from inflight.model import cpu_attention as ca; lib = ca.load(); print('loaded', lib is not None)"
    assert _child(load, tmp_path).returncode == 0
    (so,) = tmp_path.glob("paged_decode-*.so")
    so.write_bytes(so.read_bytes()[:1000])
    r = _child(load, tmp_path)
    assert r.returncode == 0, f"the child died with {r.returncode}: {r.stderr[-500:]}"
    assert "loaded True" in r.stdout  # the damaged copy was found out, deleted and rebuilt
    assert so.stat().st_size > 1000


@needs_kernel
def test_a_library_without_the_kernel_in_the_cache_falls_back(tmp_path, monkeypatch):
    """`_build` catches OSError around CDLL/_declare, but a loadable .so lacking the symbols raises
    AttributeError, which escapes load() (and so the model's first forward) instead of falling back."""
    foreign = tmp_path / "foreign.c"
    foreign.write_text("int something_else(void) { return 1; }\n")
    target = tmp_path / _cache_name("cc", cpu_attention.FLAGS + ["-fopenmp"])
    subprocess.run(["cc", "-shared", "-fPIC", str(foreign), "-o", str(target)], check=True)
    monkeypatch.setattr(cpu_attention, "_library", cpu_attention._library.fresh())
    monkeypatch.setenv("INFLIGHT_CACHE", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    lib = cpu_attention.load()  # must not raise: a working library, or None with a reason
    assert lib is not None or cpu_attention.build_error()


def _has_avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # can't tell: don't run the SIGILL check


@needs_kernel
@pytest.mark.skipif(platform.machine() != "x86_64" or _has_avx512(), reason="needs an x86_64 host without AVX-512")
def test_a_library_built_for_another_cpu_in_a_shared_cache_is_not_used(tmp_path):
    """The key is source + compiler + flags + `platform.machine()`, but the flags say -march=native:
    an x86_64 host with AVX-512 sharing the cache folder (an NFS home, a baked container image, a
    CI cache) leaves a library that this host then loads and dies in with SIGILL."""
    flags = cpu_attention.FLAGS + ["-fopenmp"]
    other_host = [f for f in flags if f != "-march=native"] + ["-march=sapphirerapids"]
    target = tmp_path / _cache_name("cc", flags)  # where that host's build lands, for the current key
    if subprocess.run(["cc", *other_host, str(cpu_attention.SOURCE), "-o", str(target), "-lm"]).returncode:
        pytest.skip("this compiler can't target sapphirerapids")
    r = _child("""
        import torch
        from inflight.model import cpu_attention as ca
        q, kc = torch.randn(1, 1, 64), torch.randn(2, 16, 1, 64)
        if ca.load() is not None:
            print(ca.paged_decode_attention_cpu(q, kc, kc, torch.tensor([[1]]), torch.tensor([16]), 0.1).sum())
        """, tmp_path, CC="cc")
    assert r.returncode == 0, f"the child died with {r.returncode}: {r.stderr[-500:]}"


# -- what held up (kept as regression checks) --------------------------------------------------------

@needs_kernel
@pytest.mark.parametrize("D", [1, 3, 7, 9, 100])
@pytest.mark.parametrize("G, block_size", [(1, 1), (5, 7), (64, 256)])
def test_awkward_shapes_match_naive(D, G, block_size):
    ctx = [1, 3, 4, 5, 511, 512, 513]
    q, kc, vc, meta = _random_batch(torch.Generator().manual_seed(D * 100 + G), [1] * len(ctx), ctx, block_size, 1, G, D)
    out = cpu_attention.paged_decode_attention_cpu(q, kc, vc, meta.block_tables, meta.context_lens, 0.3)
    want = _naive(q.double(), kc.double(), vc.double(), meta, 0.3).float()
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
