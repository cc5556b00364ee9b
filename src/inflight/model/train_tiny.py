"""Train the shipped tiny model: `python -m inflight.model.train_tiny`.

Corpus: the Python standard library's own source, on every machine offline, split into functions
(each function one document ending with end-of-text) — so completions have naturally varied,
long-tailed lengths. Byte-level tokens, a ~3M-parameter Llama, seeded; writes `config.json` +
`model.safetensors` (Hugging Face Llama format) and `train_report.json` to `inflight/model/assets/`.

The defaults (2000 steps of 8 x 512 bytes, two threads, seed 0) are the fixed schedule that made the
shipped model: about 27 minutes on an idle two-core machine (`assets/train_report.json` has the
figures). `--max-minutes` stops early by wall-clock time (the learning rate then decays by time, so
such a run is not bit-reproducible).
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import random
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from inflight.model.llama import LlamaConfig, LlamaModel
from inflight.model.tokenizer import ByteTokenizer, write_byte_tokenizer_files

ASSETS = Path(__file__).resolve().parent / "assets"
SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "turtledemo", "__pycache__"}
SAMPLE_PROMPTS = ["def fibonacci(n):\n", "def is_prime(n):\n", "def read_lines(path):\n"]


def tiny_config() -> LlamaConfig:
    """The shipped model's shape: 4 layers, hidden 256, 4 query heads sharing 2 KV heads, 512 context."""
    return LlamaConfig(vocab_size=257, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_theta=10000.0,
                       rms_norm_eps=1e-5, max_position_embeddings=512, tie_word_embeddings=False,
                       bos_token_id=256, eos_token_id=256)


def draft_config() -> LlamaConfig:
    """The shipped draft model's shape (speculative decoding, chapter 12): the tiny model's tokenizer,
    vocabulary and context, 2 layers of hidden 128 (2 query heads sharing 1 KV head): 0.43M parameters."""
    return LlamaConfig(vocab_size=257, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=64, rope_theta=10000.0,
                       rms_norm_eps=1e-5, max_position_embeddings=512, tie_word_embeddings=False,
                       bos_token_id=256, eos_token_id=256)


def stdlib_functions(root: str | None = None, max_chars: int = 4000) -> list[str]:
    """Source of every function in the standard library (tests and GUIs excluded), files sorted."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    docs: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if SKIP_DIRS & set(path.relative_to(root).parts[:-1]):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines(keepends=True)  # slice lines ourselves: get_source_segment is slow
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                seg = "".join(lines[node.lineno - 1: node.end_lineno])
                if seg and len(seg) <= max_chars:
                    docs.append(textwrap.dedent(seg).strip() + "\n")
    return docs


def build_corpus(seed: int, val_fraction: float = 0.02) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Token streams (train, val): functions shuffled with `seed`, each followed by end-of-text."""
    tok = ByteTokenizer()
    docs = stdlib_functions()
    random.Random(seed).shuffle(docs)
    n_val = max(1, int(len(docs) * val_fraction))

    def stream(ds: list[str]) -> torch.Tensor:
        ids: list[int] = []
        for d in ds:
            ids.extend(tok.encode(d, add_eos=True))
        return torch.tensor(ids, dtype=torch.int16 if max(ids) < 2**15 else torch.int32)

    return stream(docs[n_val:]), stream(docs[:n_val]), len(docs)


def batches(data: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator):
    """Random windows of `seq_len + 1` tokens (input and next-token target), forever."""
    while True:
        starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=gen)
        x = torch.stack([data[s: s + seq_len + 1] for s in starts.tolist()]).long()
        yield x[:, :-1], x[:, 1:]


@torch.no_grad()
def evaluate(model: LlamaModel, data: torch.Tensor, seq_len: int, n_batches: int = 8, batch_size: int = 16) -> float:
    gen = torch.Generator().manual_seed(1234)
    it = batches(data, batch_size, seq_len, gen)
    losses = []
    for _ in range(n_batches):
        x, y = next(it)
        losses.append(F.cross_entropy(model.forward_dense(x).flatten(0, 1), y.flatten()).item())
    return sum(losses) / len(losses)


