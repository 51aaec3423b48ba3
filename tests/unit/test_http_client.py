"""rig's one HTTP client (rig.core.http, under rig.serving.sglang_api.call and every download) against a
hostile server: it never follows a redirect (so the API key never reaches another origin), its timeout bounds
the whole answer, no answer is read past its limit, and numbers no float can hold are not numbers. Each case
was an outside attack's on this tree."""
import http.server
import os
import threading
import time

import pytest

from rig.serving.sglang_api import call, context_length, number, server_accept_length

SEEN: list[tuple[int, str, str | None]] = []  # (port, path, Authorization) of every request a server got


class Hostile(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *args):
        pass

    def do_POST(self):  # the bench client's /generate
        self.do_GET()

    def do_GET(self):
        SEEN.append((self.server.server_port, self.path, self.headers.get("Authorization")))
        mode = self.server.mode
        if mode == "redirect":
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.elsewhere}{self.path}")
            self.end_headers()
        elif mode == "stalled redirect":  # announces a body, never sends it, holds the connection
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.elsewhere}{self.path}")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.flush()
            self.server.release.wait(120)
        elif mode in ("dribble", "dribbled error"):
            self.send_response(200 if mode == "dribble" else 500)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(1000):
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.2)
        elif mode in ("short", "short error"):  # announces 1000 bytes, sends 10, closes
            self.send_response(200 if mode == "short" else 503)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"0123456789")
            self.wfile.flush()
            self.close_connection = True
        else:
            body = b"{}"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)


def serve(mode: str, elsewhere: int = 0):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    server.daemon_threads = True
    server.mode, server.elsewhere, server.release = mode, elsewhere, threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def servers():
    started = []
    yield lambda mode, elsewhere=0: started.append(serve(mode, elsewhere)) or started[-1]
    for server in started:
        server.release.set()
        server.shutdown()


def test_a_redirect_is_answered_as_it_is_and_the_key_never_leaves_the_origin(servers, monkeypatch):
    monkeypatch.setenv("SGLANG_API_KEY", "secret")
    other = servers("plain")
    first = servers("redirect", other.server_port)
    status, _ = call(f"http://127.0.0.1:{first.server_port}", "/health", timeout=5)
    assert status == 302
    assert [s for s in SEEN if s[0] == other.server_port] == []
    assert (first.server_port, "/health", "Bearer secret") in SEEN


def test_the_bench_client_does_not_follow_a_redirect_either(servers, monkeypatch):
    import asyncio

    from rig.serving.measure.client import Redirected, session, stream
    from rig.serving.measure.plan import plan_from

    monkeypatch.setenv("SGLANG_API_KEY", "secret")
    other = servers("plain")
    first = servers("redirect", other.server_port)

    async def one() -> dict:
        async with session(plan_from(concurrency=[1]), "SGLANG_API_KEY", 1) as client:
            return await stream(client, f"http://127.0.0.1:{first.server_port}", {"text": "hi"})

    with pytest.raises(Redirected, match="^HTTP 302 redirected to 'http://127.0.0.1:.*': rig does not follow"):
        asyncio.run(one())
    assert [s for s in SEEN if s[0] == other.server_port] == []
    assert (first.server_port, "/generate", "Bearer secret") in SEEN


def test_a_redirect_whose_body_never_comes_is_answered_at_once_by_every_client(servers, monkeypatch):
    """A redirect's body is never read: a server that announces one and holds the connection had rig's client
    wait out its timeout, the bench client its read timeout, smoke its whole health timeout and the cache flush
    a minute, request after request (the bench hung). Now each says at once that rig does not follow it, the bench
    stops sending to that URL after its first request, and the key still never leaves the origin."""
    import asyncio

    from rig.core import RigError
    from rig.serving import smoke
    from rig.serving.measure.client import Redirected, flush, run_requests, session, stream
    from rig.serving.measure.plan import plan_from

    monkeypatch.setenv("SGLANG_API_KEY", "secret")
    other = servers("plain")
    stalled = servers("stalled redirect", other.server_port)
    url = f"http://127.0.0.1:{stalled.server_port}"
    status, body = call(url, "/health", timeout=2)
    assert status == 302 and body.startswith(b"redirected to 'http://127.0.0.1:%d/health': rig does not follow"
                                             % other.server_port), body  # not b"timed out"
    plan = plan_from(concurrency=[1], read_timeout=2)

    async def one() -> dict:
        async with session(plan, "SGLANG_API_KEY", 1) as client:
            return await stream(client, url, {"text": "hi"})

    with pytest.raises(Redirected, match="^HTTP 302 redirected to"):  # not "no data within the read timeout"
        asyncio.run(one())
    sent = len([s for s in SEEN if s[0] == stalled.server_port and s[1] == "/generate"])
    results = asyncio.run(run_requests(url, plan, "SGLANG_API_KEY", lambda i: {"text": f"hi {i}"}, 20, 1))
    assert [r["ok"] for r in results] == [False] and results[0]["error"].startswith("HTTP 302 redirected to")
    assert len([s for s in SEEN if s[0] == stalled.server_port and s[1] == "/generate"]) == sent + 1
    with pytest.raises(RigError, match="/flush_cache answered HTTP 302, redirected to .*: rig does not follow"):
        flush(url, "SGLANG_API_KEY", wait=5)
    with pytest.raises(RigError, match="/health_generate answered HTTP 302, redirected to .*give the server's own"):
        smoke.wait_healthy(url, 5)
    assert [s for s in SEEN if s[0] == other.server_port] == []
    assert (stalled.server_port, "/flush_cache", "Bearer secret") in SEEN


