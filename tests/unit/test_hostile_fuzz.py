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

import atexit
import contextlib
import copy
import http.server
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import yaml
from harness.paths import REPO
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
    nofollow = False  # the last component is not followed: a link there is refused, never written through
    if event == "open" and len(args) >= 3:
        path, mode, flags = args[0], args[1], args[2]
        writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & WRITE_FLAGS)
        nofollow = not isinstance(mode, str) and bool((flags or 0) & os.O_NOFOLLOW)
        paths = [path] if writing else []
    elif event in ("os.rename", "os.replace"):  # a link at either end is what moves or is replaced
        paths, nofollow = list(args[:2]), True
    elif event in ("os.symlink", "os.link"):  # (what it points at, the new name): only the name is written
        paths, nofollow = [args[1]], True
    elif event in ("os.remove", "os.rmdir", "os.mkdir"):  # these act on a link itself, never on its target
        dir_fd = args[2] if event == "os.mkdir" else args[1]
        paths, nofollow = ([args[0]] if dir_fd is None else []), True  # relative to a directory rig holds open
    elif event in ("os.chmod", "os.truncate", "shutil.rmtree"):
        paths = [args[0]]
    for path in paths:
        if isinstance(path, int):  # a file descriptor rig already holds
            continue
        text = os.fsdecode(path)
        if text.startswith("/dev/") or "__pycache__" in text:
            continue
        resolved = (os.path.join(os.path.realpath(os.path.dirname(text)), os.path.basename(text)) if nofollow
                    else os.path.realpath(text))
        if not (resolved == root or resolved.startswith(root + os.sep)):
            _WATCH["outside"].append(f"{event} {text}")


sys.addaudithook(_audit)

# matplotlib (rig bench's plots) writes its font cache on first import: build it now, in a directory of
# its own, so that cases see only what rig itself writes; removed when the run ends (one per worker and run)
os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="rig-fuzz-matplotlib-")
atexit.register(shutil.rmtree, os.environ["MPLCONFIGDIR"], True)
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
        holds(*rig("stack", "show", "--stack", str(stack))[::2])
        holds(*rig("stack", "vars", "--stack", str(stack), "--output", str(tmp / "vars.json"))[::2])


@FUZZ
@given(content=st.binary(max_size=300) | st.text(max_size=300) | st.sampled_from(YAML_ATTACKS))
def test_any_bytes_as_a_stack_file_are_refused_cleanly(content):
    with scratch() as tmp:
        stack = _write(tmp / "s.yml", content)
        holds(*rig("lock", "--verify", "--stack", str(stack))[::2], allowed=(2,))


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


RESULTS = {"format": 1, "plan": {}, "runs": [{"label": "baseline", "url": "http://127.0.0.1:30001",
                                               "speculative_algorithm": None,
                                               "serial": {"requests": 3, "completed": 3, "output_throughput": 50.0,
                                                          "round_output_throughput": [48.0, 50.0, 51.5]},
                                               "stopped": None, "levels": [
    {"max_concurrency": 1, "output_throughput": 50.0, "round_output_throughput": [49.0, 50.0, 51.0], "requests": 30,
     "failed": 0, "accept_length": None, "median_ttft_ms": 100.0, "p90_ttft_ms": 200.0, "p99_ttft_ms": 300.0,
     "median_e2e_latency_ms": 1000.0, "median_tpot_ms": 20.0, "per_request_speed": {"p50": 50.0}}]}]}


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
                            b'{"internal_states": [1, null, {"avg_spec_accept_length": "x"}]}',
                            b'{"text": "ok", "meta_info": {"completion_tokens": 1' + b"9" * 400 + b'}}',
                            b'{"text": "ok", "meta_info": {"completion_tokens": 4, "spec_verify_ct": 1' + b"0" * 400
                            + b'}}', b"[" * 100000 + b"]" * 100000]))


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


# ------------------------------------------------------------------ the filesystem, generated text, metadata

