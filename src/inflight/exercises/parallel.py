"""Grader for the tensor-parallelism chapter: which attention heads a rank holds.

`rank_heads(num_heads, num_kv_heads, tp_size, rank) -> (q_heads, kv_heads)`: the query heads rank
`rank` of `tp_size` computes — a contiguous `num_heads / tp_size` of them — and the KV heads it must
hold for them: the KV head of query head `q` is `q // (num_heads / num_kv_heads)` (grouped-query
attention), so with at least as many KV heads as ranks each rank holds its own contiguous
`num_kv_heads / tp_size`, and with fewer each holds ONE, replicated on the `tp_size / num_kv_heads`
ranks that share it (vLLM's rule). The engine's version is `inflight.model.tp_layout`.
"""
from __future__ import annotations

from typing import Any, Callable

from inflight.exercises.answers import Flaw, as_int_list
from inflight.exercises.grading import Case, GradeResult, Mistake, grade, repeat_case
from inflight.model.tp_layout import head_range, kv_head_range

__all__ = ["rank_heads", "check_rank_heads", "CONFIGS"]


def rank_heads(num_heads: int, num_kv_heads: int, tp_size: int, rank: int) -> tuple[list[int], list[int]]:
    """Reference: (query heads, KV heads) of `rank`."""
    return list(head_range(num_heads, rank, tp_size)), list(kv_head_range(num_kv_heads, rank, tp_size))


#: (model, query heads, KV heads, TP sizes) — real models' head counts
CONFIGS = [
    ("the book's tiny model", 4, 2, (1, 2, 4)),
    ("Llama-3.1-8B", 32, 8, (1, 2, 4, 8)),
    ("Llama-3.1-70B", 64, 8, (2, 4, 8, 16)),
    ("Qwen2-0.5B", 14, 2, (2, 14)),
    ("multi-head (GPT-style, no GQA)", 16, 16, (2, 4, 8)),
    ("multi-query (one KV head)", 8, 1, (2, 4, 8)),
    ("Llama-3.1-405B", 128, 8, (8, 16, 32)),
    ("grouped by 4", 16, 4, (2, 4, 8, 16)),
]


def _answer(f: Callable, h: int, kv: int, n: int, r: int) -> tuple[list[int], list[int]]:
    got = f(h, kv, n, r)
    what = f"rank_heads({h}, {kv}, {n}, {r})"
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise Flaw("not a pair", repr(got)[:80], f"{what} returns a pair (query heads, KV heads): "
                   "`return q_heads, kv_heads`.", first=True)
    q, kv = (as_int_list(got[0], what + "[0]", "head indices are ints"),
             as_int_list(got[1], what + "[1]", "head indices are ints"))
    if q and not kv:
        raise Flaw("a rank with no KV head", f"{what} = ({q}, [])", f"rank {r}'s query heads {q} read a KV head too. "
                   "With fewer KV heads than ranks, `num_kv_heads // tp_size` is 0: split like the query heads, the "
                   "KV heads run out. Replicate instead — each rank holds the one KV head its query heads read.")
    return q, kv


def _tags(h: int, kv: int, n: int) -> frozenset:
    tags = set()
    if kv < n:
        tags.add("replicated")
    if kv == 1:
        tags.add("one KV head")
    if n == 1:
        tags.add("one rank")
    if kv > n:
        tags.add("several KV heads per rank")
    return frozenset(tags)


TAGS = {
    "replicated": ("the model has fewer KV heads than there are ranks",
                   "each rank then holds ONE KV head — the one its query heads read, `q // (heads / kv_heads)` "
                   "— and several ranks hold a copy of it; none holds zero."),
    "one KV head": ("the model has a single KV head (multi-query attention)", "every rank holds that one head: [0]."),
    "one rank": ("tp_size is 1", "one rank holds every head."),
    "several KV heads per rank": ("each rank holds several KV heads", "a contiguous `kv_heads / tp_size` of them."),
}


def _cases() -> list[Case]:
    cases = []
    for name, h, kv, sizes in CONFIGS:
        for n in sizes:
            cases.append(Case(f"{name}, TP = {n}",
                              lambda f, h=h, kv=kv, n=n: [_answer(f, h, kv, n, r) for r in range(n)],
                              f"num_heads={h}, num_kv_heads={kv}, tp_size={n}: every rank's answer, rank 0 first",
                              tags=_tags(h, kv, n), unit="rank"))
    return cases + [repeat_case(cases)]


def _kv_round_robin(h, kv, n, r):
    q = list(range(r * (h // n), (r + 1) * (h // n)))
    return q, ([r % kv] if kv < n else list(range(r * (kv // n), (r + 1) * (kv // n))))


def _kv_all(h, kv, n, r):
    return list(range(r * (h // n), (r + 1) * (h // n))), list(range(kv))


def _q_strided(h, kv, n, r):
    q = list(range(r, h, n))
    return q, sorted({x // (h // kv) for x in q})


def _group_by_kv_count(h, kv, n, r):
    q = list(range(r * (h // n), (r + 1) * (h // n)))
    return q, sorted({min(x // kv, kv - 1) for x in q})


MISTAKES = [
    Mistake("replicas dealt round-robin", "rank r's query heads read KV head `q // (heads / kv_heads)`, which for "
            "consecutive ranks is the SAME head (ranks 0 and 1 share head 0 at 8 heads, 2 KV heads, TP = 4), "
            "not `r % kv_heads`: the copies go to neighbouring ranks.", _kv_round_robin),
    Mistake("every KV head on every rank", "a rank needs only the KV heads its own query heads read; holding all "
            "of them puts the whole KV cache on every device, and TP saves no KV memory.", _kv_all),
    Mistake("query heads dealt round-robin", "each rank holds a CONTIGUOUS run of heads (rank r: heads r·h/N to "
            "(r+1)·h/N − 1): the q/k/v weight rows are sliced in one piece, and the KV heads follow.", _q_strided),
    Mistake("group size confused with the number of KV heads", "query head q reads KV head q // GROUP, where "
            "GROUP = num_heads / num_kv_heads is the number of query heads per KV head — not num_kv_heads.",
            _group_by_kv_count),
]


def check_rank_heads(fn: Callable[[int, int, int, int], Any], *, quiet: bool = False) -> GradeResult:
    """Grade `fn(num_heads, num_kv_heads, tp_size, rank) -> (q_heads, kv_heads)` over real models'
    head counts, every rank of every TP size."""
    return grade("rank_heads", fn, rank_heads, _cases(), MISTAKES, quiet=quiet, tags=TAGS)