def test_the_timeout_bounds_the_whole_answer_not_each_read(servers):
    slow = servers("dribble")  # a byte every 0.2 s: a per-read timeout of 1 s would wait 200 s
    status, body = call(f"http://127.0.0.1:{slow.server_port}", "/server_info", timeout=1.0)
    assert status == 0 and body == b"no whole answer within 1 s"


def test_an_error_answer_is_read_under_the_same_deadline(servers):
    slow = servers("dribbled error")
    status, body = call(f"http://127.0.0.1:{slow.server_port}", "/generate", timeout=1.0)
    assert status == 500 and body == b"no whole answer within 1 s"


def test_numbers_no_float_can_hold_are_no_numbers():
    huge = int("1" + "9" * 400)
    assert number(huge) is None and number(float("nan")) is None and number(True) is None and number(2) == 2.0
    assert context_length({"context_length": huge}) is None
    assert server_accept_length({"internal_states": [{"avg_spec_accept_length": huge}]}) is None


def test_an_error_body_nested_past_the_parser_is_a_reason_not_a_crash():
    from rig.serving.measure.client import refused as _refused

    refused = _refused(500, b"[" * 100_000)
    assert refused["ok"] is False and refused["error"].startswith("server error (HTTP 500): [[[")


@pytest.mark.parametrize("mode, limit, timeout, why", [
    ("redirect", 1 << 20, 5, "it answered 302"),
    ("plain", 1, 5, "an answer larger than 1 bytes"),   # the 2-byte body is over a 1-byte limit
    ("dribble", 1 << 20, 1, "no whole answer within 1 s"),
    ("dribbled error", 1 << 20, 5, "it answered 500"),
    ("short", 1 << 20, 5, "the answer ended after 10 of the 1000 bytes it announced"),
])
def test_a_download_is_refused_whole_when_the_answer_is_not_the_file(servers, tmp_path, mode, limit, timeout, why):
    import io

    from rig.core import RigError, http

    other = servers("plain")
    server = servers(mode, other.server_port)
    out = io.BytesIO()
    url = f"http://127.0.0.1:{server.server_port}/x.whl"
    with pytest.raises(RigError, match=f"could not download x.whl from {url}: {why}"):
        http.download(url, out, "x.whl", limit, timeout)
    assert [s for s in SEEN if s[0] == other.server_port] == []  # the redirect was not followed


def test_an_answer_cut_short_is_not_a_whole_answer_and_a_url_that_is_not_http_is_refused(servers, tmp_path):
    from rig.core import RigError, http

    short = servers("short")
    status, body = call(f"http://127.0.0.1:{short.server_port}", "/generate", {"text": "x"}, timeout=5)
    assert (status, body) == (0, b"the answer ended after 10 of the 1000 bytes it announced")
    loading = servers("short error")  # an error answer cut short still says its status, never raises
    status, body = call(f"http://127.0.0.1:{loading.server_port}", "/health", timeout=5)
    assert status == 503 and b"10 of the 1000" in body
    for url in ("/srv/wheels/x.whl", "ftp://host/x.whl"):
        with pytest.raises(RigError, match="is not an http\\(s\\) URL"):
            http.download(url, open(tmp_path / "out", "wb"), "x.whl", 1 << 20, 5)
    os.mkfifo(tmp_path / "fifo.whl")  # a local file:// source is read only when it is a regular file
    with pytest.raises(RigError, match="fifo.whl is not a regular file"):
        http.download(f"file://{tmp_path}/fifo.whl", open(tmp_path / "out", "wb"), "x.whl", 1 << 20, 5)


def test_schemes_are_read_as_urls_are_uppercase_http_and_every_spelling_of_a_local_file(servers, tmp_path):
    from rig.core import RigError, http

    plain = servers("plain")
    assert http.request(f"HTTP://127.0.0.1:{plain.server_port}/health", timeout=5) == (200, b"{}")
    (tmp_path / "x.whl").write_bytes(b"wheel")
    for url in (f"file://{tmp_path}/x.whl", f"file://localhost{tmp_path}/x.whl", f"file:{tmp_path}/x.whl",
                f"FILE://{tmp_path}/x.whl"):
        out = tmp_path / "out"
        with open(out, "wb") as handle:
            http.download(url, handle, "x.whl", 1 << 20, 5)
        assert out.read_bytes() == b"wheel", url
    with pytest.raises(RigError, match="is not a file URL of this machine"):
        http.download(f"file://otherhost{tmp_path}/x.whl", open(tmp_path / "out", "wb"), "x.whl", 1 << 20, 5)