@contextlib.contextmanager
def within(seconds: int):
    """A read that blocks becomes a failure of the case (rig's boundary turns it into exit 70) instead of a
    hang of the suite."""
    def hung(signum, frame):
        raise TimeoutError("blocked on a special file")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _special(tmp: Path, kind: str) -> str:
    """A path where a regular file belongs that is something else."""
    if kind in ("/dev/zero", "/dev/null", "/dev/stdin"):
        return kind
    path = tmp / "special"
    if kind == "directory":
        path.mkdir()
    elif kind in ("fifo", "link to a fifo"):
        os.mkfifo(tmp / "fifo")
        if kind == "fifo":
            return str(tmp / "fifo")
        path.symlink_to(tmp / "fifo")
    else:  # a dangling link
        path.symlink_to(tmp / "nowhere")
    return str(path)


READERS = [  # every command that reads a document from a path it is given
    lambda p, tmp: ["stack", "show", "--stack", p],
    lambda p, tmp: ["env", "show", "--stack", p],
    lambda p, tmp: ["lock", "--verify", "--stack", p],
    lambda p, tmp: ["doctor", "--log", p],
    lambda p, tmp: ["wheelhouse", "export", p, str(tmp / "out"), "--cache", str(tmp / "cache")],
    lambda p, tmp: ["patch", "status", "--python", sys.executable, "--stack", p],
    lambda p, tmp: ["env", "show", "--env-json", p],
    lambda p, tmp: ["tune", "--stack", str(REPO / "stacks" / "default.yml"), "--prompts", p, "--check"],
]


@FUZZ
@given(kind=st.sampled_from(["fifo", "link to a fifo", "directory", "dangling link", "/dev/zero", "/dev/null"]),
       reader=st.sampled_from(range(len(READERS))))
def test_a_special_file_where_a_document_belongs_is_refused_at_once(kind, reader):
    with scratch() as tmp, within(20):
        path = _special(tmp, kind)
        holds(*rig(*READERS[reader](path, tmp))[::2])


def _victim() -> Path:
    """A file outside any case's scratch directory: a write through a link would reach it."""
    path = Path(tempfile.mkdtemp(prefix="rig-fuzz-victim-")) / "victim.txt"
    path.write_text("someone else's file\n")
    return path


def _fakepkg_venv(tmp: Path, version: str = "1.0") -> Path:
    venv = tmp / "v"
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "fakepkg").mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\ninclude-system-site-packages = false\n")
    (site / "fakepkg" / "mod.py").write_text("X = 1\n")
    (site / "fakepkg-1.0.dist-info").mkdir()
    (site / "fakepkg-1.0.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakepkg\nVersion: {version}\n")
    return venv


PATCH_SET = {"id": "fakepkg-fix", "summary": "s", "package": "fakepkg", "needed": ">=1.0,<2", "file": "fakepkg/mod.py",
             "why": "w", "hunks": [{"find": "X = 1\n", "replace": "X = 2\n"}], "check": "pass\n",
             "provenance": {"mirrors": "m", "fixed_in": "f", "checked": "c", "drop_when": "d"}}


def _link_case(tmp: Path, where: str, victim: Path) -> list[str]:
    """A link to VICTIM (or to its directory) left where the command writes; the command."""
    if where == "cuda lock":
        (tmp / "prefix" / "cuda-13.0").mkdir(parents=True)
        (tmp / "prefix" / ".rig-cuda.lock").symlink_to(victim)
        return ["cuda", "default", "--version", "13.0", "--prefix", str(tmp / "prefix"), "--state-dir", str(tmp / "s")]
    if where == "exported wheel":
        (tmp / "cache" / "built" / "k").mkdir(parents=True)
        (tmp / "cache" / "built" / "k" / "w-1.0-py3-none-any.whl").write_bytes(b"wheel")
        (tmp / "dest").mkdir()
        (tmp / "dest" / "w-1.0-py3-none-any.whl").symlink_to(victim)
        return ["wheels", "export", "k", str(tmp / "dest"), "--cache", str(tmp / "cache")]
    if where == "bundle":
        (tmp / "out").mkdir()
        (tmp / "out" / "rig.pyz").symlink_to(victim)
        return ["plumbing", "bundle", "--output", str(tmp / "out" / "rig.pyz")]
    if where == "ld.so.conf.d file":
        conf = tmp / "root" / "etc" / "ld.so.conf.d"
        conf.mkdir(parents=True)
        (conf / "rig-cuda-13-0.conf").symlink_to(victim)
        return ["cuda", "ldconfig-conf", "--version", "13.0.2", "--write-under", str(tmp / "root")]
    venv = _fakepkg_venv(tmp)
    (tmp / "pset").mkdir()
    (tmp / "pset" / "fakepkg-fix.yml").write_text(yaml.safe_dump(PATCH_SET))
    if where == "patch backups":
        (venv / ".rig-patches").symlink_to(victim.parent)
        return ["patch", "apply", "--venv", str(venv), "--patches", str(tmp / "pset")]
    if where == "patch record":
        (venv / ".rig-patches.json").symlink_to(victim)
        return ["patch", "apply", "--venv", str(venv), "--patches", str(tmp / "pset")]
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "rig_sitecustomize.py").symlink_to(victim)
    return ["env", "install", "--venv", str(venv), "--stack", str(REPO / "stacks" / "default.yml")]


