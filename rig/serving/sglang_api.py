"""SGLang's HTTP API as rig's smoke test and benchmark use it (stdlib only, so the
engine bundle can wait for a server on a target).

Field names follow SGLang's http_server.py and tokenizer_manager.py: /generate
returns meta_info with completion_tokens, e2e_latency and, under speculation,
spec_verify_ct (newer builds add spec_accept_length); /server_info (older
/get_server_info) carries the server's arguments and
internal_states[i].avg_spec_accept_length.
"""
from __future__ import annotations

import os

from rig.core import RigError, http, numbers, progress
from rig.core.documents import dump_json, parse_json
from rig.stack.spec import KEY_ENV


def headers(api_key_env: str = KEY_ENV) -> dict:
    key = os.environ.get(api_key_env)
    return {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}


def generate_body(prompt: str, max_tokens: int, stream: bool, sampling: dict | None = None) -> dict:
    """Greedy unless SAMPLING gives temperature / top_p. ignore_eos: every request generates exactly max_tokens,
    so runs compare like for like."""
    return {"text": prompt, "stream": stream,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, **(sampling or {})}}


def number(value) -> float | None:
    """A positive number from a server's answer, or None: answers are input, never trusted to be well formed
    (rig.core.numbers bounds it: a 400-digit integer is no number rig takes)."""
    found = numbers.answer(value, low=0)
    return found if found else None


def accept_length(meta: dict) -> float | None:
    """Tokens per verify step of one finished request, or None when it was not speculative."""
    if not isinstance(meta, dict):
        return None
    if (direct := number(meta.get("spec_accept_length"))) is not None:
        return direct
    verify, tokens = number(meta.get("spec_verify_ct")), number(meta.get("completion_tokens"))
    return tokens / verify if verify and tokens else None


def call(url: str, path: str, body: dict | None = None, timeout: float = 30.0,
         api_key_env: str = KEY_ENV) -> tuple[int, bytes]:
    """(HTTP status, body); status 0 when nothing answered (rig.core.http: no redirects, one deadline)."""
    data = dump_json(body, f"the request to {path}").encode() if body is not None else None
    return http.request(url.rstrip("/") + path, data, headers(api_key_env), timeout)


def server_info(url: str, api_key_env: str = KEY_ENV) -> dict:
    """The server's arguments and internal state; {} when neither spelling answers."""
    for path in ("/server_info", "/get_server_info"):
        status, body = call(url, path, api_key_env=api_key_env)
        if status == 200:
            try:
                info = parse_json(body.decode(errors="replace"), f"{url}{path}")
            except RigError:
                info = None
            if isinstance(info, dict):
                return info
            progress(f"{url}{path} answered something other than a JSON object: {body[:80]!r}; ignoring it")
    return {}


def context_length(info: dict) -> int | None:
    """The longest request the server takes (prompt + output), from /server_info; None when it does not say."""
    value = info.get("context_length")
    if isinstance(value, int) and number(value):
        return value
    longest_input = info.get("max_req_input_len")  # the scheduler's: context length - 1
    if isinstance(longest_input, int) and number(longest_input):
        return longest_input + 1
    return None


def server_accept_length(info: dict) -> float | None:
    states = info.get("internal_states")
    found = [number(s.get("avg_spec_accept_length")) for s in states if isinstance(s, dict)] \
        if isinstance(states, list) else []
    values = [v for v in found if v is not None]
    return numbers.mean(values)


def expect_json(status: int, body: bytes, what: str) -> dict:
    """A 200 answer's JSON object, else a RigError naming WHAT. Bytes that are not UTF-8 are kept (as lone
    surrogates, never replaced by U+FFFD), so that a reader of the text can tell (completion_problem)."""
    if status != 200:
        raise RigError(f"{what}: HTTP {status or 'no answer'}: {body[:300].decode(errors='replace')}")
    try:
        value = parse_json(body.decode(errors="surrogateescape"), what)
    except RigError as exc:
        raise RigError(f"{what}: the answer is not JSON (or nested absurdly deep): {body[:200]!r}") from exc
    if not isinstance(value, dict):
        raise RigError(f"{what}: the answer is not a JSON object: {body[:200]!r}")
    return value


def completion_problem(text: object) -> str | None:
    """What makes a /generate answer's text no completion, or None: none, blank, or not valid UTF-8 (bytes that
    are not UTF-8, or a lone surrogate escaped in the JSON: what no tokenizer decodes to)."""
    if text is None or isinstance(text, str) and not text.strip():
        return "empty completion"
    if not isinstance(text, str):
        return f"the text is {type(text).__name__}, not a string"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        what = f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else f"{bad!r}"
        return f"the completion is not valid UTF-8 ({what} at character {exc.start})"
    return None


def shown(text: object, most: int = 200) -> str:
    """TEXT for a report: at most MOST characters, any that are not UTF-8 written as escapes."""
    return str(text if text is not None else "")[:most].encode("utf-8", "backslashreplace").decode("utf-8")
