"""Nothing half-done is left behind: a killed fetch, a refused first install, a broken venv."""
import json
import os
import platform
import signal
import socket
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from harness.commands import rig
from harness.paths import BIN, REPO

from rig.python.lock import lock_hash


def _silent_index():
    """A listening socket that accepts and never answers: pip waits on it as on a stalled mirror."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server


def _children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_a_killed_fetch_leaves_no_pip_running_and_no_scratch(tmp_path):
    server = _silent_index()
    lock = json.loads((REPO / "roles" / "python_stack" / "molecule" / "default" / "tiny.lock").read_text())
    lock["wheels"] = [{**lock["wheels"][0], "index": f"http://127.0.0.1:{server.getsockname()[1]}/simple"}]
    lock["lock_hash"] = lock_hash(lock)
    (tmp_path / "l.lock").write_text(json.dumps(lock))
    cache = tmp_path / "cache"
    fetch = subprocess.Popen([str(BIN / "rig"), "wheelhouse", "fetch", str(tmp_path / "l.lock"), "--cache", str(cache)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    server.settimeout(60)
    connection, _ = server.accept()  # pip is asking the index now
    pips = _children_of(fetch.pid)
    assert pips and list((cache / "wheels").glob(".fetch-*"))
    fetch.send_signal(signal.SIGTERM)
    _, err = fetch.communicate(timeout=30)
    connection.close()
    assert fetch.returncode == 128 + signal.SIGTERM and "rig: terminated" in err
    deadline = time.time() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in pips) and time.time() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pips if Path(f"/proc/{pid}").exists()]
    assert not list((cache / "wheels").glob(".fetch-*"))


@pytest.mark.parametrize("made_for_it", [False, True])
def test_a_refused_first_install_leaves_no_venv(tmp_path, made_for_it):
    """Into a new directory or into an empty one made for it (an attack's case: a skeleton was left there)."""
    house = tmp_path / "house"
    house.mkdir()
    (house / "requirements.txt").write_text(f"click==8.1.7 --hash=sha256:{'0' * 64}\n")
    with zipfile.ZipFile(house / "pip-0-py3-none-any.whl", "w") as broken:
        broken.writestr("pip/__init__.py", "")  # no __main__: this pip cannot run
    venv = tmp_path / "venv"
    if made_for_it:
        venv.mkdir()
    done = rig("venv", "install", "--venv", str(venv), "--lock-hash", "a" * 64, "--python-version",
               ".".join(platform.python_version_tuple()[:2]), "--wheelhouse", str(house))
    assert done.returncode == 2 and "could not install the wheels" in done.stderr, done.stderr
    assert (list(venv.iterdir()) == [] if made_for_it else not venv.exists())
    assert not list(tmp_path.glob(".rig-install-*"))


def test_verify_on_a_venv_whose_python_cannot_start_says_so(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\necho 'broken interpreter' >&2\nexit 1\n")
    os.chmod(venv / "bin" / "python", 0o755)
    (venv / ".rig-stack.json").write_text(json.dumps({"lock_hash": "a" * 64, "packages": ["click==8.1.7"]}))
    done = rig("venv", "verify", "--venv", str(venv))
    assert done.returncode == 2 and "its Python must start" in done.stderr and "broken interpreter" in done.stderr
    assert "differs" not in done.stdout + done.stderr


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    """A full disk mid-write (ENOSPC at fsync) must not leave a 0-byte state file behind."""
    import errno

    from rig.cli import _explain
    from rig.core.fs import atomic_write

    state = atomic_write(tmp_path / "state.json", '{"previous": "cuda-12.9"}\n')

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    try:
        atomic_write(state, '{"previous": "cuda-13.0"}\n')
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
        # the boundary's line names the file, its hint the fix, never "system: No space left on device"
        assert _explain(exc) == (f"{state}: No space left on device", "free space there and run again")
    else:
        raise AssertionError("the failed write was not reported")
    assert state.read_text() == '{"previous": "cuda-12.9"}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_smoke_gives_up_on_a_server_that_never_answers_a_request(tmp_path):
    """Healthy, then silent on /generate: smoke must stop after --request-timeout, not hang."""
    import http.server
    import threading

    class Silent(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def do_POST(self):
            time.sleep(120)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = subprocess.run([str(BIN / "rig"), "smoke", "--url", f"http://127.0.0.1:{server.server_address[1]}",
                               "--timeout", "5", "--request-timeout", "2", "--no-speculation"],
                              capture_output=True, text=True, timeout=60, check=False)
    finally:
        server.shutdown()
    assert done.returncode == 2 and "rig: error:" in done.stderr and "no answer" in done.stderr, done.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("json_flag", [(), ("--json",)])
def test_output_to_a_full_stdout_is_one_line_naming_stdout_and_no_traceback(json_flag):
    """`rig stack show > /dev/full` said `system: No space left on device`; under --json the boundary's own JSON
    write failed again and printed a traceback."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([str(BIN / "rig"), "stack", "show", "--stack", str(REPO / "stacks" / "default.yml"),
                               *json_flag], stdout=full, stderr=subprocess.PIPE, text=True, check=False, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert done.stderr.splitlines()[-2:] == ["rig: error: cannot write the output to stdout: No space left on device",
                                             "rig: hint: give it somewhere that takes it"], done.stderr
