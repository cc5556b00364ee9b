"""One streamed request to an OpenAI-compatible server, timed from the client (vLLM's
`vllm/benchmarks/lib/endpoint_request_func.py`). A pure HTTP client: it imports no engine code, so
it measures any server — this book's, `transformers serve`, or `vllm serve` on a GPU.

Timing is per *token*, not per chunk: a chunk may carry several tokens (a server merges them when
the client reads slower than the engine writes, and holds back a half-written character). Every
token arrives when its chunk does, so a chunk of k tokens after a gap g gives the inter-token
latencies g, 0, ..., 0: the stall stays visible in the percentiles, and the mean over a request is
its TPOT. The tokens in a chunk come from the server's running usage
(`stream_options.continuous_usage_stats`, which this server and vLLM send); where a server sends
none, each chunk with text counts as one token.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RequestResult", "send_request", "stream_payload"]


@dataclass
class RequestResult:
    """What the client saw of one request (seconds, on `time.perf_counter()`'s clock)."""

    success: bool = False
    prompt_len: int = 0
    output_len: int = 0
    ttft: float = 0.0                  # from sending the request to its first token
    itl: list[float] = field(default_factory=list)  # one per token after the first
    latency: float = 0.0               # from sending to the last byte
    start_time: float = 0.0            # when it was sent (after any client-side queueing)
    client_queue_time: float = 0.0     # waiting for a --max-concurrency slot, before sending
    generated_text: str = ""
    error: str = ""
    finish_reason: str | None = None
    cancelled: bool = False            # the client hung up on purpose (chaos runs)
    status: int = 0


def stream_payload(model: str, prompt: Any, max_tokens: int, *, chat: bool = False, ignore_eos: bool = True,
                   extra: dict | None = None) -> dict:
    """The JSON body of a streamed greedy request."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True
    body.update(extra or {})
    return body


async def send_request(client: Any, url: str, payload: dict, *, headers: dict | None = None,
                       hang_up_after_chunks: int | None = None, read_delay_s: float = 0.0) -> RequestResult:
    """POST `payload` to `url` and read its Server-Sent Events. `hang_up_after_chunks` closes the
    connection after that many chunks (0: before the first); `read_delay_s` sleeps before each
    chunk is read (a slow reader)."""
    res = RequestResult(start_time=time.perf_counter())
    last = res.start_time
    n_tokens, text = 0, []
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as response:
            res.status = response.status_code
            if response.status_code != 200:
                res.error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')[:300]}"
                return res
            chunks, done = 0, False
            async for line in response.aiter_lines():
                if hang_up_after_chunks is not None and chunks >= hang_up_after_chunks:
                    res.cancelled = True
                    return res  # leaving the block closes the connection mid-stream
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunks += 1
                if read_delay_s:
                    await asyncio.sleep(read_delay_s)
                now = time.perf_counter()
                n_tokens, last = _take_chunk(json.loads(data), res, text, n_tokens, now, last)
                if res.error:
                    return res
    except Exception as exc:  # noqa: BLE001 - a failed request is a result, not a crash of the benchmark
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    res.latency = time.perf_counter() - res.start_time
    res.output_len, res.generated_text = max(n_tokens, res.output_len), "".join(text)
    if res.finish_reason in ("abort", "error"):  # the server gave up on it (shutting down, a failed step)
        res.error = f"the server ended the stream with finish_reason {res.finish_reason!r}"
    elif not done and res.finish_reason is None:  # the connection ended cleanly, but the answer did not
        res.error = f"the stream ended before its finish_reason and [DONE], after {n_tokens} token(s)"
    res.success = n_tokens > 0 and not res.error
    if not res.success and not res.error:
        res.error = "the stream ended without a token"
    return res


def _take_chunk(chunk: dict, res: RequestResult, text: list[str], n_tokens: int, now: float,
                last: float) -> tuple[int, float]:
    """Account for one chunk: its text, its tokens' times; returns (tokens so far, time of the last token)."""
    if "error" in chunk:
        res.error = str(chunk["error"].get("message", chunk["error"]))
        return n_tokens, last
    usage = chunk.get("usage") or None
    if usage:
        res.prompt_len = usage.get("prompt_tokens", res.prompt_len)
    choices = chunk.get("choices") or []
    if not choices:  # the last chunk with the usage only: it carries no token
        res.output_len = max(res.output_len, (usage or {}).get("completion_tokens", 0))
        return n_tokens, last
    c = choices[0]
    piece = (c.get("text") if "text" in c else (c.get("delta") or {}).get("content")) or ""
    res.finish_reason = c.get("finish_reason") or res.finish_reason
    if usage and usage.get("completion_tokens") is not None:
        k = usage["completion_tokens"] - n_tokens
    else:
        k = 1 if piece else 0
    text.append(piece)
    if k > 0:
        if n_tokens == 0:
            res.ttft = now - res.start_time
            res.itl.extend([0.0] * (k - 1))
        else:
            res.itl.extend([now - last] + [0.0] * (k - 1))
        n_tokens, last = n_tokens + k, now
    return n_tokens, last
