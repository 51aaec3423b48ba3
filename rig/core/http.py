"""rig's one HTTP client, for every question it asks and every file it fetches (stdlib only: the engine
bundle runs it on targets). Answers are untrusted: a redirect is answered as it is (a key or a token never
travels to another origin) and at once, its body unread (it says nothing rig uses, and a server need never end
it), the whole answer has one deadline (error answers too; a server that sends a byte every half second ends
with it), and no answer is read past its size limit.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from rig.core import RigError, progress
from rig.core.fs import open_plain, open_regular

MAX_ANSWER = 64 << 20  # bytes: no answer rig asks a server for comes near it
IDLE = 60.0  # seconds a download may wait for its next bytes


def redirect_note(location: str | None) -> str:
    """What rig says of a redirect (rig.core.http's answers and the bench's own client): never followed."""
    to = f" to {location[:200]!r}" if location else ""
    return (f"redirected{to}: rig does not follow redirects (the request, and an API key with it, stays with the "
            "server asked); give the server's own address")


def redirected(status: int) -> bool:
    return 300 <= status < 400


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


class _Cut(Exception):
    """The answer went past its deadline or its size limit; the message says which."""


def _chunks(response, deadline: float, timeout: float, limit: int) -> Iterator[bytes]:
    """The body as it arrives, cut at LIMIT bytes or DEADLINE; one that ends short of its Content-Length (the
    server closed mid-answer: read1 then returns nothing rather than raising) is not a whole answer."""
    too_large = _Cut(f"an answer larger than {f'{limit >> 20} MiB' if limit >= 1 << 20 else f'{limit} bytes'}")
    announced = getattr(response, "length", None)
    if isinstance(announced, int) and announced > limit:
        raise too_large
    size = 0
    while chunk := response.read1(1 << 20):
        size += len(chunk)
        if size > limit:
            raise too_large
        if time.monotonic() > deadline:
            raise _Cut(f"no whole answer within {timeout:g} s")
        yield chunk
    if isinstance(announced, int) and size < announced:
        raise _Cut(f"the answer ended after {size} of the {announced} bytes it announced")


def _scheme(url: str) -> str:
    return urllib.parse.urlsplit(url).scheme.lower()


def _http_only(url: str) -> None:
    if _scheme(url) not in ("http", "https"):
        raise RigError(f"{url!r} is not an http(s) URL; give one, e.g. http://127.0.0.1:30000")


def _local_path(url: str) -> str:
    """The path a file: URL names on this machine (file:/p, file:///p, file://localhost/p), or a RigError."""
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise RigError(f"{url!r} is not a file URL of this machine; give file:///ABSOLUTE/PATH")
    return urllib.request.url2pathname(parts.path)


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "reason", exc) or type(exc).__name__)


def request(url: str, data: bytes | None = None, headers: dict | None = None, timeout: float = 30.0,
            limit: int = MAX_ANSWER) -> tuple[int, bytes]:
    """(HTTP status, body) of one request (POST when DATA is given); status 0 when nothing answered whole,
    the body then saying why."""
    _http_only(url)
    ask = urllib.request.Request(url, data=data, headers=headers or {}, method="POST" if data is not None else "GET")
    deadline = time.monotonic() + timeout
    try:
        with _OPENER.open(ask, timeout=timeout) as response:
            return response.status, b"".join(_chunks(response, deadline, timeout, limit))
    except urllib.error.HTTPError as exc:  # an error answer's body is read under the same deadline
        if redirected(exc.code):
            exc.close()
            return exc.code, redirect_note(exc.headers.get("Location")).encode()
        try:
            return exc.code, b"".join(_chunks(exc, deadline, timeout, limit))
        except _Cut as cut:
            return exc.code, str(cut).encode()
        except (OSError, http.client.HTTPException) as cut:  # reset or stalled mid-body
            return exc.code, _reason(cut).encode()
    except _Cut as cut:
        return 0, str(cut).encode()
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # a cut or garbled answer too
        return 0, _reason(exc).encode()


def download(url: str, out: BinaryIO, what: str, limit: int, timeout: float) -> None:
    """Stream URL's answer into OUT, or a RigError naming WHAT and URL: an answer other than 200, one larger
    than LIMIT bytes or shorter than it announced, none whole within TIMEOUT seconds, or IDLE seconds without
    a byte. A file:// URL is read as a local regular file (never a FIFO or a device)."""
    with answer(url, what, limit, timeout) as (_, chunks):
        for chunk in chunks:
            out.write(chunk)


