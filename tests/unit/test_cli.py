"""The CLI's surface: every subcommand explains itself; errors are one clear line."""
from harness.commands import rig
from harness.paths import REPO

MOVED = {"ldconfig-conf": "cuda ldconfig-conf", "probe": "machine probe", "sbom": "image sbom",
         "tool": "plumbing tool", "bundle": "plumbing bundle"}


def test_help_lists_the_groups_by_what_users_do_and_the_tools_inside_them():
    out = rig("--help").stdout
    for command in ("cuda", "doctor", "image", "machine", "plumbing", "prove", "stack", "tune"):
        assert f"  {command} " in out
    assert not [old for old in MOVED if f"  {old} " in out]  # the old spellings are hidden
    for now in MOVED.values():
        group, command = now.split()
        assert f"  {command} " in rig(group, "--help").stdout, now
    assert "install" in rig("cuda", "--help").stdout


def test_an_old_spelling_still_runs_until_its_release_and_says_where_it_went(tmp_path):
    for old, now in MOVED.items():
        helped = rig(old, "--help")
        assert helped.returncode == 0 and f"`rig {old}` is now `rig {now}`" in helped.stdout, old
    args = ["--version", "13.0.2", "--prefix", "/usr/local", "--json"]
    new, old = rig("cuda", "ldconfig-conf", *args), rig("ldconfig-conf", *args)
    assert new.returncode == old.returncode == 0 and new.stdout == old.stdout and new.stderr == ""
    assert old.stderr == ("rig: warning: `rig ldconfig-conf` is now `rig cuda ldconfig-conf`; the old name is removed "
                          "in rig 0.2.0\n")
    done = rig("tool", "nosuch")  # bad input is still refused by the command itself, before it runs
    assert done.returncode == 2 and done.stderr.startswith("rig: error: Invalid value") and "is now" not in done.stderr


def test_an_engine_error_is_one_line_and_exit_2():
    done = rig("cuda", "install", "--version", "11.0.0", "--check", "--prefix", "/nonexistent")
    assert done.returncode == 2
    assert done.stderr.startswith("rig: error: unknown CUDA version '11.0.0'")
    assert "Traceback" not in done.stderr


def test_an_error_about_a_hostile_input_cannot_forge_lines_or_drive_the_terminal():
    done = rig("stack", "show", "--stack", "x\nrig: error: forged\x1b[2J.yml")
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["rig: error: cannot read stack file x",
                                        "  rig: error: forged\\x1b[2J.yml: No such file or directory"]


def test_the_engine_bundle_runs_with_python_alone(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "rig.pyz"
    assert '"changed": true' in rig("plumbing", "bundle", "--json", "--output", str(out)).stdout
    assert '"changed": false' in rig("plumbing", "bundle", "--json", "--output", str(out)).stdout
    done = subprocess.run([sys.executable, "-I", "-S", str(out), "cuda", "ldconfig-conf", "--version", "13.0.2",
                           "--prefix", str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert str(tmp_path / "cuda-13.0" / "lib64") in done.stdout
    # its packed files (the patch set, the log rules, templates) are read from inside the zip
    for args in (["patch", "status", "--json", "--python", sys.executable], ["doctor", "--log", str(out)],
                 ["env", "show", "--stack", str(REPO / "stacks" / "default.yml")]):
        done = subprocess.run([sys.executable, "-I", "-S", str(out), *args], capture_output=True, text=True,
                              check=False)
        assert done.returncode in (0, 1) and "rig: error" not in done.stderr, (args, done.stderr)


def test_the_engine_bundle_imports_its_modules_from_bytecode_and_from_source_on_another_python(tmp_path):
    """zipimport never writes bytecode: the bundle carries its builder's, else a target compiles every import
    on every run. A code object compiled from the zip's source names the zip in its file name; one read from
    the carried bytecode names the path inside it."""
    import subprocess
    import sys
    import zipfile

    out = tmp_path / "rig.pyz"
    assert rig("plumbing", "bundle", "--output", str(out)).returncode == 0
    names = set(zipfile.ZipFile(out).namelist())
    assert {n[:-1] for n in names if n.endswith(".pyc")} == {n for n in names if n.endswith(".py")} - {"__main__.py"}
    where = "import sys; sys.path.insert(0, sys.argv[1]); import rig.engine.bundle as b; print(b.build.__code__.co_filename)"
    read = subprocess.run([sys.executable, "-I", "-S", "-c", where, str(out)], capture_output=True, text=True,
                          check=True)
    assert read.stdout.strip() == "rig/engine/bundle.py"
    # a Python of another version (another magic number) finds bytecode it cannot read and takes the source
    with zipfile.ZipFile(out) as zipped, zipfile.ZipFile(tmp_path / "other.pyz", "w") as other:
        for info in zipped.infolist():
            data = zipped.read(info)
            other.writestr(info, b"\0\0\r\n" + data[4:] if info.filename.endswith(".pyc") else data)
    compiled = subprocess.run([sys.executable, "-I", "-S", "-c", where, str(tmp_path / "other.pyz")],
                              capture_output=True, text=True, check=True)
    assert compiled.stdout.strip() == str(tmp_path / "other.pyz" / "rig" / "engine" / "bundle.py")


def test_a_bundled_source_that_does_not_compile_is_named_and_no_bundle_is_written(tmp_path, monkeypatch):
    import pytest

    from rig.core import RigError
    from rig.engine import bundle

    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    monkeypatch.setattr(bundle, "_sources", lambda with_patches=True: [(broken, broken.relative_to(tmp_path))])
    with pytest.raises(RigError, match=f"cannot bundle {broken}: it does not compile"):
        bundle.build(tmp_path / "out" / "rig.pyz")
    assert not [p for p in (tmp_path / "out").iterdir()]  # no bundle, no stamp
