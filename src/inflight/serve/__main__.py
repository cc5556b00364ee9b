"""`python -m inflight.serve`: an OpenAI-compatible server over the engine (flags named as in `vllm serve`).

    python -m inflight.serve                       # the shipped tiny model on http://127.0.0.1:8000/v1
    python -m inflight.serve --model PATH_OR_HUB_ID --port 8001 --max-num-seqs 32 --enable-prefix-caching
    python -m inflight.serve --tensor-parallel-size 2  # the model split over two worker processes

It prints `inflight: serving MODEL at URL` once it accepts requests (with `--port 0`, a free port
the system picks). Ctrl-C or SIGTERM aborts what is in flight (each stream ends with
finish_reason "abort"), waits for the engine loop, and exits.
"""
from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
from typing import Any

__all__ = ["main", "parse_args", "build_engine", "run_server"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m inflight.serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a checkpoint folder or hub id load_pretrained reads "
                   "(default: the shipped tiny model)")
    p.add_argument("--served-model-name", default=None, help="the model name clients send (default: inflight-tiny, or --model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback: only this machine)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 endpoints")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="refuse requests (503 + Retry-After) while this many are already waiting")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body accepted")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=None, help="KV blocks in the pool (default: sized from memory)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="the most requests in one batch")
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--no-enable-chunked-prefill", dest="enable_chunked_prefill", action="store_false")
    p.add_argument("--enable-prefix-caching", action="store_true")
    p.add_argument("--preemption-mode", choices=("recompute", "swap"), default="recompute")
    p.add_argument("--speculative-config", default=None, type=_json_object,
                   help='speculative decoding, as JSON with vLLM\'s keys: \'{"method": "ngram", '
                        '"num_speculative_tokens": 4}\' or \'{"method": "draft_model", "model": '
                        '"inflight-tiny-draft", "num_speculative_tokens": 4}\' (chapter 12)')
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="split the model over this many worker processes (tensor parallelism: gloo on CPU, "
                        "one GPU each on CUDA)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when there is one)")
    p.add_argument("--threads", type=int, default=None, help="torch threads for the engine loop (default: the policy "
                   "of inflight.threads)")
    p.add_argument("--engine-loop", choices=("thread", "task"), default="thread",
                   help="run the engine loop on its own thread (default) or as an asyncio task")
    p.add_argument("--stream-interval", type=int, default=1,
                   help="send a request's tokens once it has this many new ones (or has ended); 1: every token")
    p.add_argument("--switch-interval-ms", type=float, default=1.0,
                   help="how long a Python thread may hold the GIL while another waits (Python's default is 5): "
                        "the event loop then waits less for the engine loop's thread to write a token out")
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug", "trace"),
                   help="uvicorn's log level, and the server's own (fields it ignored: warning)")
    args = p.parse_args(argv)
    # a setting that would make every request fail (--max-waiting 0: all refused; an empty key) is refused
    # here, at once, before a model is loaded; the engine's own knobs are checked by LLMEngine
    if not 0 <= args.port <= 65535:
        p.error(f"--port must be between 0 and 65535, got {args.port}")
    for flag, value in (("--max-waiting", args.max_waiting), ("--max-body-bytes", args.max_body_bytes),
                        ("--stream-interval", args.stream_interval), ("--tensor-parallel-size", args.tensor_parallel_size)):
        if value is not None and value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    if args.api_key is not None and not args.api_key.strip():
        p.error("--api-key must not be empty (leave it out to serve without a key)")
    if not args.switch_interval_ms > 0:
        p.error(f"--switch-interval-ms must be > 0, got {args.switch_interval_ms}")
    return args