@contextmanager
def answer(url: str, what: str, limit: int, timeout: float, offset: int = 0) -> Iterator[tuple[int, Iterator[bytes]]]:
    """URL's body as (the byte it starts at, its chunks), under download's rules: the one download mechanism.
    With OFFSET (a download cut short, resumed), only the bytes from OFFSET on are asked for (Range:
    bytes=OFFSET-): the body starts at OFFSET when the server sent just those (206), at 0 when it sent the
    whole file (200: it ignores ranges; the caller starts over). LIMIT bounds the whole file, not the rest."""
    deadline = time.monotonic() + timeout
    failed = f"could not download {what} from {url}"
    try:
        scheme = _scheme(url)
    except ValueError as exc:  # an unclosed [ of an IPv6 host
        raise RigError(f"{failed}: not a URL ({exc})") from None
    try:
        if scheme == "file":  # the same limit and deadline, on a local regular file
            with open_regular(_local_path(url), what) as source:
                source.seek(offset)
                yield offset, _chunks(source, deadline, timeout, limit - offset)
            return
        _http_only(url)
        ask = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
        with _OPENER.open(ask, timeout=min(timeout, IDLE)) as response:
            start = _start(response, offset)
            if start is None:
                said = response.headers.get("Content-Range")
                raise RigError(f"{failed}: it answered {response.status}" +
                               (f" with Content-Range {said[:80]!r}, not from byte {offset}" if said else ""))
            yield start, _chunks(response, deadline, timeout, limit - start)
    except _Cut as cut:
        raise RigError(f"{failed}: {cut}") from cut
    except urllib.error.HTTPError as exc:
        if redirected(exc.code):
            raise RigError(f"{failed}: it answered {exc.code}, {redirect_note(exc.headers.get('Location'))}") from exc
        raise RigError(f"{failed}: it answered {exc.code}") from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException, UnicodeError) as exc:  # idna: a host too long
        raise RigError(f"{failed}: {_reason(exc)}") from exc


def _start(response, offset: int) -> int | None:
    """Where RESPONSE's body starts in the file: 0 for a whole file (200), OFFSET for the rest asked for (206
    naming that byte); None for any other answer."""
    if response.status == 200:
        return 0
    said = re.fullmatch(r"bytes ([0-9]{1,19})-[0-9]{1,19}/([0-9]{1,19}|\*)", response.headers.get("Content-Range", ""))
    return offset if response.status == 206 and offset and said and int(said[1]) == offset else None


def resume(url: str, part: Path, what: str, size: int, timeout: float) -> str:
    """URL, a file of SIZE bytes, downloaded into PART from where an earlier download stopped; its sha256 once PART
    holds SIZE bytes. A download that fails keeps its bytes in PART to resume from, but an empty PART goes, and so
    does one no run could finish: the server's file ends before it (416), or has no byte past it."""
    try:
        made = open_plain(part, os.O_RDWR | os.O_CREAT, f"{what}'s partial download", follow=False)
    except RigError as exc:
        raise RigError(f"{exc}: rig's partial download is a plain file; remove it and pull again") from None
    with os.fdopen(made, "r+b") as handle:
        digest, have, resumed = _continued(handle, url, what, size, timeout, part)
    if have < size:  # the answer ended short of the file, as it said it would (no length, or a file)
        if have > resumed:
            raise RigError(f"{url} ended after {have} of {what}'s {size} bytes: run again to resume")
        part.unlink(missing_ok=True)
        raise RigError(f"{url} has no bytes past {have} of {what}'s {size}: the partial download is removed; pull "
                       "again, or serve the whole file there")
    return digest.hexdigest()


def _continued(handle, url: str, what: str, size: int, timeout: float, part: Path) -> tuple[Any, int, int]:
    """URL into HANDLE, the open partial download PART, from where it stops: (its digest, its bytes, the bytes it
    held before)."""
    digest, have = hashlib.sha256(), 0
    try:
        if os.fstat(handle.fileno()).st_size <= size:  # the bytes already there, hashed first
            while block := handle.read(1 << 20):
                digest.update(block)
                have += len(block)
        resumed = have
        if have < size:
            if have:
                progress(f"resuming {url} at byte {have} of {size}")
            with answer(url, what, size, timeout, offset=have) as (start, chunks):
                if start != have:  # the server sent the whole file: start over
                    handle.seek(0)
                    digest, have, resumed = hashlib.sha256(), 0, 0
                handle.truncate(have)
                for chunk in chunks:
                    digest.update(chunk)
                    handle.write(chunk)
                    have += len(chunk)
        handle.flush()
        os.fsync(handle.fileno())
    except BaseException as exc:
        shorter = isinstance(exc.__cause__, urllib.error.HTTPError) and exc.__cause__.code == 416
        try:
            handle.flush()  # what came before the failure is kept
        except OSError:
            pass
        kept = os.fstat(handle.fileno()).st_size
        if shorter or not kept:
            part.unlink(missing_ok=True)
        if shorter:
            raise RigError(f"{exc}: {what} there ends before byte {have}, where the partial download stopped; "
                           "the partial download is removed: pull again") from None
        if kept and isinstance(exc, RigError):
            raise RigError(f"{exc}; the {kept} bytes pulled are kept: run again to resume") from exc
        raise
    return digest, have, resumed
