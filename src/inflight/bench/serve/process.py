"""Servers as separate processes, for the serving benchmarks: this book's (`python -m inflight.serve`)
and `transformers serve` (its continuous batching), each on a free loopback port, each in its own
process at its own settings; and the tiny model as a Hugging Face checkpoint with a tokenizer
`transformers` accepts (byte-level: the same token ids as `ByteTokenizer`, end-of-text first).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from inflight.threads import environment_for_child

__all__ = ["ServerHandle", "stop_process", "start_inflight", "start_transformers", "save_tiny_as_hf", "save_random_checkpoint",
           "free_port", "run_record", "save_result"]

READY_TIMEOUT_S = 300


def free_port() -> int:
    """A port nobody listens on now (for a server that cannot take --port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout: float) -> int | None:
    """End a child by its pid: SIGTERM (a server shuts down cleanly), SIGKILL if it is still there
    after `timeout` seconds; returns its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    return proc.returncode


class ServerHandle:
    """A server process and its base URL; `stop()` ends it (SIGTERM, then SIGKILL) by its pid."""

    def __init__(self, proc: subprocess.Popen, base_url: str, name: str, log: Path):
        self.proc, self.base_url, self.name, self.log = proc, base_url, name, log

    def stop(self, timeout: float = 60) -> int | None:
        return stop_process(self.proc, timeout)

    def rss_bytes(self) -> int:
        """The server's resident memory now (Linux /proc)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _wait_ready(proc: subprocess.Popen, base_url: str, log: Path, timeout: float = READY_TIMEOUT_S) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(base_url + "/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the server at {base_url} was not ready in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def start_inflight(args: Sequence[str] = (), log_dir: Path | None = None) -> ServerHandle:
    """`python -m inflight.serve ARGS --port 0`, ready."""
    log = Path(log_dir or "/tmp") / f"inflight-serve-{os.getpid()}-{time.monotonic_ns()}.log"
    out = log.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "inflight.serve", "--port", "0", *args], stdout=out,
                            stderr=subprocess.STDOUT, env=environment_for_child(PYTHONUNBUFFERED="1"))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not (m := re.search(r"at (http://\S+)/v1", log.read_text())):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"python -m inflight.serve did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    handle = ServerHandle(proc, m.group(1), "inflight", log)
    _wait_ready(proc, handle.base_url, log)
    return handle


def start_transformers(model_dir: Path, args: Sequence[str] = ("--continuous-batching",),
                       log_dir: Path | None = None) -> ServerHandle:
    """`transformers serve MODEL --device cpu ARGS` on a free loopback port, ready (offline: no hub)."""
    exe = shutil.which("transformers") or str(Path(sys.executable).with_name("transformers"))
    port = free_port()
    log = Path(log_dir or "/tmp") / f"transformers-serve-{os.getpid()}-{port}.log"
    # as if started by hand: not under our OpenMP settings (issue 24)
    env = environment_for_child(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([exe, "serve", str(model_dir), "--device", "cpu", "--host", "127.0.0.1",
                             "--port", str(port), *args], stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    handle = ServerHandle(proc, f"http://127.0.0.1:{port}", "transformers", log)
    _wait_ready(proc, handle.base_url, log)
    return handle


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (what a byte-level BPE vocabulary holds)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


EOT = "<|endoftext|>"


def _tokenizer_json(vocab: dict[str, int]) -> dict:
    """A `tokenizers` file: byte-level BPE without merges (one token per byte), end-of-text first."""
    eot = {"SpecialToken": {"id": EOT, "type_id": 0}}
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": 256, "content": EOT, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True}],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            "post_processor": {"type": "TemplateProcessing", "single": [eot, {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [eot, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {EOT: {"id": EOT, "ids": [256], "tokens": [EOT]}}},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": []}}


def save_tiny_as_hf(folder: Path) -> Path:
    """The shipped tiny model as a checkpoint `transformers` loads: its config (LlamaForCausalLM) and
    weights, and a byte-level tokenizer whose ids are the bytes (end-of-text = 256, put first, as
    `ByteTokenizer.encode_prompt` does). Returns the folder."""
    from transformers import PreTrainedTokenizerFast

    from inflight.model.loading import TINY_PATH

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    vocab[EOT] = 256
    (folder / "tokenizer.json").write_text(json.dumps(_tokenizer_json(vocab)))
    PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), bos_token=EOT, eos_token=EOT,
                            pad_token=EOT).save_pretrained(folder)
    shutil.copy(TINY_PATH / "model.safetensors", folder / "model.safetensors")
    cfg = json.loads((TINY_PATH / "config.json").read_text())
    cfg.pop("inflight_tokenizer", None)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    return folder


def save_random_checkpoint(folder: Path, hidden_size: int, num_layers: int, seed: int = 0) -> Path:
    """A Llama checkpoint with random weights and the tiny model's byte tokenizer, `hidden_size` wide
    and `num_layers` deep (heads of 64, half as many KV heads, the MLP 2.6875x as wide, as in the tiny
    model): a model whose step costs what a real one's does, for measuring what a fixed per-token cost
    (the server's HTTP work) weighs against it. Returns the folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from inflight.model.loading import TINY_PATH

    if hidden_size % 128 or num_layers < 1:
        raise ValueError(f"hidden_size must be a multiple of 128 (heads of 64, half as many KV heads) and "
                         f"num_layers >= 1, got {hidden_size} and {num_layers}")
    folder = Path(folder)
    cfg = json.loads((TINY_PATH / "config.json").read_text())
    cfg.update(hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=hidden_size // 64,
               num_key_value_heads=hidden_size // 128, intermediate_size=hidden_size * 43 // 16)
    torch.manual_seed(seed)
    hf_cfg = {k: v for k, v in cfg.items() if k not in ("inflight_tokenizer", "architectures", "torch_dtype")}
    LlamaForCausalLM(LlamaConfig(**hf_cfg)).save_pretrained(folder, safe_serialization=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))  # the byte tokenizer, as the tiny model's
    return folder


def run_record(module: str, argv: list[str] | None, watch) -> dict:
    """What every serving measurement records about itself: its command, the machine, the load."""
    from inflight import describe_device

    return {"command": f"python -m {module} " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": describe_device(), "load": watch.as_dict()}


def save_result(result: dict, output: Path | None) -> None:
    """Write a measurement's results JSON, if asked to."""
    if output:
        Path(output).write_text(json.dumps(result, indent=1) + "\n")
        print(f"saved {output}")
