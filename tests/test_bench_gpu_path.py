"""The GPU benchmark's pieces, on a CPU: the half-precision agreement policy (bf16 runs on CPU
torch), the SmolLM2-135M shape, the results file name, and the command `.ci/gpu` runs, at a tiny size."""
import json

import pytest
import torch

from inflight.bench.offline import agreement
from inflight.bench.__main__ import main, results_path
from inflight.bench.offline.models import SHAPES, random_model
from inflight.bench.offline.prompts import make_workload
from inflight.model.generate import decode_static_batch
from inflight.model.kv_cache import KVCache
from inflight.model.llama import LlamaConfig, LlamaModel

torch.set_num_threads(1)


def test_policy_by_dtype():
    assert agreement.policy_for(torch.float32)["policy"] == "exact_tokens"
    bf = agreement.policy_for(torch.bfloat16)
    assert bf["policy"] == "teacher_forced_logprobs" and bf["tolerance_nats"] > 0 and bf["tolerance_relative"] > 0
    assert agreement.policy_for(torch.float16, tolerance=0.5)["tolerance_nats"] == 0.5
    with pytest.raises(ValueError, match="tolerance"):
        agreement.policy_for(torch.bfloat16, tolerance=0)


def _sequential(model, workload):
    """Greedy tokens of each request alone (the sequential reference)."""
    max_len = max(len(r.prompt) + r.output_len for r in workload.requests)
    cache = KVCache.for_model(model.config, num_blocks=1, block_size=max_len, dtype=model.dtype)
    return {r.id: decode_static_batch(model, cache, [r.prompt], [r.output_len])[0] for r in workload.requests}


@torch.inference_mode()
def test_teacher_forcing_accepts_the_reference_and_refuses_a_broken_mode():
    model = random_model(0).to(torch.bfloat16)
    w = make_workload("long_tailed", 4, 0, model.config.vocab_size, max_context=64, prompt_range=(4, 12),
                      output_mean=6, output_cap=12)
    policy = agreement.policy_for(torch.bfloat16)
    ref = _sequential(model, w)
    ok = agreement.teacher_forced_deviation(model, w, ref, policy)
    assert ok["passed"] and ok["tokens"] == sum(r.output_len for r in w.requests)
    assert ok["max_deviation_nats"] <= policy["tolerance_nats"] + 1  # near-ties only
    assert agreement.describe_failure(ok) is None
    broken = {rid: [(t + 1) % model.config.vocab_size for t in toks] for rid, toks in ref.items()}  # every token off
    bad = agreement.teacher_forced_deviation(model, w, broken, policy)
    assert not bad["passed"] and bad["share_argmax_differs"] > 0.9 and bad["tokens_beyond_tolerance"] > 0
    assert "tolerance" in agreement.describe_failure(bad)
    short = agreement.teacher_forced_deviation(model, w, {k: v[:-1] for k, v in ref.items()}, policy)
    assert not short["passed"] and "fewer tokens" in agreement.describe_failure(short)


def test_smollm2_shape():
    with torch.device("meta"):
        model = LlamaModel(LlamaConfig(**SHAPES["smollm2-135m-shape"]))
    assert model.config.head_dim == 64 and model.config.num_key_value_heads == 3
    assert 134e6 < model.num_parameters() < 135e6  # SmolLM2-135M: 134.5M with tied embeddings


def test_results_path(tmp_path, monkeypatch):
    import inflight.bench.kernels.attention as attention

    monkeypatch.setattr(attention, "device_name", lambda device=None: "h200")
    assert results_path(str(tmp_path), "cuda:0") == tmp_path / "bench_gpu_h200.json"
    assert results_path(str(tmp_path / "new") + "/", "cpu") == tmp_path / "new" / "bench_cpu.json"
    assert results_path(str(tmp_path / "x.json"), "cuda:0") == tmp_path / "x.json"


def test_gpu_command_path_on_cpu(tmp_path, capsys):
    """`.ci/gpu`'s serving command with `--device cpu` and a tiny size: bf16, the engine against
    both transformers peers, each checked by teacher forcing, the decode-step section, the targets."""
    main(["--quick", "--device", "cpu", "--dtype", "bfloat16", "-n", "4", "-B", "2", "--modes", "4,5",
          "--workload", "long_tailed", "--no-attention-bench", "--no-prefix-bench", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "bench_cpu.json").read_text())
    assert res["agreement_policy"]["policy"] == "teacher_forced_logprobs"
    modes = res["workloads"]["long_tailed"]["modes"]
    assert "sequential" not in modes  # in half precision the reference is teacher-forced, not re-run
    for m in ("paged", "hf_static", "hf_continuous"):
        assert modes[m]["status"] == "ok", modes[m]
        assert modes[m]["agreement"]["passed"] and modes[m]["agreement"]["tokens"] > 0
    assert res["decode_step"]["status"] == "ok" and res["decode_step"]["results"]["eager_ms"] > 0
    assert {"paged_1.5x_work_bound_ideal_over_hf_static", "paged_15x_hf_continuous"} <= set(res["targets"])
    assert "teacher-forced" in capsys.readouterr().out