@FUZZ
@given(where=st.sampled_from(["cuda lock", "exported wheel", "bundle", "ld.so.conf.d file", "patch backups",
                              "patch record", "environment module"]))
def test_a_link_where_rig_writes_never_carries_the_write_out(where):
    victim = _victim()
    try:
        with scratch() as tmp, within(60):
            code, _, err = rig(*_link_case(tmp, where, victim))
            holds(code, err)
        assert victim.read_text() == "someone else's file\n" and sorted(p.name for p in victim.parent.iterdir()) == [
            "victim.txt"]
    finally:
        import shutil

        shutil.rmtree(victim.parent)


@FUZZ
@given(prefix=st.text(max_size=30).map(lambda t: "/" + t))
def test_any_prefix_gives_an_ld_so_conf_whose_lines_are_plain_directories_or_is_refused(prefix):
    with scratch():
        code, out, err = rig("cuda", "ldconfig-conf", "--version", "13.0.2", "--prefix", prefix, "--json")
        holds(code, err)
        if code == 0:
            lines = json.loads(out)["content"].splitlines()
            assert lines[0].startswith("# Managed by rig") and len(lines) == 2  # the conventional lib64, alone
            assert lines[1].startswith("/") and not any(c in lines[1] for c in " \t:,\n")


keys = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)


@FUZZ
@given(env=st.dictionaries(keys, scalars, max_size=3))
def test_any_environment_section_renders_a_module_that_runs_or_is_refused(env):
    with scratch() as tmp:
        stack = tmp / "s.yml"
        _write(stack, yaml.safe_dump({"name": "t", "cuda": {"version": "13.0.2"}, "environment": {"vars": env}},
                                     allow_unicode=True))
        code, out, err = rig("env", "show", "--stack", str(stack))
        holds(code, err)
        if code == 0:  # the module every start of the venv runs: it must run, and set only names
            namespace: dict = {}
            exec(compile(out, "rig_sitecustomize", "exec"), namespace)  # noqa: S102 - the point of the check
            assert all(isinstance(k, str) and k.isidentifier() for k in env)


@FUZZ
@given(item=st.text(max_size=40) | st.sampled_from(["--report=/x", "-r x", "a @ file:///etc", "x; os_name=='posix'",
                                                    "-e.", "pkg[extra]>=1,<2", "--", "pkg --hash=sha256:00"]))
def test_any_extra_package_is_a_requirement_pip_cannot_take_as_an_option(item):
    from packaging.requirements import Requirement

    from rig.core import RigError
    from rig.stack.spec import validate

    TRIED["cases"] += 1
    try:
        validate({"name": "t", "cuda": {"version": "13.0.2"}, "extra_packages": [item]})
    except RigError as exc:
        assert "extra_packages" in str(exc)
    else:
        assert not item.lstrip().startswith("-") and Requirement(item).url is None
    TRIED["held"] += 1


@FUZZ
@given(version=st.text(max_size=20) | st.sampled_from(["1.0\n folded", "1.0\nVersion: 9", "", "１.０", "1.0 extra"]))
def test_any_installed_version_is_read_or_named_never_a_crash(version):
    with scratch() as tmp:
        venv = _fakepkg_venv(tmp, version.replace("\r", ""))
        (tmp / "pset").mkdir()
        (tmp / "pset" / "fakepkg-fix.yml").write_text(yaml.safe_dump(PATCH_SET))
        holds(*rig("patch", "status", "--venv", str(venv), "--patches", str(tmp / "pset"))[::2])