def save(model: LlamaModel, out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_hf()
    cfg["inflight_tokenizer"] = "bytes"  # tells load_tiny / load_tokenizer to use ByteTokenizer
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    # the same tokenizer as Hugging Face files, for tools that load one by path (transformers, guidellm, vLLM)
    write_byte_tokenizer_files(out, model.config.max_position_embeddings)
    save_file(model.hf_state_dict(), str(out / "model.safetensors"), metadata={"format": "pt"})


def make_samples(model: LlamaModel, max_new_tokens: int = 300) -> dict:
    """Greedy and sampled (temperature 0.8, seeded) continuations of function signatures."""
    from inflight.model.generate import generate

    tok = ByteTokenizer()
    prompts = [tok.encode(p, add_bos=True) for p in SAMPLE_PROMPTS]
    greedy = generate(model, prompts, max_new_tokens=max_new_tokens)
    sampled = generate(model, prompts, max_new_tokens=max_new_tokens, temperature=0.8, seed=0)
    return {"greedy": {p: tok.decode(o) for p, o in zip(SAMPLE_PROMPTS, greedy)},
            "temperature_0.8_seed_0": {p: tok.decode(o) for p, o in zip(SAMPLE_PROMPTS, sampled)}}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2,
                    help="torch threads (1 is the robust choice on a CPU shared with other programs)")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--max-minutes", type=float, default=None,
                    help="stop early after this much training time (the report records the steps done)")
    ap.add_argument("--draft", action="store_true",
                    help="train the small draft model for speculative decoding (draft_config) into assets/draft/")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: assets/, or assets/draft/ with --draft)")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = ASSETS / "draft" if args.draft else ASSETS
    return args


def _lr_schedule(args: argparse.Namespace, t_train: float):
    """Linear warmup, then cosine decay to 10% (by steps, or by a time budget if one runs out first)."""
    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        frac = (step - args.warmup) / max(1, args.steps - args.warmup)
        if args.max_minutes is not None:  # a time budget: decay by whichever runs out first (not bit-reproducible)
            frac = max(frac, (time.time() - t_train) / (60 * args.max_minutes))
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
    return lr_at


def train(model: LlamaModel, data: torch.Tensor, args: argparse.Namespace) -> tuple[int, float]:
    """The training loop: AdamW, clipped gradients, next-byte cross-entropy. Returns (steps, seconds)."""
    from tqdm.auto import tqdm

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    it = batches(data, args.batch_size, args.seq_len, torch.Generator().manual_seed(args.seed))
    t_train = time.time()
    lr_at = _lr_schedule(args, t_train)
    bar = tqdm(range(args.steps), desc="training", mininterval=5, file=sys.stdout)
    ema, steps_done = None, 0
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x, y = next(it)
        loss = F.cross_entropy(model.forward_dense(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{ema:.3f}")
        steps_done = step + 1
        if args.max_minutes is not None and time.time() - t_train > 60 * args.max_minutes:
            break
    return steps_done, time.time() - t_train


def main(argv: list[str] | None = None) -> dict:
    args = _parse(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.time()
    train_data, val_data, n_docs = build_corpus(args.seed)
    print(f"corpus: {n_docs} stdlib functions, {len(train_data):,} train / {len(val_data):,} val bytes "
          f"({time.time() - t0:.1f}s)")
    model = LlamaModel(draft_config() if args.draft else tiny_config())
    print(f"model: {model.num_parameters() / 1e6:.2f}M parameters")
    steps_done, train_seconds = train(model, train_data, args)
    model.eval()
    train_loss, val_loss = evaluate(model, train_data, args.seq_len), evaluate(model, val_data, args.seq_len)
    samples = make_samples(model)
    save(model, args.out)
    seen = steps_done * args.batch_size * args.seq_len
    report = {
        "steps": steps_done, "scheduled_steps": args.steps, "batch_size": args.batch_size, "seq_len": args.seq_len,
        "lr": args.lr, "seed": args.seed, "threads": args.threads, "parameters": model.num_parameters(),
        "documents": n_docs, "train_tokens_seen": seen, "train_seconds": round(train_seconds, 1),
        "tokens_per_second": round(seen / train_seconds), "train_loss": round(train_loss, 4),
        "val_loss": round(val_loss, 4), "val_bits_per_byte": round(val_loss / math.log(2), 4),
        "samples": samples, "python": sys.version.split()[0], "torch": torch.__version__,
        "command": "python -m inflight.model.train_tiny " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    (args.out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"trained {steps_done} steps in {train_seconds / 60:.1f} min ({report['tokens_per_second']:,} tokens/s); "
          f"train loss {train_loss:.3f}, val loss {val_loss:.3f} ({report['val_bits_per_byte']:.2f} bits/byte)")
    for kind, texts in samples.items():
        for p, s in texts.items():
            print(f"----- {kind} -----\n" + p + s)
    return report


if __name__ == "__main__":
    main()
