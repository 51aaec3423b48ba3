"""The load generator: SGLang's streaming /generate as a client sees it, closed loop or Poisson.

A request the server refuses (HTTP 4xx, or an error chunk inside a 200 stream, as SGLang answers a streamed
request it rejects) is a failed request with the server's reason, and the run goes on; only a server that stops
answering ends it (ServerDown), or one that redirects (Redirected: never followed, so nothing is measured there).
Every request has two limits besides the read timeout (silence): a whole-request deadline and a chunk count (each
chunk carries at least one token, so a stream of more chunks than the tokens asked for is a server going on past
max_new_tokens). The client parses only the first and the last chunk in full: SGLang's chunks carry the
cumulative output, so parsing each would make the client, not the server, the limit at high concurrency. aiohttp,
not rig.core.http: hundreds of streams at once need an event loop; its pool is sized to the requests in flight,
so it never caps a level below what it claims.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from rig.core import RigError, http
from rig.core.documents import parse_json
from rig.serving.measure.plan import Plan
from rig.serving.sglang_api import accept_length, call, headers, number

MAX_REQUESTS = 100_000  # one level's bound, whatever min_seconds says


class ServerDown(Exception):
    """Nothing answers at the URL any more: the run stops."""


class Redirected(ServerDown):
    """The server answers with a redirect, which is never followed: nothing can be measured at the URL."""


class Oversized(Exception):
    """An event longer than any answer to the request could be."""


async def _events(response, most: int):
    """SSE events (the bytes after "data:"), however the chunks are cut; an event longer than MOST bytes ends it."""
    buffer = b""
    async for data in response.content.iter_any():
        buffer += data
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            if event.startswith(b"data:"):
                yield event[5:].strip()
        if len(buffer) > most:
            raise Oversized(f"an event of more than {most} bytes")


def _asked_tokens(body: dict) -> int:
    return int(body.get("sampling_params", {}).get("max_new_tokens") or 1)


@dataclass
class _Chunks:
    """What one stream has brought so far: its first and last chunk (the only ones parsed in full), each chunk's
    arrival, and whether [DONE] came; at most MOST chunks."""
    start: float
    most: int
    first: bytes | None = None
    last: bytes | None = None
    ttft: float | None = None
    done: bool = False
    arrivals: list[float] = field(default_factory=list)  # the inter-token latencies (a chunk may carry several)


async def stream(session, url: str, body: dict, decoding: Callable[[], None] | None = None) -> dict:
    """One streamed /generate: timings from the client's clock, counts from the last chunk; DECODING is called
    at its first chunk (the request has left prefill)."""
    import aiohttp

    # one more chunk than tokens, for a final chunk that repeats the last
    chunks = _Chunks(start=time.perf_counter(), most=_asked_tokens(body) + 1)
    try:
        # a redirect is answered as it is: followed, the request (and its API key) would reach another origin
        async with session.post(url + "/generate", json=body, allow_redirects=False) as response:
            if http.redirected(response.status):  # answered at once, its body unread (a server need never end it)
                raise Redirected(f"HTTP {response.status} {http.redirect_note(response.headers.get('Location'))}")
            if response.status != 200:
                return refused(response.status, await response.content.read(65536))
            if failed := await _read(response, chunks, decoding):
                return failed
    except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
        raise ServerDown(str(exc)) from exc
    except asyncio.TimeoutError:  # a server that accepts and never answers is as good as gone
        return {"ok": False, "lost": True, "error": "no data within the read timeout"}
    except Oversized as exc:
        return {"ok": False, "error": f"malformed stream: {exc}"}
    except (aiohttp.ClientError, ConnectionError) as exc:
        return {"ok": False, "lost": True, "error": f"connection lost: {exc.__class__.__name__}: {exc}"}
    return _measured(chunks, time.perf_counter())


async def _read(response, chunks: _Chunks, decoding: Callable[[], None] | None) -> dict | None:
    """The stream's chunks into CHUNKS until [DONE]; a failed request's answer where a chunk is not one."""
    # SGLang's chunks carry the cumulative text: a token is a few bytes of text and of ids
    async for payload in _events(response, max(1 << 20, 64 * chunks.most)):
        if payload == b"[DONE]":
            chunks.done = True
            return None
        # a cheap shape check on every chunk; full parsing of the first and last only
        if not (payload.startswith(b"{") and payload.endswith(b"}")):
            return {"ok": False, "error": f"malformed chunk: {payload[:80]!r}"}
        chunks.arrivals.append(time.perf_counter())
        if len(chunks.arrivals) > chunks.most:
            return {"ok": False, "error": f"the server streamed more than {chunks.most} chunks for "
                    f"{chunks.most - 1} tokens (max_new_tokens): it went on past the request's end"}
        if chunks.first is None:
            chunks.first, chunks.ttft = payload, chunks.arrivals[-1] - chunks.start
            if decoding:
                decoding()
        chunks.last = payload
    return None


def _measured(chunks: _Chunks, end: float) -> dict:
    """A finished stream's request: its timings, and its counts from the last chunk."""
    first, last, ttft, start = chunks.first, chunks.last, chunks.ttft, chunks.start
    if not chunks.done or first is None or last is None or ttft is None:  # the first chunk sets all three
        return {"ok": False, "lost": True, "error": "the stream ended before [DONE] (the server closed it)"}
    try:
        parse_json(first.decode(errors="replace"), "the first chunk")
        final = parse_json(last.decode(errors="replace"), "the last chunk")
        if "error" in final:  # SGLang refuses a streamed request inside the stream: HTTP 200, one error chunk
            return refused(200, last)
        meta = final["meta_info"]
        tokens = number(meta["completion_tokens"])
        if tokens is None or tokens != int(tokens) or tokens > chunks.most - 1:  # no more than asked for
            raise ValueError(f"completion_tokens {str(meta['completion_tokens'])[:40]}")
        prompt_tokens = number(meta.get("prompt_tokens")) or 0
    except (RigError, ValueError, KeyError, TypeError) as exc:
        return {"ok": False, "error": f"malformed chunk: {exc.__class__.__name__}: {str(exc)[:200]}"}
    e2e = end - start
    tokens = int(tokens)
    arrivals = chunks.arrivals
    return {"ok": True, "tokens": tokens, "prompt_tokens": int(prompt_tokens), "start": start, "end": end,
            "ttft": ttft, "e2e": e2e, "tpot": (e2e - ttft) / (tokens - 1) if tokens > 1 else None,
            "itl": [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)],
            "speed": tokens / e2e if e2e > 0 else None, "accept_length": accept_length(meta)}


