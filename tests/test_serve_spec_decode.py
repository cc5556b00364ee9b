"""`python -m inflight.serve --speculative-config '{...}'`: the same greedy text as the offline engine
without speculation, vLLM's spec_decode counters in /metrics, and a bad config refused at start."""
import json
import subprocess
import sys

from serve_helpers import ROOT, ServerProcess

from inflight import LLMEngine, SamplingParams


def test_server_speculates_and_reports_it(tiny):
    model, tok = tiny
    prompt = "def read_lines(path):\n"
    want = LLMEngine(model, tokenizer=tok).generate([prompt], SamplingParams(max_tokens=48), use_tqdm=False)[0].text
    srv = ServerProcess("--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 4}))
    try:
        status, _, body = srv.request("POST", "/v1/completions", {"model": srv.model, "prompt": prompt,
                                                                  "max_tokens": 48, "temperature": 0})
        assert status == 200, body
        assert json.loads(body)["choices"][0]["text"] == want
        assert srv.metric("spec_decode_num_draft_tokens_total") > 0
        accepted = srv.metric("spec_decode_num_accepted_tokens_total")
        assert accepted > 0
        assert sum(srv.metric("spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(4)) == accepted
    finally:
        srv.stop()


def test_server_refuses_a_bad_speculative_config():
    for bad, word in (('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
                      ("not json", "JSON"), ('{"method": "medusa", "num_speculative_tokens": 2}', "method")):
        p = subprocess.run([sys.executable, "-m", "inflight.serve", "--port", "0", "--speculative-config", bad],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and word in p.stderr, p.stderr
