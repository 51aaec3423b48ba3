"""Hostile and careless input, generated: stack files, locks, patch files, state records, URLs,
concurrency lists, numbers and server answers, each through the real command line.

Every property asserts the same contract: rig exits 0 (the input was fine) or with
one `rig: error:` line and exit 2 (never a traceback, never 70, rig's own defect),
and nothing is written outside the example's scratch directory. Writes are seen by
a Python audit hook on every open-for-writing, rename, removal and mkdir, so the
check does not rely on rig's cooperation.

`scripts/bench.py hostile` runs this module and reports how many cases it tried.
"""
from __future__ import annotations

import contextlib
import copy
import http.server
import io
import json
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rig.cli import main
from rig.python.lock import lock_hash

TRIED = {"cases": 0, "held": 0}
# derandomized and without a database: the same cases on every run, nothing kept between runs
FUZZ = settings(max_examples=int(os.environ.get("RIG_FUZZ_EXAMPLES", "100")), deadline=None, derandomize=True,
                database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ------------------------------------------------------------------ the harness

_WATCH: dict = {"root": None, "outside": []}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _audit(event: str, args: tuple) -> None:
    root = _WATCH["root"]
    if root is None:
        return
    paths: list = []
    if event == "open" and len(args) >= 3:
        path, mode, flags = args[0], args[1], args[2]
        writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & WRITE_FLAGS)
        paths = [path] if writing else []
    elif event in ("os.rename", "os.replace"):
        paths = list(args[:2])
    elif event in ("os.symlink", "os.link"):  # (what it points at, the new name): only the name is written
        paths = [args[1]]
    elif event in ("os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.truncate", "shutil.rmtree"):
        paths = [args[0]]
    for path in paths:
        if isinstance(path, int):  # a file descriptor rig already holds
            continue
        text = os.fsdecode(path)
        if text.startswith("/dev/") or "__pycache__" in text:
            continue
        resolved = os.path.realpath(text)
        if not (resolved == root or resolved.startswith(root + os.sep)):
            _WATCH["outside"].append(f"{event} {text}")


sys.addaudithook(_audit)

# matplotlib (rig bench's plots) writes its font cache on first import: build it now, in a directory of
# its own, so that cases see only what rig itself writes
os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="rig-fuzz-matplotlib-")
import matplotlib.font_manager  # noqa: E402,F401


@contextlib.contextmanager
def scratch():
    """A fresh directory; every temporary file lands in it; any write outside it is recorded."""
    with tempfile.TemporaryDirectory(prefix="rig-fuzz-") as tmp:
        root = os.path.realpath(tmp)
        saved = tempfile.tempdir
        tempfile.tempdir = root
        _WATCH.update(root=root, outside=[])
        try:
            yield Path(root)
        finally:
            _WATCH["root"] = None
            tempfile.tempdir = saved


