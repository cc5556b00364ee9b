"""lm-evaluation-harness (`pip install "lm_eval[api]"`, not a dependency of the project: skipped
where it is absent) as the real client of `echo` + `logprobs`: its `local-completions` model scores
a local multiple-choice task (log-likelihood requests: the prompt echoed with its tokens'
log-probabilities) against the server, and every log-likelihood it reports equals the model's dense
forward pass over the same tokens. Nothing is downloaded: the task and its data are written here."""
from __future__ import annotations

import json

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("tenacity")
pytest.importorskip("fastapi")

from serve_helpers import InProcessServer, tiny_engine  # noqa: E402

DOCS = [{"question": "def add(a, b):\n    return a", "choices": ["+ b", "- b", "* b", "/ b"], "answer": 0},
        {"question": "for i in range(", "choices": ["10):", "ten]:", "x y z", "!!!"], "answer": 0},
        {"question": "The cat sat on the", "choices": [" mat.", " xq!", " 123"], "answer": 0}]
TASK = """task: inflight_local_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def test_local_completions_log_likelihoods_are_the_models(tiny, tmp_path):
    from lm_eval.tasks import TaskManager

    from inflight.model.loading import TINY_PATH

    (tmp_path / "data.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "inflight_mc.yaml").write_text(TASK.format(data=tmp_path / "data.jsonl"))
    model, tok = tiny
    srv = InProcessServer(tiny_engine(tiny, num_blocks=64, max_batch_size=8))
    try:
        res = lm_eval.simple_evaluate(
            model="local-completions", tasks=["inflight_local_mc"], log_samples=True,
            model_args=f"model={srv.model},base_url={srv.base}/v1/completions,tokenizer={TINY_PATH},"
                       "tokenizer_backend=huggingface,num_concurrent=1,max_retries=1,tokenized_requests=True",
            task_manager=TaskManager(include_path=str(tmp_path)))
    finally:
        srv.stop()
    assert 0 <= res["results"]["inflight_local_mc"]["acc,none"] <= 1
    scored = 0
    with torch.no_grad():
        for s in res["samples"]["inflight_local_mc"]:
            for choice, resp in zip(s["doc"]["choices"], s["resps"]):
                ids = tok.encode(s["doc"]["question"] + choice)
                k = len(choice.encode())  # (the tiny model's tokenizer: one token per byte)
                lp = torch.log_softmax(model.forward_dense(torch.tensor([ids]))[0].float(), -1)
                want = sum(lp[p - 1, ids[p]].item() for p in range(len(ids) - k, len(ids)))
                assert resp[0][0] == pytest.approx(want, abs=1e-3)
                scored += 1
    assert scored == sum(len(d["choices"]) for d in DOCS)
