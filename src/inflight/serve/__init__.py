"""Part VI: the server around the engine loop (`python -m inflight.serve`), laid out like vLLM's
`v1/engine/async_llm.py` + `entrypoints/openai/`:

- `output_collector` `RequestOutputCollector`: one pending delta per request, merged when the reader is slow
- `async_engine`     `AsyncEngine`: one stepping loop (a thread) fed through a queue; aborts; shutdown
- `fields`           every request field decided: OpenAI's, vLLM's and this server's behaviour, one table
- `protocol`         the request models built from it, and the checks of a request's body
- `responses`        the response and stream-chunk shapes, and the models that describe them
- `openapi`          /openapi.json: every endpoint's request and response bodies
- `api_server`       the FastAPI app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics
- `framing`          a JSON 400 for bytes uvicorn's HTTP parser refuses
- `metrics`          Prometheus metrics with vLLM's names under `inflight:`
- `__main__`         the command line (flags as in `vllm serve`) and uvicorn

It needs the `serve` extra (`pip install "inflight[serve]"`: fastapi, uvicorn, prometheus_client,
and the openai client the chapter uses). It imports the engine and the model layers, nothing above.
"""
