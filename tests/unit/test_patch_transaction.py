"""An apply is a plan, then a transaction: refused whole before anything is written, and a failure part-way
puts every file, the record and the backups back as they were."""
import errno
import hashlib
import sys
from pathlib import Path

import pytest
import yaml

from rig.core import RigError
from rig.core.fs import atomic_write
from rig.patches import transaction
from rig.patches.actions import apply, revert
from rig.patches.env import Env
from rig.patches.patchset import load

PROVENANCE = {"mirrors": "none", "fixed_in": "none", "checked": "2026-12-06", "drop_when": "never"}


def _patch(pid: str, file: str, find: str, replace: str, check: str = "pass", **more) -> dict:
    return {"id": pid, "summary": "a test patch", "package": "fakepkg", "needed": ">=1.0,<2", "file": file,
            "why": "test", "hunks": [{"find": find, "replace": replace}], "check": check, "provenance": PROVENANCE,
            **more}


def _setup(tmp_path: Path, *patches: dict) -> tuple[Env, list, dict[str, Path]]:
    """fakepkg 1.0 with a.py (A = 1) and b.py (B = 1), and a patch set of PATCHES."""
    root = tmp_path / "site"
    (root / "fakepkg").mkdir(parents=True)
    files = {name: root / "fakepkg" / f"{name}.py" for name in ("a", "b")}
    for name, path in files.items():
        path.write_text(f"{name.upper()} = 1\n")
    (tmp_path / "pset").mkdir()
    for data in patches:
        (tmp_path / "pset" / f"{data['id']}.yml").write_text(yaml.safe_dump(data))
    env = Env(python=sys.executable, prefix=tmp_path, packages={"fakepkg": {"version": "1.0", "root": str(root)}})
    return env, load(tmp_path / "pset"), files


TWO = (_patch("fakepkg-a", "fakepkg/a.py", "A = 1\n", "A = 2\n"), _patch("fakepkg-b", "fakepkg/b.py", "B = 1\n", "B = 2\n"))


