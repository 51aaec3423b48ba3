"""The CLI's surface: every subcommand explains itself; errors are one clear line."""
from conftest import REPO, rig


def test_help_lists_every_subcommand_with_a_line_each():
    out = rig("--help").stdout
    for command in ("bundle", "cuda", "doctor", "ldconfig-conf", "stack"):
        assert f"  {command} " in out
    assert "install" in rig("cuda", "--help").stdout


def test_an_engine_error_is_one_line_and_exit_2():
    done = rig("cuda", "install", "--version", "11.0.0", "--check", "--prefix", "/nonexistent")
    assert done.returncode == 2
    assert done.stderr.startswith("rig: error: unknown CUDA version '11.0.0'")
    assert "Traceback" not in done.stderr


def test_an_error_about_a_hostile_input_cannot_forge_lines_or_drive_the_terminal():
    done = rig("stack", "show", "x\nrig: error: forged\x1b[2J.yml")
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["rig: error: cannot read stack file x",
                                        "  rig: error: forged\\x1b[2J.yml: No such file or directory"]


def test_the_engine_bundle_runs_with_python_alone(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "rig.pyz"
    assert '"changed": true' in rig("bundle", "--json", "--out", str(out)).stdout
    assert '"changed": false' in rig("bundle", "--json", "--out", str(out)).stdout
    done = subprocess.run([sys.executable, "-I", "-S", str(out), "ldconfig-conf", "--version", "13.0.2",
                           "--prefix", str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert str(tmp_path / "cuda-13.0" / "lib64") in done.stdout
    # its packed files (the patch set, the log rules, templates) are read from inside the zip
    for args in (["patch", "status", "--json", "--python", sys.executable], ["doctor", "--log", str(out)],
                 ["env", "show", "--stack", str(REPO / "stacks" / "default.yml")]):
        done = subprocess.run([sys.executable, "-I", "-S", str(out), *args], capture_output=True, text=True,
                              check=False)
        assert done.returncode in (0, 1) and "rig: error" not in done.stderr, (args, done.stderr)
