"""Speculative decoding (chapter 12): guess a few tokens cheaply, check them all in one pass of the model.

A decode step streams every weight of the model to produce one token per request, and on a GPU it is
memory-bound: the arithmetic units sit mostly idle. Speculation spends that idle arithmetic. A
*proposer* guesses the next `k` tokens of a request; the target model then runs once over the
request's last token plus the `k` guesses (a ragged row of `k + 1` tokens, exactly like a prefill
chunk), and the *rejection sampler* keeps the longest prefix of guesses the model agrees with, plus
one token of the model's own. A step thus yields between 1 and `k + 1` tokens per request, and the
output distribution is the target model's, exactly (Leviathan et al. 2023; Chen et al. 2023).

- `config`            `SpeculativeConfig`: what `LLMEngine(speculative_config={...})` accepts (vLLM's names)
- `ngram_proposer`    prompt lookup: the tokens that followed the last time the latest n-gram occurred
- `draft_proposer`    a small draft model with its own paged KV cache, run greedily `k` steps ahead
- `rejection_sampler` the accept/reject rule (exact match under greedy) and its target distribution
- `metrics`           proposed and accepted tokens, per position; acceptance rate, mean accepted length

The scheduler's part (`inflight.engine.scheduler`): a request in decode carries its proposals in
`Sequence.spec_token_ids`; the budget gives them token slots and KV blocks only from what the step
has left over (the lookahead slots: speculation never preempts anyone), and after the pass the
request's `num_computed_tokens` advances by 1 + the accepted count only — the rejected tokens' keys
and values stay in the cache as garbage that the next step overwrites, and the blocks past them go
back to the pool. A seeded sampled request is reproducible from run to run under the same
speculative config, but its text differs from the one without speculation (the rule draws its
random numbers differently); its *distribution* is the same. vLLM's counterparts are `vllm/v1/spec_decode/` and `vllm/v1/sample/rejection_sampler.py`.
"""
from inflight.engine.spec_decode.config import SpeculativeConfig, make_proposer
from inflight.engine.spec_decode.metrics import SpecDecodingMetrics, expected_tokens_per_step
from inflight.engine.spec_decode.ngram_proposer import NgramProposer, ngram_propose

__all__ = ["SpeculativeConfig", "make_proposer", "SpecDecodingMetrics", "NgramProposer", "ngram_propose",
           "rejection_sample", "target_probs", "expected_tokens_per_step"]


def __getattr__(name):  # the torch parts load on first use (the scheduler imports this package without torch)
    if name in ("rejection_sample", "target_probs"):
        from inflight.engine.spec_decode import rejection_sampler
        return getattr(rejection_sampler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
