"""`SpeculativeConfig`: what `LLMEngine(speculative_config={...})` and `--speculative-config` accept.

vLLM's names: `{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a,
"prompt_lookup_max": b}` and `{"method": "draft_model", "model": path, "num_speculative_tokens": k}`.
Everything is checked before any request runs: `k >= 1`, n-gram sizes with 1 <= min <= max, a draft
model that loads and speaks the target's vocabulary (same size, same end-of-text). `"model"` may be
a checkpoint folder, a model object (an inflight `LlamaModel`), or `"inflight-tiny-draft"`, the
small draft shipped for the tiny model (`inflight/model/assets/draft/`, its README says how it was made).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from inflight import checks

__all__ = ["SpeculativeConfig", "make_proposer", "METHODS", "SHIPPED_DRAFT"]

METHODS = ("ngram", "draft_model")
SHIPPED_DRAFT = "inflight-tiny-draft"
_KEYS = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model"}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: Any = None

    @classmethod
    def parse(cls, spec: "SpeculativeConfig | Mapping[str, Any] | None") -> "SpeculativeConfig | None":
        """A checked config from a dict of vLLM's keys (None: no speculation). Defaults: n-gram sizes
        1..3 (`prompt_lookup_max` alone sets both ends' maximum; `prompt_lookup_min` alone, the minimum)."""
        if spec is None or isinstance(spec, cls):
            return spec
        if not isinstance(spec, Mapping):
            raise TypeError(f"speculative_config must be a dict (vLLM's keys), got {type(spec).__name__}")
        unknown = sorted(set(spec) - _KEYS)
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {unknown}; known: {sorted(_KEYS)}")
        method = spec.get("method")
        if method not in METHODS:
            raise ValueError(f"speculative_config['method'] must be one of {list(METHODS)}, got {method!r}")
        if "num_speculative_tokens" not in spec:
            raise ValueError("speculative_config needs 'num_speculative_tokens' (k >= 1, the proposals per step)")
        k = checks.integer("num_speculative_tokens", spec["num_speculative_tokens"], minimum=1, maximum=64)
        if method == "ngram":
            if spec.get("model") is not None:
                raise ValueError("speculative_config: method 'ngram' takes no 'model' (prompt lookup needs none)")
            lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
            lo = None if lo is None else checks.integer("prompt_lookup_min", lo, minimum=1)
            hi = None if hi is None else checks.integer("prompt_lookup_max", hi, minimum=1)
            lo, hi = (lo if lo is not None else min(1, hi or 1)), (hi if hi is not None else max(3, lo or 1))
            if lo > hi:
                raise ValueError(f"speculative_config: prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})")
            return cls("ngram", k, lo, hi)
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            if spec.get(key) is not None:
                raise ValueError(f"speculative_config: {key!r} is for method 'ngram', not 'draft_model'")
        if spec.get("model") is None:
            raise ValueError("speculative_config: method 'draft_model' needs 'model' (a checkpoint folder, a model, "
                             f"or {SHIPPED_DRAFT!r})")
        return cls("draft_model", k, model=spec["model"])


def _load_draft(model: Any, device: Any, dtype: Any):
    if not isinstance(model, str):
        if not hasattr(model, "config") or not callable(model):
            raise TypeError(f"speculative_config['model'] must be a path or an inflight LlamaModel, "
                            f"got {type(model).__name__}")
        return model
    from inflight.model.loading import DRAFT_PATH, load_pretrained

    path = DRAFT_PATH if model == SHIPPED_DRAFT else model
    try:
        return load_pretrained(path, device=device, dtype=dtype)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"speculative_config: the draft model {model!r} does not load: {exc}") from None


def make_proposer(cfg: SpeculativeConfig, target_config: Any, *, device: Any, dtype: Any, num_blocks: int,
                  block_size: int, max_batch_size: int):
    """The proposer `cfg` names, checked against the target model (a draft's vocabulary must be the target's)."""
    from inflight.engine.spec_decode.ngram_proposer import NgramProposer

    if cfg.method == "ngram":
        return NgramProposer(cfg.prompt_lookup_min, cfg.prompt_lookup_max)
    from inflight.engine.spec_decode.draft_proposer import DraftModelProposer

    draft = _load_draft(cfg.model, device, dtype)
    dc = draft.config
    if dc.vocab_size != target_config.vocab_size:
        raise ValueError(f"speculative_config: the draft model's vocabulary ({dc.vocab_size} tokens) is not the "
                         f"target's ({target_config.vocab_size}): a draft must share the target's tokenizer")
    if set(getattr(dc, "eos_token_ids", None) or []) != set(getattr(target_config, "eos_token_ids", None) or []):
        raise ValueError("speculative_config: the draft model's end-of-text token differs from the target's: "
                         "a draft must share the target's tokenizer")
    if dc.max_position_embeddings < target_config.max_position_embeddings:
        raise ValueError(f"speculative_config: the draft model's context ({dc.max_position_embeddings}) is shorter "
                         f"than the target's ({target_config.max_position_embeddings})")
    return DraftModelProposer(draft, cfg.num_speculative_tokens, num_blocks=num_blocks, block_size=block_size,
                              max_batch_size=max_batch_size, device=device)
