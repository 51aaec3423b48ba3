"""What a measurement sends: the built-in distinct prompts, or a prompt file, in a fixed order.

A prompt file is JSONL, one {"prompt": TEXT, "max_tokens": N} per line (max_tokens optional), or a
ShareGPT JSON list ({"conversations": [{"from": "human", "value": TEXT}, ...]}: the first human turn
is the prompt; a conversation without one holds nothing to send and is left out, as SGLang's own
benchmark leaves out conversations too short to use). Both are read as a stream, a record at a time,
so a file of any size is taken (the standard ShareGPT file is 642 MB) while each record (a line, or an
entry of the list) is at most MAX_RECORD bytes. It is input like any other: a regular file, UTF-8,
at most 100,000 prompts, each non-empty and at most 200,000 characters; every fault names the line or
entry. Fields rig does not read (ShareGPT's 64-bit ids) are taken as they are.
"""
from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rig.core import RigError, progress

MAX_PROMPTS = 100_000
MAX_PROMPT_CHARS = 200_000
# the longest prompt written as \u escapes (12 bytes for a character beyond the BMP) is 2.4 MB; a record
# holds the rest of its conversation too
MAX_RECORD = 4 << 20
CHUNK = 1 << 20  # bytes read at a time (a module value so that tests can cut records at every byte)
SPACE = re.compile(rb"[ \t\r\n]*")  # JSON's whitespace
BOM = b"\xef\xbb\xbf"
# a JSON string (group 1 empty while its closing quote is not read yet), or a bracket: what a record's end is
# found by, without decoding what lies between
TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(")?|[\[\]{}]', re.S)


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int


def builtin(i: int) -> str:
    # distinct prompts, so the prefix cache cannot serve one request from another
    return f"Request {i}: write a long, detailed story about a lighthouse keeper number {i * 7919 % 10007}."


def _entry(value: object, where: str, max_tokens: int) -> Prompt | None:
    """VALUE's prompt, or None for a ShareGPT conversation with no human turn to send."""
    if not isinstance(value, dict):
        raise RigError(f"{where}: expected an object with a prompt, got {type(value).__name__}")
    if "conversations" in value:
        turns = value["conversations"]
        if not isinstance(turns, list):
            raise RigError(f"{where}: conversations must be a list of turns, got {type(turns).__name__}")
        human = next((t for t in turns if isinstance(t, dict) and t.get("from") == "human"), None)
        text, tokens = (human.get("value") if human else None), max_tokens
        if text is None or isinstance(text, str) and not text.strip():
            return None
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


def _bounded(size: int, where: str, verb: str) -> None:
    if size > MAX_RECORD:
        raise RigError(f"{where} {verb} {MAX_RECORD >> 20} MiB, more than a prompt record holds (a prompt is at most "
                       f"{MAX_PROMPT_CHARS} characters)")


class _Window:
    """A file's bytes from offset `base` on, read CHUNK bytes at a time; offsets are the file's. `skipped` counts
    the line ends in the whitespace space() passed over (the line a JSONL file's first record is on)."""

    def __init__(self, handle: BinaryIO, source: str):
        self.handle, self.source, self.data, self.base, self.skipped = handle, source, b"", 0, 0

    def more(self, keep: int) -> bool:
        """Read on, dropping the bytes before offset KEEP; False at the end of the file."""
        try:
            chunk = self.handle.read(CHUNK)
        except OSError as exc:
            raise RigError(f"cannot read {self.source}: {exc.strerror or exc}") from exc
        self.data, self.base = self.data[keep - self.base:] + chunk, keep
        return bool(chunk)

    def end(self) -> int:
        return self.base + len(self.data)

    def space(self, at: int) -> tuple[int, bytes]:
        """The offset of the first byte from AT on that is not whitespace, and that byte (b"" at the end)."""
        while True:
            match = SPACE.match(self.data, at - self.base)  # always a match, if an empty one
            if match:
                self.skipped += self.data.count(b"\n", match.start(), match.end())
                at = self.base + match.end()
            if at < self.end():
                return at, self.data[at - self.base:at - self.base + 1]
            if not self.more(at):
                return at, b""

    def text(self, start: int, end: int, where: str) -> str:
        data = self.data[start - self.base:end - self.base]
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RigError(f"{where} is not UTF-8 text (byte {start + exc.start} of the file); save it as "
                           "UTF-8") from exc

    def record_end(self, start: int, where: str) -> int:
        """The offset just past the object or list that starts at START, found by its brackets outside strings;
        more than MAX_RECORD bytes of it, or the file's end inside it, is a RigError naming WHERE."""
        depth, at = 0, start
        while True:
            match = TOKEN.search(self.data, at - self.base)
            if match is None or (match.group(0)[:1] == b'"' and match.group(1) is None):  # it goes on past the window
                at = self.base + match.start() if match else self.end()
                _bounded(self.end() - start, where, "is larger than")  # before reading on: memory stays bounded
                if not self.more(start):
                    raise RigError(f"{where}: the file ends inside it; is it cut short?")
                continue
            at = self.base + match.end()
            token = match.group(0)
            if token in (b"{", b"["):
                depth += 1
            elif token in (b"}", b"]"):
                depth -= 1
                if depth == 0:
                    _bounded(at - start, where, "is larger than")
                    return at


def _array(window: _Window, source: str, start: int) -> Iterator[tuple[str, object]]:
    """The entries of the JSON array whose [ is at START, one at a time, each parsed whole."""
    from rig.core.documents import parse_json

    at, byte = window.space(start + 1)
    n = 0
    while byte != b"]" or n:
        n += 1
        where = f"{source}: entry {n}"
        if byte != b"{":
            got = "the end of the file (is it cut short?)" if not byte else {
                b'"': "text", b"[": "a list", b"]": "the list's end after a comma", b"t": "true", b"f": "false",
                b"n": "null"}.get(byte, "a number" if byte in b"-0123456789" else repr(byte.decode(errors="replace")))
            raise RigError(f"{where}: expected an object with a prompt at byte {at}, got {got}")
        end = window.record_end(at, where)
        yield where, parse_json(window.text(at, end, where), where)
        at, byte = window.space(end)
        if byte == b"]":
            break
        if byte != b",":
            raise RigError(f"{source}: after entry {n}, expected , or ] at byte {at}, got "
                           + (repr(byte.decode(errors="replace")) if byte else "the end of the file (is it cut short?)"))
        at, byte = window.space(at + 1)
    at, byte = window.space(at + 1)
    if byte:
        raise RigError(f"{source}: more follows the list's closing ] (at byte {at}); a prompt file holds one list")


def _lines(window: _Window, source: str, start: int, n: int) -> Iterator[tuple[str, object]]:
    """The JSON value of each non-blank line from offset START on, the first being line N + 1. Lines end at \\n
    only: JSON strings may hold U+2028 and the like, which splitlines() would cut at."""
    from rig.core.documents import parse_json

    at = start
    while True:
        newline = window.data.find(b"\n", at - window.base)
        if newline < 0:
            _bounded(window.end() - at, f"{source}: line {n + 1}", "is longer than")  # before reading on
            if window.more(at):
                continue
            if at == window.end():
                return
            newline = window.end() - window.base  # a last line without its \n
        end = window.base + newline
        n += 1
        where = f"{source}: line {n}"
        _bounded(end - at, where, "is longer than")
        text = window.text(at, end, where)
        if text.strip():
            yield where, parse_json(text, where)
        at = end + 1


def read(handle: BinaryIO, source: str, max_tokens: int) -> list[Prompt]:
    """The prompts of the JSONL or ShareGPT JSON stream HANDLE (named SOURCE in every fault), validated;
    MAX_TOKENS where an entry gives none."""
    window = _Window(handle, source)
    while len(window.data) < len(BOM) and window.more(0):  # the head, however small the reads
        pass
    # a UTF-8 byte-order mark (editors on Windows write one) is no part of the first record
    start, first = window.space(len(BOM) if window.data.startswith(BOM) else 0)
    records = _array(window, source, start) if first == b"[" else _lines(window, source, start, window.skipped)
    prompts: list[Prompt] = []
    left_out: list[str] = []
    for where, value in records:
        prompt = _entry(value, where, max_tokens)
        if prompt is None:
            left_out.append(where)
        elif len(prompts) == MAX_PROMPTS:
            raise RigError(f"{source} holds more than {MAX_PROMPTS} prompts; keep at most {MAX_PROMPTS}")
        else:
            prompts.append(prompt)
    if not prompts:
        raise RigError(f"{source} holds no prompt" + (f": none of its {len(left_out)} ShareGPT conversation(s) has a "
                                                     "human turn to send" if left_out else ""))
    if left_out:
        progress(f"{source}: left out {len(left_out)} ShareGPT conversation(s) without a human turn to send "
                 f"(the first: {left_out[0].rsplit(': ', 1)[-1]})")
    return prompts


def load(path: str | Path, max_tokens: int) -> list[Prompt]:
    """The prompts of the prompt file PATH (read()); a regular file only (rig.core.fs)."""
    from rig.core.fs import open_regular

    with open_regular(path, "prompt file") as handle:
        return read(handle, f"prompt file {path}", max_tokens)


class Workload:
    """Request I's prompt: the file's prompts in an order shuffled once by SEED, or the built-in ones."""

    @classmethod
    def of(cls, path: str | Path | None, max_tokens: int, seed: int) -> "Workload":
        """The prompt file at PATH (load()), else the built-in prompts, at the plan's MAX_TOKENS and SEED."""
        return cls(load(path, max_tokens) if path else None, max_tokens, seed)

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
