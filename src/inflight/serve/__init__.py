"""Part VI: the server around the engine loop (`python -m inflight.serve`), laid out like vLLM's
`v1/engine/async_llm.py` + `entrypoints/openai/`:

- `output_collector` `RequestOutputCollector`: one pending delta per request, merged when the reader is slow
- `async_engine`     `AsyncEngine`: one stepping loop (a thread) fed through a queue; aborts; shutdown
- `protocol`         OpenAI's request fields (checked) and response / stream-chunk shapes
- `api_server`       the FastAPI app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics
- `metrics`          Prometheus metrics with vLLM's names under `inflight:`
- `__main__`         the command line (flags as in `vllm serve`) and uvicorn

It needs the `serve` extra (`pip install "inflight[serve]"`: fastapi, uvicorn, prometheus_client,
and the openai client the chapter uses). It imports the engine and the model layers, nothing above.
"""
