"""What speculation achieved: vLLM's counters (`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`,
`..._num_accepted_tokens`, `..._num_accepted_tokens_per_pos`) and the two figures read from them."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SpecDecodingMetrics", "expected_tokens_per_step"]


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Tokens one verifying step yields on average when each proposal is accepted independently with
    probability `alpha`: 1 + α + α² + … + α^k = (1 − α^(k+1)) / (1 − α) (k + 1 when α = 1)."""
    if alpha >= 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


@dataclass
class SpecDecodingMetrics:
    """Counters over an engine's life. A *draft* is one request's proposals checked in one step."""

    num_speculative_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # drafts whose i-th proposal was accepted
    proposed_per_pos: list[int] = field(default_factory=list)  # drafts that had an i-th proposal

    def __post_init__(self) -> None:
        self.accepted_per_pos = self.accepted_per_pos or [0] * self.num_speculative_tokens
        self.proposed_per_pos = self.proposed_per_pos or [0] * self.num_speculative_tokens

    def record(self, num_proposed: int, num_accepted: int) -> None:
        """One draft: `num_proposed` tokens checked, the first `num_accepted` of them kept."""
        self.num_drafts += 1
        self.num_draft_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        for i in range(num_proposed):
            self.proposed_per_pos[i] += 1
            if i < num_accepted:
                self.accepted_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed tokens (0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a request gains per verifying step: 1 (the target's own) + the accepted proposals."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def as_dict(self) -> dict:
        return {"spec_num_drafts": self.num_drafts, "spec_num_draft_tokens": self.num_draft_tokens,
                "spec_num_accepted_tokens": self.num_accepted_tokens,
                "spec_accepted_per_pos": list(self.accepted_per_pos),
                "spec_proposed_per_pos": list(self.proposed_per_pos),
                "spec_acceptance_rate": self.acceptance_rate, "spec_mean_accepted_length": self.mean_accepted_length}