def rig(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    return code, out.getvalue(), err.getvalue()


def holds(code: int, err: str, allowed: tuple = (0, 2)) -> None:
    """The contract; counted, so the reliability report says how many cases held."""
    TRIED["cases"] += 1
    errors = [line for line in err.splitlines() if line.startswith("rig: error:")]
    assert code in allowed, f"exit {code}: {err[-2000:]}"
    assert "Traceback" not in err, err[-2000:]
    if code == 2:
        assert len(errors) == 1, err[-2000:]
    assert not _WATCH["outside"], f"wrote outside its scratch: {_WATCH['outside'][:5]}"
    TRIED["held"] += 1


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if os.environ.get("RIG_FUZZ_REPORT"):
        Path(os.environ["RIG_FUZZ_REPORT"]).write_text(json.dumps(TRIED))


# ------------------------------------------------------------------ what hostile input looks like

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() |
           st.text(max_size=40) | st.sampled_from(["../../etc/passwd", "/etc/shadow", "a\nb", "x\0y", "%n$x",
                                                   "${SGLANG_API_KEY}", "13.0.2", "0", "-1", "1e999", "*"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) |
                      st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from _paths(value, (*prefix, index))


def mutate(data, doc):
    """DOC with one place replaced, removed or given an extra key: a careless or hostile edit."""
    doc = copy.deepcopy(doc)
    where = data.draw(st.sampled_from(list(_paths(doc))[1:]))
    parent = doc
    for key in where[:-1]:
        parent = parent[key]
    action = data.draw(st.sampled_from(["replace", "remove", "extra"]))
    if action == "remove":
        del parent[where[-1]]
    elif action == "extra" and isinstance(parent, dict):
        parent[data.draw(st.text(min_size=1, max_size=8))] = data.draw(values)
    else:
        parent[where[-1]] = data.draw(values)
    return doc


YAML_ATTACKS = [
    "[" * 5000, "a: &a [" + ",".join(["*a"] * 3) + "]", "name: x\nname: y\n",
    "a: &x [1,2,3,4,5,6,7,8,9]\nb: &y [*x,*x,*x,*x,*x,*x,*x,*x,*x]\nc: [*y,*y,*y,*y,*y,*y,*y,*y,*y]\n",
    "!!python/object/apply:os.system ['id']", "name: !!binary aGVsbG8=", "? [a]\n: b\n", "\t\x00", "",
    "name: " + "x" * 100000, "? !!set {a: 1}\n: b\n", "? [1, 2]\n: b\n",
    "cuda: {version: 13.0.2}\nname: ok\n" + "extra_packages: [" + "a," * 2000 + "]",
]


def _stack() -> dict:
    return yaml.safe_load((REPO / "stacks" / "default.yml").read_text())


def _lock() -> dict:
    return json.loads((REPO / "roles" / "python_stack" / "molecule" / "default" / "tiny.lock").read_text())


def _patch() -> dict:
    return yaml.safe_load((REPO / "rig" / "patches" / "set" / "sglang-fusion-gate-sm120.yml").read_text())


def _write(path: Path, content) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, errors="surrogateescape")
    else:
        path.write_text(yaml.safe_dump(content, allow_unicode=True))
    return path


# ------------------------------------------------------------------ stack files

@FUZZ
@given(data=st.data())
def test_an_edited_stack_file_is_taken_or_refused_cleanly(data):
    doc = mutate(data, _stack())  # drawn before the scratch window: hypothesis keeps its own files
    with scratch() as tmp:
        stack = _write(tmp / "s.yml", doc)
        holds(*rig("stack", "show", str(stack))[::2])
        holds(*rig("stack", "vars", str(stack), "--out", str(tmp / "vars.json"))[::2])


@FUZZ
@given(content=st.binary(max_size=300) | st.text(max_size=300) | st.sampled_from(YAML_ATTACKS))
def test_any_bytes_as_a_stack_file_are_refused_cleanly(content):
    with scratch() as tmp:
        stack = _write(tmp / "s.yml", content)
        holds(*rig("lock", "--check", str(stack))[::2], allowed=(2,))


# ------------------------------------------------------------------ locks

@FUZZ
@given(data=st.data(), rehash=st.booleans())
def test_an_edited_lock_is_refused_before_any_file_is_touched(data, rehash):
    """The lock hash is a checksum anyone can recompute: a rehashed lock is still input."""
    lock = mutate(data, _lock())
    with scratch() as tmp:
        if rehash and isinstance(lock, dict):
            lock["lock_hash"] = lock_hash(lock)
        path = tmp / "l.lock"
        path.write_text(json.dumps(lock))
        # export is offline: the empty cache lacks every wheel, so a lock that still names one ends in exit 2
        code, _, err = rig("wheelhouse", "export", str(path), str(tmp / "out"), "--cache", str(tmp / "cache"))
        holds(code, err)
        assert code == 2 or lock["wheels"] == []


@FUZZ
@given(content=st.binary(max_size=200) | st.sampled_from(["[]", "{}", "null", '{"wheels": {}}', "[" * 100000,
                                                            '{"a": 1, "a": 2}', "1e999999"]))
def test_any_bytes_as_a_lock_are_refused_cleanly(content):
    with scratch() as tmp:
        path = _write(tmp / "l.lock", content)
        holds(*rig("wheelhouse", "export", str(path), str(tmp / "out"), "--cache", str(tmp / "c"))[::2],
              allowed=(2,))


# ------------------------------------------------------------------ patch files

@FUZZ
@given(data=st.data())
def test_an_edited_patch_file_is_taken_or_refused_cleanly(data):
    patch = mutate(data, _patch())
    with scratch() as tmp:
        name = patch.get("id") if isinstance(patch.get("id"), str) and "/" not in patch["id"] else "p"
        _write(tmp / f"{name or 'p'}.yml"[-60:].lstrip("/") or "p.yml", patch)
        holds(*rig("patch", "status", "--patches", str(tmp), "--python", sys.executable)[::2])


# ------------------------------------------------------------------ state records

@FUZZ
@given(record=values, name=st.sampled_from(["cuda-default", "marker"]))
def test_a_tampered_state_record_is_refused_and_nothing_moves(record, name):
    with scratch() as tmp:
        prefix, state = tmp / "prefix", tmp / "state"
        (prefix / "cuda-13.0" / "bin").mkdir(parents=True)
        holds(*rig("cuda", "default", "--version", "13.0.2", "--prefix", str(prefix),
                   "--state-dir", str(state))[::2], allowed=(0,))
        if name == "marker":
            _write(prefix / "cuda-13.0" / ".rig-toolkit.json", json.dumps(record))
            code, _, err = rig("cuda", "install", "--version", "13.0.2", "--prefix", str(prefix), "--check")
            holds(code, err)
        else:
            _write(next(state.iterdir()), json.dumps(record))
            code, _, err = rig("cuda", "rollback", "--prefix", str(prefix), "--state-dir", str(state))
            holds(code, err)
            assert os.readlink(prefix / "cuda") in ("cuda-13.0",) or code == 0


@FUZZ
@given(marker=values)
def test_a_tampered_venv_marker_is_refused_cleanly(marker):
    with scratch() as tmp:
        (tmp / "venv" / "bin").mkdir(parents=True)
        (tmp / "venv" / "bin" / "python").symlink_to(sys.executable)
        _write(tmp / "venv" / ".rig-stack.json", json.dumps(marker))
        holds(*rig("venv", "verify", "--venv", str(tmp / "venv"))[::2], allowed=(0, 1, 2))


RESULTS = {"plan": {}, "runs": [{"label": "baseline", "url": "http://127.0.0.1:30001",
                                  "speculative_algorithm": None,
                                  "serial": {"runs": 3, "tok_s": [48.0, 50.0, 51.5], "median": 50.0, "min": 48.0,
                                             "max": 51.5},
                                  "stopped": None, "levels": [
    {"concurrency": 1, "throughput": 50.0, "round_throughput": [49.0, 50.0, 51.0], "requests": 30, "failed": 0,
     "accept_length": None, "ttft_s": {"p50": 0.1, "p90": 0.2, "p99": 0.3}, "e2e_s": {"p50": 1.0},
     "tpot_s": {"p50": 0.02}, "per_request_speed": {"p50": 50.0}}]}]}


@FUZZ
@given(data=st.data())
def test_an_edited_baseline_results_file_is_refused_or_taken_cleanly(data):
    results = mutate(data, RESULTS)
    with scratch() as tmp:
        path = tmp / "results.json"
        path.write_text(json.dumps(results))
        # a results file that passes goes on to the server under test: nothing listens there, so the run
        # stops and keeps what it has (exit 1, its report written)
        code, _, err = rig("bench", "--url", "http://127.0.0.1:9", "--baseline-results", str(path), "--concurrency",
                           "1", "--out", str(tmp / "out"))
        holds(code, err, allowed=(1, 2))
        assert (code == 1) == (tmp / "out" / "report.md").exists()


# ------------------------------------------------------------------ command-line values

@FUZZ
@given(url=st.text(max_size=40) | st.sampled_from(["http://[::1", "http://h:99999", "ftp://x", "http://", "//x",
                                                   "http://a b", "http://x\n", "file:///etc/passwd"]),
       concurrency=st.text(max_size=12) | st.sampled_from(["0", "-1", ",", "1,,2", "1e3", "99999999999"]),
       number=st.sampled_from(["0", "-5", "nan", "inf", "1e400", "x", "", "3"]))
def test_bench_options_are_refused_before_any_request(url, concurrency, number):
    with scratch() as tmp:
        code, _, err = rig("bench", "--url", url, "--concurrency", concurrency, "--max-tokens", number,
                           "--rounds", number, "--out", str(tmp / "out"))
        # a plan that passes every check goes on to the server: nothing listens there (exit 1, report kept)
        holds(code, err, allowed=(1, 2))


@FUZZ
@given(timeout=st.sampled_from(["-1", "0", "nan", "inf", "1e400", "x", ""]),
       tokens=st.sampled_from(["0", "-3", "99999999999", "x", "1"]))
def test_smoke_numbers_are_refused_before_any_wait(timeout, tokens):
    with scratch():
        holds(*rig("smoke", "--url", "http://127.0.0.1:9", "--timeout", timeout, "--max-tokens", tokens,
                   "--request-timeout", timeout)[::2], allowed=(2,))


# ------------------------------------------------------------------ server answers

class _Answers(http.server.BaseHTTPRequestHandler):
    body: bytes = b""
    status: int = 200

    def _answer(self):
        if self.path in ("/health", "/health_generate"):
            self.send_response(200)
            self.end_headers()
            return
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(type(self).body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def answering():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


answers = (st.builds(lambda v: json.dumps(v).encode(), values) | st.binary(max_size=200) |
           st.sampled_from([b"<html><body>502 Bad Gateway</body></html>", b"[]", b"null", b'{"text": 5}',
                            b'{"text": "ok", "meta_info": []}', b'{"text": "ok", "meta_info": {"completion_tokens": '
                            b'-1}}', b'{"text": "x", "meta_info": {"completion_tokens": 8, "spec_verify_ct": 0}}',
                            b'{"internal_states": [1, null, {"avg_spec_accept_length": "x"}]}']))


@settings(FUZZ, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=answers, status=st.sampled_from([200, 200, 400, 500]))
def test_any_server_answer_is_judged_not_crashed_on(answering, body, status):
    _Answers.body, _Answers.status = body, status
    with scratch():
        code, _, err = rig("smoke", "--url", answering, "--timeout", "5", "--request-timeout", "5",
                           "--max-tokens", "8", "--json")
        holds(code, err, allowed=(0, 1, 2))
        if code == 0:  # only a well-formed completion of 1..8 tokens passes
            answer = json.loads(body)
            assert status == 200 and str(answer["text"]).strip() and 0 < answer["meta_info"]["completion_tokens"] <= 8
