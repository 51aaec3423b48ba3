"""What a measurement sends: the built-in distinct prompts, or a prompt file, in a fixed order.

A prompt file is JSONL, one {"prompt": TEXT, "max_tokens": N} per line (max_tokens optional), or a
ShareGPT JSON list ({"conversations": [{"from": "human", "value": TEXT}, ...]}: the first human turn
is the prompt). It is input like any other: a regular file of at most 16 MiB, UTF-8, at most 100,000
prompts, each non-empty and at most 200,000 characters; every fault names the line or entry.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from rig.core import RigError

MAX_PROMPTS = 100_000
MAX_PROMPT_CHARS = 200_000


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int


def builtin(i: int) -> str:
    # distinct prompts, so the prefix cache cannot serve one request from another
    return f"Request {i}: write a long, detailed story about a lighthouse keeper number {i * 7919 % 10007}."


def _entry(value: object, where: str, max_tokens: int) -> Prompt:
    if not isinstance(value, dict):
        raise RigError(f"{where}: expected an object with a prompt, got {type(value).__name__}")
    if "conversations" in value:
        turns = value["conversations"]
        human = [t.get("value") for t in turns if isinstance(t, dict) and t.get("from") == "human"] \
            if isinstance(turns, list) else []
        text, tokens = (human[0] if human else None), max_tokens
    else:
        text, tokens = value.get("prompt"), value.get("max_tokens", max_tokens)
    if not isinstance(text, str) or not text.strip():
        raise RigError(f"{where}: no prompt text (give \"prompt\": TEXT, or a ShareGPT human turn)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RigError(f"{where}: the prompt holds {text[exc.start]!r}, which is not text (a lone surrogate?)") from exc
    if len(text) > MAX_PROMPT_CHARS:
        raise RigError(f"{where}: the prompt has {len(text)} characters, more than {MAX_PROMPT_CHARS}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= 1_000_000:
        raise RigError(f"{where}: max_tokens must be a whole number from 1 to 1000000, got {tokens!r}")
    return Prompt(text, tokens)


def load(path: str | Path, max_tokens: int) -> list[Prompt]:
    """The prompts of a JSONL or ShareGPT JSON file, validated; MAX_TOKENS where an entry gives none."""
    from rig.core.documents import parse_json, read_text

    text = read_text(path, "prompt file")  # a regular file, UTF-8, at most rig.core.fs.MAX_READ
    if text.lstrip().startswith("["):
        entries = parse_json(text, f"prompt file {path}")
        where = [f"prompt file {path}: entry {i + 1}" for i in range(len(entries))]
    else:
        # lines end at \n only: JSON strings may hold U+2028 and the like, which splitlines() would cut at
        lines = [(n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
        entries = [parse_json(line, f"prompt file {path}: line {n}") for n, line in lines]
        where = [f"prompt file {path}: line {n}" for n, _ in lines]
    if not entries:
        raise RigError(f"prompt file {path} holds no prompt")
    if len(entries) > MAX_PROMPTS:
        raise RigError(f"prompt file {path} holds {len(entries)} prompts, more than {MAX_PROMPTS}")
    return [_entry(e, w, max_tokens) for e, w in zip(entries, where, strict=True)]


class Workload:
    """Request I's prompt: the file's prompts in an order shuffled once by SEED, or the built-in ones."""

    def __init__(self, prompts: list[Prompt] | None, max_tokens: int, seed: int = 0):
        self.max_tokens = max_tokens
        self.prompts = list(prompts or [])
        random.Random(seed).shuffle(self.prompts)

    def __call__(self, i: int) -> Prompt:
        if not self.prompts:
            return Prompt(builtin(i), self.max_tokens)
        return self.prompts[i % len(self.prompts)]

    def longest_output(self) -> int:
        return max((p.max_tokens for p in self.prompts), default=self.max_tokens)
