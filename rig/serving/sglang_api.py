"""SGLang's HTTP API as rig's smoke test and benchmark use it (stdlib only, so the
engine bundle can wait for a server on a target).

Field names follow SGLang's http_server.py and tokenizer_manager.py: /generate
returns meta_info with completion_tokens, e2e_latency and, under speculation,
spec_verify_ct (newer builds add spec_accept_length); /server_info (older
/get_server_info) carries the server's arguments and
internal_states[i].avg_spec_accept_length.
"""
from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request

from rig.core import RigError, progress
from rig.stack.spec import KEY_ENV

MAX_ANSWER = 64 << 20  # bytes: no answer rig asks for comes near it


def headers(api_key_env: str = KEY_ENV) -> dict:
    key = os.environ.get(api_key_env)
    return {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}


def generate_body(prompt: str, max_tokens: int, stream: bool) -> dict:
    # ignore_eos: every request generates exactly max_tokens, so runs compare like for like
    return {"text": prompt, "stream": stream,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}}


def number(value) -> float | None:
    """A positive number from a server's answer, or None: answers are input, never trusted to be well formed
    (a 400-digit integer is no float)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        found = float(value)
    except OverflowError:
        return None
    return found if 0 < found < float("inf") else None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """SGLang never redirects: a 3xx is answered as it is, so the API key never travels to another origin."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _read(response, deadline: float) -> bytes | None:
    """The answer's body, read as it arrives until DEADLINE (the timeout is for the whole answer, not per
    read: a server that sends a byte every half second ends with it); None past the deadline."""
    chunks, size = [], 0
    while chunk := response.read1(1 << 16):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_ANSWER or time.monotonic() > deadline:
            break
    if time.monotonic() > deadline:
        return None
    return b"".join(chunks)


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
    """(HTTP status, body); status 0 when nothing answered."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url.rstrip("/") + path, data=data, headers=headers(api_key_env),
                                     method="POST" if data is not None else "GET")
    deadline = time.monotonic() + timeout
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            answer = _read(response, deadline)
            if answer is None:
                return 0, f"no whole answer within {timeout:g} s".encode()
            if len(answer) > MAX_ANSWER:
                return 0, f"an answer larger than {MAX_ANSWER >> 20} MiB".encode()
            return response.status, answer
    except urllib.error.HTTPError as exc:  # an error answer's body is read under the same deadline
        answered = _read(exc, deadline)
        return exc.code, (f"no whole answer within {timeout:g} s".encode() if answered is None
                          else answered[:MAX_ANSWER])
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # a cut or garbled answer too
        return 0, str(getattr(exc, "reason", exc) or type(exc).__name__).encode()


def server_info(url: str, api_key_env: str = KEY_ENV) -> dict:
    """The server's arguments and internal state; {} when neither spelling answers."""
    for path in ("/server_info", "/get_server_info"):
        status, body = call(url, path, api_key_env=api_key_env)
        if status == 200:
            try:
                info = json.loads(body)
            except (ValueError, RecursionError):
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
    return sum(values) / len(values) if values else None


def expect_json(status: int, body: bytes, what: str) -> dict:
    if status != 200:
        raise RigError(f"{what}: HTTP {status or 'no answer'}: {body[:300].decode(errors='replace')}")
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise RigError(f"{what}: the answer is not JSON (or nested absurdly deep): {body[:200]!r}") from exc
    if not isinstance(value, dict):
        raise RigError(f"{what}: the answer is not a JSON object: {body[:200]!r}")
    return value
