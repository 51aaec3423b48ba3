"""Readers take regular files only: a FIFO answers at once instead of hanging, a device is refused instead of
read until memory runs out. The check is made on the opened file (rig.core.fs.open_regular), so nothing
swapped in between a check and the open is read."""
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness.commands import rig

from rig.core import RigError
from rig.core.documents import read_text
from rig.core.fs import plain_dir, read_bytes, read_tail, sha256_file
from rig.serving.smoke import log_tail


@pytest.fixture(autouse=True)
def no_hang():
    """A reader that blocks fails the test after 10 s instead of hanging the suite."""
    def hung(signum, frame):
        raise AssertionError("a reader blocked on a special file")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("reader", [lambda p: read_text(p, "stack file"), lambda p: read_bytes(p, "stack file"),
                                    lambda p: sha256_file(p, "stack file"), lambda p: read_tail(p, "stack file", 10)])
@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "dir"])
def test_every_reader_refuses_what_is_not_a_regular_file(reader, special, fifo, tmp_path):
    path = {"fifo": fifo, "dir": tmp_path}.get(special, special)
    with pytest.raises(RigError, match=f"stack file {path} is not a regular file"):
        reader(path)


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "file", "link to a directory", "dangling link"])
def test_a_directory_rig_writes_into_is_never_a_link_or_anything_else(special, fifo, tmp_path):
    path = {"fifo": fifo, "/dev/zero": Path("/dev/zero")}.get(special, tmp_path / "place")
    if special == "file":
        path.write_text("")
    elif special.endswith("link"):
        path.symlink_to(tmp_path / "nowhere")
    elif special.startswith("link"):
        path.symlink_to(tmp_path)
    with pytest.raises(RigError, match=f"{path} is a link or not a directory; rig keeps it") as refused:
        plain_dir(path, "rig keeps it")
    assert refused.value.hint == f"remove {path} and run again"
    plain_dir(tmp_path, "a directory")
    plain_dir(tmp_path / "absent", "made after")


def test_a_missing_file_and_an_oversized_one_are_named(tmp_path):
    with pytest.raises(RigError, match="No such file or directory"):
        read_bytes(tmp_path / "none", "lock")
    (tmp_path / "big").write_bytes(b"x" * 2048)
    with pytest.raises(RigError, match="is larger than"):
        read_bytes(tmp_path / "big", "lock", limit=1024)
    assert read_bytes(tmp_path / "big", "lock", limit=2048) == b"x" * 2048
    assert read_tail(tmp_path / "big", "log", 10) == (b"x" * 10, 2048)


def test_a_missing_log_is_named_once(tmp_path):
    done = rig("doctor", "--log", str(tmp_path / "none.log"))
    assert done.returncode == 2 and done.stderr.count("cannot read log") == 1, done.stderr


def test_a_server_log_that_is_a_fifo_gives_no_tail_and_a_real_one_its_last_lines(fifo, tmp_path):
    assert log_tail(str(fifo)) == ""
    (tmp_path / "log").write_text("".join(f"line {i}\n" for i in range(50)))
    assert log_tail(str(tmp_path / "log"), lines=2).endswith("line 48\nline 49")


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_doctor_log_and_stack_show_refuse_special_files_in_one_line(special, fifo):
    path = str(fifo) if special == "fifo" else special
    for args in (["doctor", "--log", path], ["stack", "show", "--stack", path]):
        done = rig(*args, timeout=30)
        assert done.returncode == 2 and done.stderr.count("rig: error:") == 1, done.stderr
        assert f"{path} is not a regular file" in done.stderr


def test_absence_stays_an_answer_for_callers_that_ask_whether_a_marker_is_there(tmp_path):
    """`rig venv add` on a venv rig never added wheels to has no marker yet: that is no error."""
    with pytest.raises(FileNotFoundError):
        sha256_file(tmp_path / "no-marker", "marker")
    venv, house = tmp_path / "v", tmp_path / "house"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    house.mkdir()
    (house / "built-requirements.txt").write_text("\n")
    digest = hashlib.sha256(b"\n").hexdigest()
    done = rig("venv", "add", "--venv", str(venv), "--wheelhouse", str(house), "--requirements-sha256", digest,
               "--check", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["changed"], done.stderr