def _json_object(text: str) -> dict:
    """--speculative-config's value: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(value).__name__}")
    return value


def build_engine(args: argparse.Namespace) -> tuple[Any, str]:
    """The `LLMEngine` the flags describe, and the model name it is served as."""
    from inflight.engine.llm_engine import LLMEngine
    from inflight.model.loading import load_pretrained, load_tiny

    knobs = dict(block_size=args.block_size, num_blocks=args.num_blocks,
                 max_batch_size=args.max_num_seqs, max_batched_tokens=args.max_num_batched_tokens,
                 enable_chunked_prefill=args.enable_chunked_prefill, preemption=args.preemption_mode,
                 enable_prefix_caching=args.enable_prefix_caching, max_model_len=args.max_model_len, seed=args.seed,
                 speculative_config=getattr(args, "speculative_config", None))
    if args.tensor_parallel_size > 1:  # the driver keeps the scheduler; N workers hold the model's shards
        from inflight.model.loading import TINY_PATH

        engine = LLMEngine.from_pretrained(TINY_PATH if args.model is None else args.model,
                                           tensor_parallel_size=args.tensor_parallel_size,
                                           device=args.device or ("cpu" if args.model is None else None), **knobs)
        return engine, args.served_model_name or ("inflight-tiny" if args.model is None else args.model)
    if args.model is None:
        model, tokenizer = load_tiny(device=args.device or "cpu")
        name = "inflight-tiny"
    else:
        model, tokenizer = load_pretrained(args.model, device=args.device, with_tokenizer=True)
        name = args.model
    engine = LLMEngine(model, tokenizer=tokenizer, **knobs)
    return engine, args.served_model_name or name


def run_server(args: argparse.Namespace) -> int:
    import uvicorn

    from inflight.serve.api_server import build_app
    from inflight.serve.async_engine import AsyncEngine
    from inflight.serve.framing import json_400_protocol
    from inflight.serve.metrics import ServerMetrics
    from inflight.threads import configure_threads
    from inflight.engine.executor import WorkerError
    from inflight.engine.gc_heap import freeze_gc_heap

    try:  # a model that cannot load, an engine setting it refuses, an address that cannot be bound: one line
        threads = configure_threads(args.threads).threads  # (the engine loop's thread takes the same count)
        sys.setswitchinterval(args.switch_interval_ms / 1000)
        engine, name = build_engine(args)
        sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((args.host, args.port))
        except OSError as exc:
            raise OSError(f"cannot listen on {args.host}:{args.port}: {exc}") from None
    except (ValueError, TypeError, OSError, WorkerError) as exc:  # (FileNotFoundError is an OSError)
        print(f"python -m inflight.serve: error: {exc}", file=sys.stderr)
        return 2
    metrics = ServerMetrics(name, engine.speculator.k)
    aengine = AsyncEngine(engine, loop=args.engine_loop, observer=metrics, threads=threads,
                          stream_interval=args.stream_interval)
    sock.listen(2048)  # connections that come before uvicorn accepts (it starts after "ready") wait in the backlog
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/v1"

    def ready() -> None:
        print(f"inflight: serving {name} at {url}", flush=True)

    app = build_app(aengine, metrics, model_name=name, api_key=args.api_key, max_waiting=args.max_waiting,
                    max_body_bytes=args.max_body_bytes, on_ready=ready)
    _log_to_stderr(args.log_level)
    config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=10, http=json_400_protocol())
    server = _server(config, aengine, engine)
    # this process is the server's own: what it built to serve is here to stay, out of the garbage
    # collector's full passes (`inflight.engine.gc_heap`; vLLM's API server does the same at startup)
    freeze_gc_heap()
    try:
        server.run(sockets=[sock])
    finally:  # (tensor parallelism: the worker processes end with the server)
        engine.shutdown()
    return 0


def _log_to_stderr(level: str) -> None:
    """The server's own log lines (`inflight.serve`: fields it ignored) on stderr, at uvicorn's level."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:  inflight: %(message)s"))
    log = logging.getLogger("inflight.serve")
    log.addHandler(handler)
    log.setLevel(level.upper())
    log.propagate = False


def _server(config: Any, aengine: Any, engine: Any = None) -> Any:
    """uvicorn's server, told to end the engine's requests as soon as a shutdown signal comes (so
    open streams finish with "abort" instead of holding the shutdown until they are done), and to
    stop the engine's worker processes once it has shut down (tensor parallelism) — before uvicorn
    re-raises the signal it caught, which ends the process at once."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            aengine.stop()
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets: Any = None) -> None:
            try:
                await super().shutdown(sockets)
            finally:
                if engine is not None:
                    engine.shutdown()

    return Server(config)


def main(argv: list[str] | None = None) -> int:
    return run_server(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