def _snapshot(tmp_path: Path) -> dict[str, str]:
    """Every file under TMP_PATH but the patch set, by sha256: the environment as a whole."""
    return {str(p.relative_to(tmp_path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tmp_path.rglob("*")) if p.is_file() and "pset" not in p.parts}


def _failing_write(monkeypatch, target: Path, times: int = 1) -> None:
    """The transaction's writes to TARGET fail (a full disk), the first TIMES of them; the others go through."""
    left = {"n": times}

    def write(path, data, mode=None):
        if Path(path) == target and left["n"]:
            left["n"] -= 1
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return atomic_write(path, data, mode)

    monkeypatch.setattr(transaction, "atomic_write", write)


def test_a_write_that_fails_part_way_puts_back_the_files_written_before_it(tmp_path, monkeypatch):
    env, found, files = _setup(tmp_path, *TWO)
    before = _snapshot(tmp_path)
    _failing_write(monkeypatch, files["b"])  # a.py is written first, then b.py fails
    with pytest.raises(OSError, match="No space left on device"):
        apply(env, found)
    assert _snapshot(tmp_path) == before
    assert not (tmp_path / ".rig-patches.json").exists() and not (tmp_path / ".rig-patches").exists()


def test_a_check_that_fails_after_writing_puts_back_every_file_and_the_earlier_record(tmp_path):
    """A run on top of an earlier apply: its record and backups must come out as they went in."""
    failing = _patch("fakepkg-b", "fakepkg/b.py", "B = 1\n", "B = 2\n", check="assert False, 'b is wrong'\n",
                     opt_in="more")
    env, found, files = _setup(tmp_path, TWO[0], failing)
    apply(env, found)  # fakepkg-a only: fakepkg-b waits for its feature
    assert files["a"].read_text() == "A = 2\n" and files["b"].read_text() == "B = 1\n"
    before = _snapshot(tmp_path)
    with pytest.raises(RigError, match="a patch's check failed after apply; the files were put back: fakepkg-b: "):
        apply(env, found, opted=frozenset({"more"}))
    assert _snapshot(tmp_path) == before


def test_an_interrupt_part_way_is_rolled_back_too(tmp_path, monkeypatch):
    env, found, files = _setup(tmp_path, *TWO)
    before = _snapshot(tmp_path)

    pressed = []

    def interrupted(path, data, mode=None):  # ^C as b.py is written
        if Path(path) == files["b"] and not pressed:
            pressed.append(path)
            raise KeyboardInterrupt
        return atomic_write(path, data, mode)

    monkeypatch.setattr(transaction, "atomic_write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        apply(env, found)
    assert _snapshot(tmp_path) == before


def test_taking_out_an_opt_in_patch_and_applying_the_rest_is_one_transaction(tmp_path, monkeypatch):
    """Two patches on one file, one opt-in: without its feature the file goes back to its original and the other
    goes on again. A failure while writing leaves the file as the earlier apply left it, not half-way."""
    first = _patch("fakepkg-a", "fakepkg/a.py", "A = 1\n", "A = 2\n")
    extra = _patch("fakepkg-a-extra", "fakepkg/a.py", "\n", "\n# extra\n", opt_in="extra")  # not on first's code
    env, found, files = _setup(tmp_path, first, extra)
    original = files["a"].read_bytes()
    apply(env, found, opted=frozenset({"extra"}))
    assert files["a"].read_text() == "A = 2\n# extra\n"
    both = _snapshot(tmp_path)

    planned = apply(env, found, check=True)
    assert planned["msg"].startswith("would take out fakepkg-a-extra") and "-# extra" in planned["diff"]
    assert _snapshot(tmp_path) == both

    _failing_write(monkeypatch, files["a"])
    with pytest.raises(OSError):
        apply(env, found)
    assert _snapshot(tmp_path) == both  # the earlier state: not the original, not half of the new one

    monkeypatch.undo()
    done = apply(env, found)
    assert done["changed"] and done["msg"].startswith("took out fakepkg-a-extra (opt-in, not asked for)\napplied 1")
    assert files["a"].read_text() == "A = 2\n"
    revert(env)
    assert files["a"].read_bytes() == original and not (tmp_path / ".rig-patches").exists()


def test_a_take_out_whose_backup_is_gone_is_refused_before_anything_is_written(tmp_path):
    extra = _patch("fakepkg-a", "fakepkg/a.py", "A = 1\n", "A = 2\n", opt_in="extra")
    env, found, files = _setup(tmp_path, extra, TWO[1])
    apply(env, found, opted=frozenset({"extra"}))
    for backup in (tmp_path / ".rig-patches").iterdir():
        if hashlib.sha256(b"A = 1\n").hexdigest() == backup.name:
            backup.unlink()
    before = _snapshot(tmp_path)
    with pytest.raises(RigError, match=r"the backup of .*a\.py is missing or altered; .*\. Nothing was changed$"):
        apply(env, found)
    assert _snapshot(tmp_path) == before


def test_when_putting_back_fails_too_the_record_stays_so_revert_can_restore(tmp_path, monkeypatch):
    env, found, files = _setup(tmp_path, *TWO)
    originals = {name: path.read_bytes() for name, path in files.items()}
    writes = {"a": 0}

    def write(path, data, mode=None):  # a.py is written, b.py's write fails, and putting a.py back fails
        if Path(path) == files["b"]:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        if Path(path) == files["a"]:
            writes["a"] += 1
            if writes["a"] > 1:
                raise OSError(errno.EIO, "Input/output error", str(path))
        return atomic_write(path, data, mode)

    monkeypatch.setattr(transaction, "atomic_write", write)
    with pytest.raises(RigError, match=r"then putting back failed for .*a\.py .*run `rig patch revert --force`"):
        apply(env, found)
    assert files["a"].read_text() == "A = 2\n"  # written and left, and the record names it
    monkeypatch.undo()
    revert(env, force=True)
    assert {name: path.read_bytes() for name, path in files.items()} == originals
    assert not (tmp_path / ".rig-patches.json").exists() and not (tmp_path / ".rig-patches").exists()


def test_a_patch_target_that_is_not_utf8_is_named_not_a_crash(tmp_path):
    env, found, files = _setup(tmp_path, *TWO)
    files["b"].write_bytes(b"B = 1\n\xff\n")
    before = _snapshot(tmp_path)
    with pytest.raises(RigError, match=r"patch target .*b\.py is not UTF-8 text"):
        apply(env, found)
    assert _snapshot(tmp_path) == before
