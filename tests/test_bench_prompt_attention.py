"""`python -m inflight.bench.kernels.prompt_attention`: a prefill chunk's attention, the C kernel beside
another checkout's and the reference. No timing is asserted: only that each ran, what it compared, and
that the same source gives the same bits."""
import pytest
import torch

from inflight.bench.kernels import prompt_attention as pa
from inflight.model import cpu_attention

needs_kernel = pytest.mark.skipif(cpu_attention.load() is None, reason="no C compiler here")


@needs_kernel
def test_a_chunk_is_timed_for_every_implementation_and_their_bits_compared(model):
    same = pa._kernel_call(cpu_attention._library)  # "another checkout": the same source
    impls = {"c": pa._kernel_call(cpu_attention._library), "source": same,
             "torch": lambda q, k, v, meta, scale: cpu_attention.paged_decode_attention_cpu(
                 q, k, v, meta.token_batch.block_tables, meta.token_batch.context_lens, scale * 2)}
    r = pa.measure(model.config, [9, 20], impls, repeats=2)
    assert set(r["ms"]) == {"c", "source", "torch"} and min(r["ms"].values()) > 0
    cfg = model.config
    assert r["flops"] == 4 * cfg.num_attention_heads * cfg.head_dim * (9 * 10 // 2 + 20 * 21 // 2)
    # the same kernel gives the same bits; a different computation (here: another scale) does not
    assert r["same_bits_as_c"] == {"c": True, "source": True, "torch": False}


@needs_kernel
def test_the_chunk_is_every_prompt_from_position_zero_in_scattered_blocks(model):
    q, kv, meta = pa.chunk_inputs(model.config, [5, 40], block_size=4)
    assert q.shape[0] == 45 and meta.token_batch.context_lens.tolist() == list(range(1, 6)) + list(range(1, 41))
    tables = meta.token_batch.block_tables
    assert tables[4, :2].tolist() == tables[0, :2].tolist() and tables[5, 0] != tables[0, 0]  # one table a prompt
    used = set(tables[:5, :2].flatten().tolist()) | set(tables[5:, :10].flatten().tolist())
    assert len(used) == 12 and used != set(range(12))  # 2 + 10 blocks, not the first twelve in order


@needs_kernel
def test_the_run_compares_another_source_and_reports_it(tmp_path):
    src = tmp_path / "paged_decode.c"
    src.write_text(cpu_attention.SOURCE.read_text())
    for header in cpu_attention.SOURCE.parent.glob("*.h"):
        (tmp_path / header.name).write_text(header.read_text())
    res = pa.run(str(src), repeats=1)
    assert res["status"] == "ok" and set(res["chunks"]) == set(pa.CHUNKS)
    assert all(r["same_bits_as_c"]["source"] for r in res["chunks"].values())
    text = pa.report(res)
    assert text.count("same bits") == len(pa.CHUNKS) and "torch reference" in text
    assert "unavailable" in pa.report({"status": "unavailable", "reason": "no C compiler"})
    assert pa.run(str(tmp_path / "missing.c"), repeats=1)["status"] == "unavailable"
