"""`rig smoke`: is the server up, does it generate, and does speculation happen?"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from rig.core import RigError, http, progress
from rig.core.fs import read_tail
from rig.machine.log_doctor import known_failures
from rig.serving.sglang_api import (
    KEY_ENV,
    accept_length,
    call,
    completion_problem,
    context_length,
    expect_json,
    generate_body,
    number,
    server_accept_length,
    server_info,
    shown,
)

# Below this a draft costs more than it saves: seen as 1.02 with a draft that proposes the wrong token
# (rig testmodel --draft random on an H200, docs/validation/serving-h200/).
MIN_ACCEPT_LENGTH = 1.1
PROMPTS = ("The capital of France is", "Write a haiku about GPUs.", "List three prime numbers:")


KNOWN_LINES = 200  # a server's traceback and what it printed before it: where its own failure is named


def log_tail(log: str | None, lines: int = 20) -> str:
    """The last LINES lines of a server's log for an error message; nothing when there is no such file."""
    if not log:
        return ""
    try:
        data, _ = read_tail(log, "log", 1 << 20)
    except (RigError, OSError):
        return ""
    recent = data.decode(errors="replace").splitlines()[-KNOWN_LINES:]
    tail = recent[-lines:]
    # what `rig doctor --log` knows of the last lines alone: a unit's log holds its earlier starts' failures too
    known = "".join(f"\nknown failure {f['rule']}, line {f['line'] - len(recent) - 1} from the end: {f['cause']}"
                    f"\n  fix: {f['fix']}" for f in known_failures("\n".join(recent)))
    return f"\nlast {len(tail)} lines of {log}:\n" + "\n".join(tail) + known


def alive(pid: int) -> bool:
    """Whether process PID still runs (a zombie has exited: its parent has not reaped it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def wait_healthy(url: str, timeout: float, log: str | None = None, api_key_env: str = KEY_ENV,
                 every: float = 10.0, pid: int | None = None) -> float:
    """Poll /health_generate until 200; SGLang answers 503 while it loads (minutes for big models).

    With PID (the server's process; systemd's $MAINPID), stop waiting as soon as it has exited."""
    if timeout <= 0:
        raise RigError(f"--timeout {timeout}: give a positive number of seconds")
    start = last_said = time.monotonic()
    status, body, answered = 0, b"", False
    while (waited := time.monotonic() - start) < timeout:
        status, body = call(url, "/health_generate", timeout=max(0.5, min(30.0, timeout - waited)),
                            api_key_env=api_key_env)
        answered = answered or bool(status)
        if status == 200:
            return waited
        if http.redirected(status):  # never followed, so never healthy: no use waiting out the timeout
            raise RigError(f"{url}/health_generate answered HTTP {status}, {body.decode(errors='replace')}")
        if pid is not None and not alive(pid):
            raise RigError(f"the server (process {pid}) exited after {waited:.0f} s, before {url} was healthy; "
                           "its log says why" + log_tail(log))
        if time.monotonic() - last_said >= every:
            last_said = time.monotonic()
            answer = f"HTTP {status}" if status else body.decode(errors="replace")
            progress(f"waiting for {url}/health_generate: {answer} ({waited:.0f} s of {timeout:.0f} s)")
        time.sleep(min(1.0, max(0.0, timeout - waited)))
    if not answered:  # nothing listened: no model was loading there
        raise RigError(f"nothing answered at {url} within {timeout:.0f} s (last: {body.decode(errors='replace')})"
                       + log_tail(log), hint="start the server, or give the --url it listens on")
    answer = f"HTTP {status}" if status else f"no answer ({body.decode(errors='replace')})"
    raise RigError(f"{url} was not healthy within {timeout:.0f} s: last {answer}; a big model takes about "
                   f"10 minutes to load, so raise --timeout or read the server's log" + log_tail(log))


def _one(url: str, prompt: str, max_tokens: int, api_key_env: str, timeout: float) -> dict:
    status, body = call(url, "/generate", generate_body(prompt, max_tokens, stream=False), timeout=timeout,
                        api_key_env=api_key_env)
    out = expect_json(status, body, f"POST {url}/generate")
    meta_info = out.get("meta_info")
    meta: dict = meta_info if isinstance(meta_info, dict) else {}
    problems = []
    if wrong := completion_problem(out.get("text")):
        problems.append(wrong)
    tokens = meta.get("completion_tokens")
    if not isinstance(tokens, int) or not 0 < tokens <= max_tokens:
        problems.append(f"completion_tokens {tokens!r} is not within 1..{max_tokens}")
    elif isinstance(out.get("output_ids"), list) and len(out["output_ids"]) != tokens:
        problems.append(f"completion_tokens {tokens} disagrees with {len(out['output_ids'])} output_ids")
    return {"prompt": prompt, "ok": not problems, "problems": problems, "completion_tokens": tokens,
            "prompt_tokens": meta.get("prompt_tokens"), "e2e_latency": number(meta.get("e2e_latency")),
            "accept_length": accept_length(meta) if isinstance(tokens, int) else None,
            "text": shown(out.get("text"))}


def run(url: str, timeout: float = 900.0, max_tokens: int = 64, log: str | None = None,
        speculation: bool | None = None, api_key_env: str = KEY_ENV, pid: int | None = None,
        request_timeout: float = 300.0, min_accept_length: float | None = MIN_ACCEPT_LENGTH) -> dict:
    """Wait for health, generate, check; speculation=None reads whether it is configured from /server_info.
    min_accept_length=None reports the accept length without judging it."""
    if not 0 < max_tokens <= 1 << 20:
        raise RigError(f"--max-tokens {max_tokens}: give a positive number of tokens")
    waited = wait_healthy(url, timeout, log, api_key_env, pid=pid)
    info = server_info(url, api_key_env)
    if speculation is None:
        speculation = bool(info.get("speculative_algorithm"))
    try:
        results = [_one(url, prompt, max_tokens, api_key_env, request_timeout) for prompt in PROMPTS]
    except RigError as exc:
        raise RigError(f"{exc}{log_tail(log)}") from exc
    problems = [f"{r['prompt']!r}: {p}" for r in results for p in r["problems"]]
    spec: dict[str, Any] | None = None
    if speculation:
        lengths = [r["accept_length"] for r in results if r["accept_length"]]
        source = "meta_info"
        if not lengths:  # builds whose meta_info lacks it still report the server's average
            lengths, source = [v for v in [server_accept_length(server_info(url, api_key_env))] if v], "/server_info"
        average = sum(lengths) / len(lengths) if lengths else None
        spec = {"accept_length": average, "source": source}
        if average is None:  # no lengths
            problems.append("speculation is configured but no request was speculative "
                            "(no spec_verify_ct in meta_info, no avg_spec_accept_length in /server_info)")
        elif min_accept_length is not None and average < min_accept_length:
            problems.append(f"accept length {average:.2f} (below {min_accept_length}): the target "
                            "accepted almost no draft token; check the draft model matches the target")
    ok = not problems
    summary = (f"{url}: healthy after {waited:.0f} s, {len(results)} completions"
               + (f", accept length {spec['accept_length']:.2f} ({spec['source']})"
                  if spec and spec["accept_length"] else "")
               + ("" if ok else "; FAILED: " + "; ".join(problems)))
    return {"ok": ok, "url": url, "health_wait_s": round(waited, 1), "speculation": spec,
            "speculative_algorithm": info.get("speculative_algorithm"), "context_length": context_length(info),
            "requests": results, "problems": problems, "msg": summary}