async def limited(session, url: str, body: dict, deadline: float, decoding: Callable[[], None] | None = None) -> dict:
    """stream() within a whole-request DEADLINE (seconds): a server that streams on forever fails it."""
    try:
        return await asyncio.wait_for(stream(session, url, body, decoding), deadline)
    except asyncio.TimeoutError:
        return {"ok": False, "error": f"the request took longer than the request timeout ({deadline:g} s)"}


def refused(status: int, body: bytes) -> dict:
    """A request the server answered but would not serve; its reason as SGLang gives it ({"error": {"message"}})."""
    reason = body[:300].decode(errors="replace")
    try:
        error = parse_json(body.decode(errors="replace"), "the refusal")["error"]
        reason = str(error.get("message", error) if isinstance(error, dict) else error)[:300]
    except (RigError, KeyError, TypeError):
        pass
    kind = "refused" if 400 <= status < 500 or status == 200 else "server error"
    return {"ok": False, "refused": kind == "refused", "error": f"{kind} (HTTP {status}): {reason}"}


def session(plan: Plan, api_key_env: str, limit: int):
    import aiohttp

    return aiohttp.ClientSession(
        headers=headers(api_key_env),
        connector=aiohttp.TCPConnector(limit=limit, force_close=False),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=plan.read_timeout))


async def run_requests(url: str, plan: Plan, api_key_env: str, body_for: Callable[[int], dict], n: int,
                       concurrency: int, rate: float | None = None, min_seconds: float | None = None,
                       when_full: Callable[..., Coroutine[Any, Any, None]] | None = None,
                       full_at: int | None = None) -> list[dict]:
    """Send BODY_FOR(i) for i = 0, 1, ... until N are sent and MIN_SECONDS (the plan's) have passed.

    Closed loop (no RATE): CONCURRENCY requests kept in flight. Open loop: Poisson arrivals at RATE per
    second (seeded by plan.seed), at most CONCURRENCY in flight, as sglang.bench_serving's
    --request-rate with --max-concurrency. WHEN_FULL(client) runs once, the first time FULL_AT streams (default
    CONCURRENCY; fewer where the server caps its running requests) are decoding at once: a profile of a full
    batch."""
    results: list[dict] = []
    down: list[str] = []
    began = time.perf_counter()
    sent = 0
    lasting = plan.min_seconds if min_seconds is None else min_seconds
    decoding, fired = 0, False
    beside: list[asyncio.Task] = []

    def more() -> bool:
        return not down and sent < MAX_REQUESTS and (sent < n or time.perf_counter() - began < lasting)

    async def one(client, i: int) -> None:
        nonlocal decoding
        seen = []

        def started() -> None:
            nonlocal decoding, fired
            seen.append(True)
            decoding += 1
            if when_full and not fired and decoding >= (full_at or concurrency):
                fired = True
                beside.append(asyncio.create_task(when_full(client)))

        try:
            results.append(await limited(client, url, body_for(i), plan.request_timeout, started))
        except ServerDown as exc:  # no more requests: each would end the same way
            down.append(str(exc))
            results.append({"ok": False, "error": str(exc) if isinstance(exc, Redirected) else
                            f"server unreachable: {exc}"})
        finally:
            decoding -= len(seen)

    async with session(plan, api_key_env, concurrency) as client:
        if rate is None:
            async def worker() -> None:
                nonlocal sent
                while more():
                    sent += 1
                    await one(client, sent - 1)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            await asyncio.gather(*beside)
        else:
            arrivals = random.Random(plan.seed)
            slots = asyncio.Semaphore(concurrency)
            tasks = []
            due = began

            async def in_slot(i: int) -> None:
                async with slots:
                    await one(client, i)

            while more():
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                tasks.append(asyncio.create_task(in_slot(sent)))
                sent += 1
                due += arrivals.expovariate(rate)
            await asyncio.gather(*tasks, *beside)
    return results


def flush(url: str, api_key_env: str, wait: float = 60.0) -> None:
    """Empty the prefix cache and the acceptance counters; SGLang refuses (400) while requests run."""
    deadline = time.monotonic() + wait
    while True:
        status, body = call(url, "/flush_cache", body={}, api_key_env=api_key_env)
        if status in (200, 404):  # 404: a server without the endpoint; nothing to flush
            return
        if status == 0:
            raise ServerDown(body.decode(errors="replace"))
        if http.redirected(status):  # it will redirect until the deadline: say so now
            raise RigError(f"{url}/flush_cache answered HTTP {status}, {body.decode(errors='replace')}")
        if time.monotonic() > deadline:
            raise RigError(f"{url}/flush_cache kept answering HTTP {status}: {body[:200]!r}")
        time.sleep(0.5)


def down_if_lost(results: list[dict]) -> None:
    """Every request lost its connection or timed out: nothing answers any more. Refusals are answers."""
    if results and all(r.get("lost") for r in results):
        raise ServerDown(results[-1]["error"])
