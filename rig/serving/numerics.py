"""The numerics test model's next-token rule: what a correct server must generate, known in advance.

The numerics target (`rig testmodel --kind numerics`) is built so that its greedy token is
`next_rank(current, highest)`: the current token's rank and the highest rank in the whole
context so far. Its attention finds the highest-ranked token (every layer's heads add a share,
summed across the TP ranks), its MLPs look the pair up (a unit per pair, spread over every
layer and every rank's slice), its lm_head reads the answer. A kernel that computes wrong
values, in attention, a GEMM or an all-reduce, changes the tokens; the designed margin keeps
bf16 rounding from doing so. The rule is data for the builder, which runs in the stack's venv.
"""
from __future__ import annotations

RANKS = 32
FIRST_ID = 512  # rank r is token id FIRST_ID + r - 1: ordinary merged tokens of the 1024-token vocabulary
# two tokens that win where the answer's magnitude is off by a third or more: one at a fixed logit, one that
# grows twice as fast as the answer's (a lost TP rank halves it, a doubled all-reduce doubles it)
DECOYS = (FIRST_ID + RANKS, FIRST_ID + RANKS + 1)
PROMPTS = 8
NEW_TOKENS = 32


def next_rank(current: int, highest: int) -> int:
    """Never above the highest rank seen, so the highest stays the prompt's own."""
    return (5 * current) % highest + 1


def token(rank: int) -> int:
    return FIRST_ID + rank - 1


def rank_of(token_id: int) -> int | None:
    rank = token_id - FIRST_ID + 1
    return rank if 1 <= rank <= RANKS else None


def prompts() -> list[list[int]]:
    """PROMPTS prompts of rule tokens, each with its own highest rank (4, 8, ... 32) and length."""
    out = []
    for i in range(PROMPTS):
        highest = RANKS * (i + 1) // PROMPTS
        ranks = [(i * 5 + j * 3) % highest + 1 for j in range(6 + i)]
        ranks[i % len(ranks)] = highest
        out.append([token(r) for r in ranks])
    return out


def continuation(prompt: list[int], count: int = NEW_TOKENS) -> list[int]:
    """The COUNT tokens a correct server generates greedily after PROMPT (rule tokens only)."""
    ranks = [r for r in map(rank_of, prompt) if r]
    if not prompt or len(ranks) != len(prompt):
        raise ValueError("a numerics prompt holds rule tokens only")
    current, highest, out = ranks[-1], max(ranks), []
    for _ in range(count):
        current = next_rank(current, highest)
        out.append(token(current))
    return out


def table() -> dict:
    """The rule as the builder and a stand-in server take it: ids by rank, and next rank by [highest][current]."""
    return {"ids": [token(r) for r in range(1, RANKS + 1)], "decoys": list(DECOYS),
            "next": [[next_rank(c, m) if c <= m else 0 for c in range(1, RANKS + 1)] for m in range(1, RANKS + 1)]}


def first_difference(prompt: int, got: list[int], expected: list[int]) -> dict:
    """Where PROMPT's tokens first differ from the EXPECTED ones, with the next few of each."""
    at = next((i for i, (g, w) in enumerate(zip(got, expected, strict=False)) if g != w), min(len(got), len(expected)))
    return {"prompt": prompt, "position": at, "got": got[at:at + 4], "expected": expected[at:at + 4]}
