"""One output rule for every command (rig.core.outdir), checked when the command line is read, before any work;
one reader for every number option; a deleted current directory, a dangling default stack and the fleet summary
said or run plainly."""
import contextlib
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from harness.commands import rig
from harness.paths import BIN, REPO
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rig.core import RigError, outdir

STACK = str(REPO / "stacks" / "default.yml")
NOWHERE = "http://127.0.0.1:9"  # nothing answers: a run that got past its checks stops there


def rig_in(cwd: Path | str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RIG_STACK"}
    return subprocess.run([str(BIN / "rig"), *args], cwd=cwd, capture_output=True, text=True, check=False, env=env)


def refused(done: subprocess.CompletedProcess, *says: str) -> None:
    assert done.returncode == 2 and done.stderr.count("rig: error:") == 1, done.stderr
    assert all(s in done.stderr for s in says), done.stderr


# ------------------------------------------------------------------ mechanism 6: outputs checked first

def test_bench_refuses_a_dangling_out_a_directory_for_its_record_and_an_empty_out_before_any_request(tmp_path):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "taken" / "results.json").mkdir(parents=True)
    before = sorted(p.name for p in tmp_path.iterdir())
    refused(rig("bench", "--url", NOWHERE, "--out", str(tmp_path / "dangling")),
            f"{tmp_path / 'dangling'} is a link to {tmp_path / 'nowhere'}, which does not exist")
    refused(rig("bench", "--url", NOWHERE, "--out", str(tmp_path / "taken")),
            "holds directories where rig writes results.json")
    refused(rig_in(tmp_path, "bench", "--stack", STACK, "--url", NOWHERE, "--out", ""),
            "--out '': give a directory, not empty (that would be the current directory)")
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not (tmp_path / "nowhere").exists()


def test_prove_refuses_a_junit_file_that_is_its_own_record(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "prove.json").write_text("{}")  # an earlier run's record
    (tmp_path / "record-link").symlink_to(out / "prove.json")
    for junit in (out / "prove.json", tmp_path / "out" / ".." / "out" / "prove.json"):
        refused(rig("prove", "--venv", str(tmp_path), "--out", str(out), "--junit", str(junit)),
                "--junit", "the run's own prove.json")
    refused(rig("prove", "--venv", str(tmp_path), "--out", str(out), "--junit", str(tmp_path / "record-link")),
            "--junit", "is a link")  # never renamed over, whatever it points to
    assert [p.name for p in out.iterdir()] == ["prove.json"] and (out / "prove.json").read_text() == "{}"
    new = tmp_path / "new"
    refused(rig("prove", "--venv", str(tmp_path), "--out", str(new), "--junit", str(new)), "is the result directory")
    assert not new.exists()


def test_env_remove_refuses_an_empty_venv_rather_than_acting_on_the_stacks():
    refused(rig("env", "remove", "--venv", "", "--stack", STACK), "--venv '': an empty path")


def test_an_empty_output_file_or_junit_is_refused(tmp_path):
    refused(rig_in(tmp_path, "stack", "vars", "--stack", STACK, "--output", ""), "--output '': give a file path, not empty")
    refused(rig_in(tmp_path, "validate", "--stack", STACK, "--junit", ""), "--junit '': give a file path, not empty")
    assert not list(tmp_path.iterdir())


OUTPUTS = ("results.json", "report.md")
PARTS = st.sampled_from(["out", "new", "file", "dangling", "linkdir", "taken", "results.json", ".", "..", "a\nb"])


@contextlib.contextmanager
def scratch():
    """A directory of everything in an output's way: a file, a link to nothing, a link to a directory, a
    directory whose results.json is a directory; the current directory while the block runs."""
    with tempfile.TemporaryDirectory() as name:
        root = Path(name).resolve()
        (root / "file").write_text("x")
        (root / "dangling").symlink_to(root / "nowhere")
        (root / "taken" / "results.json").mkdir(parents=True)
        (root / "linkdir").symlink_to(root / "taken")
        (root / "out").mkdir()
        with contextlib.chdir(root):
            yield root


def tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.lstat().st_mode) for p in root.rglob("*"))


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(PARTS, max_size=4), absolute=st.booleans())
def test_an_output_path_the_rule_takes_is_written_whole_and_one_it_refuses_is_left_untouched(parts, absolute):
    with scratch() as root:
        text = "/".join(parts)
        if absolute:
            text = str(root / text) if text else str(root)
        assume(os.path.normpath(os.path.join(root, text or ".")).startswith(str(root)))  # never outside scratch
        before = tree(root)
        try:
            out = outdir.results_dir(text, OUTPUTS)
        except RigError as exc:
            assert tree(root) == before and "--out" in str(exc)
        else:
            assert text and out.is_absolute()
            written = outdir.write(out, {name: name for name in OUTPUTS})  # never fails once the rule took it
            assert [Path(p).read_text() for p in written] == list(OUTPUTS)
        with contextlib.suppress(RigError):
            path = outdir.output_file(text, "--output")
            outdir.atomic_write(path, "x")
            assert path.read_text() == "x" and not path.is_symlink()


# ------------------------------------------------------------------ mechanism 7: one number reader

@pytest.mark.parametrize("args, says", [
    (["bench", "--url", NOWHERE, "--max-tokens", "١٢"], "--max-tokens '١٢' is not a whole number in ASCII digits"),
    (["bench", "--url", NOWHERE, "--concurrency", "1,٤"], "--concurrency '1,٤' is not comma-separated whole numbers"),
    (["bench", "--url", NOWHERE, "--temperature", "٠.٥"], "--temperature '٠.٥' is not a number in ASCII digits"),
    (["bench", "--url", NOWHERE, "--rounds", "1_0"], "--rounds '1_0'"),
    (["smoke", "--url", NOWHERE, "--max-tokens", "١٢"], "--max-tokens '١٢'"),
    (["smoke", "--url", NOWHERE, "--timeout", "٣"], "--start-timeout '٣'"),
    (["prove", "--tp", "٢"], "--tp '٢'"),
    (["machine", "probe", "--gpus", "٨"], "--gpus '٨'"),
    (["wheelhouse", "route", "h", "--port", "٨٠"], "--port '٨٠'"),
    (["bench", "--url", NOWHERE, "--concurrency", "4,1,4"], "4 given more than once"),
])
def test_every_number_option_takes_ascii_digits_only(tmp_path, args, says):
    refused(rig(*args, "--out", str(tmp_path / "out")) if args[0] in ("bench", "prove", "machine") else rig(*args),
            says)
    assert not (tmp_path / "out").exists()


@settings(max_examples=300, deadline=None, derandomize=True)
@given(text=st.text(st.characters(whitelist_categories=("Nd", "Zs", "Pc", "Pd")) | st.sampled_from("0123456789.,e+"),
                    max_size=8))
def test_the_number_reader_takes_only_what_an_ascii_numeral_says(text):
    from rig.cli.common import Number

    for kind in (int, float):
        try:
            value = Number(kind).convert(text, None, None)
        except RigError:
            continue
        assert text.isascii() and "_" not in text and text == text.strip() and value == kind(text)
    try:
        values = Number(int, many=True).convert(text, None, None)
    except RigError:
        return
    assert text.isascii() and values == [int(v) for v in text.split(",")]


# ------------------------------------------------------------------ mechanism 8 and the fleet summary

def gone(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """ARGS run in a current directory deleted under rig."""
    where = tmp_path / "gone"
    where.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RIG_STACK"}
    try:
        return subprocess.run(["bash", "-c", 'cd "$1" && rmdir "$1" && exec "${@:2}"', "-", str(where),
                               str(BIN / "rig"), *args], capture_output=True, text=True, check=False, env=env)
    finally:
        assert not where.exists()


def test_a_deleted_current_directory_is_named_and_help_still_works(tmp_path):
    for args in (["--help"], ["stack", "show", "--help"], ["bench", "--help"]):
        helped = gone(tmp_path, *args)
        assert helped.returncode == 0 and helped.stdout.startswith("Usage: rig") and helped.stderr == "", args
    for args in (["stack", "show"], ["bench", "--url", NOWHERE]):
        refused(gone(tmp_path, *args), f"the current directory {tmp_path / 'gone'} has been deleted\n"
                "rig: hint: cd to a directory that exists")


def test_a_dangling_default_stack_is_said_to_be_a_link_to_nothing_naming_its_target(tmp_path):
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "default.yml").symlink_to("../gone.yml")
    refused(rig_in(tmp_path, "stack", "show"),
            f"stack file {tmp_path / 'stacks' / 'default.yml'} is a link to ../gone.yml, which does not exist")
    helped = " ".join(rig_in(tmp_path, "stack", "show", "--help").stdout.split())
    assert "a link to ../gone.yml, which does not exist" in helped


def test_a_default_stack_that_loops_or_is_a_directory_is_said_to_be_so(tmp_path):
    (tmp_path / "loop" / "stacks").mkdir(parents=True)
    (tmp_path / "loop" / "stacks" / "default.yml").symlink_to("default.yml")
    refused(rig_in(tmp_path / "loop", "stack", "show"),
            f"stack file {tmp_path / 'loop' / 'stacks' / 'default.yml'} is a link that leads back to itself")
    (tmp_path / "dir" / "stacks" / "default.yml").mkdir(parents=True)
    refused(rig_in(tmp_path / "dir", "stack", "show"),
            f"File '{tmp_path / 'dir' / 'stacks' / 'default.yml'}' is a directory")


def test_an_output_directory_where_a_fifo_stands_is_called_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    refused(rig_in(tmp_path, "tune", "--stack", str(REPO / "stacks" / "default.yml"), "--out", str(tmp_path / "fifo"),
                   "--check"), f"--out {tmp_path / 'fifo'} is a FIFO; give a directory")


def test_the_fleet_summary_runs_where_the_reports_are_with_no_stack(tmp_path):
    (tmp_path / "host1").mkdir()
    (tmp_path / "host1" / "prove.json").write_text('{"ok": true, "steps": []}')
    done = rig_in(tmp_path, "fleet", "summary", ".")
    assert done.returncode == 0, done.stderr
    assert "every host passed (1)" in done.stdout and (tmp_path / "summary.md").is_file()
    (tmp_path / "summary.md").unlink()
    (tmp_path / "summary.md").mkdir()  # where the table goes, a directory stands: refused before anything is read
    refused(rig_in(tmp_path, "fleet", "summary", "."), "summary.md")
    refused(rig_in(tmp_path, "prove", "--summary", "."), "is now `rig fleet summary DIR`")  # the old spelling


def test_the_fleet_summary_never_follows_a_hosts_report_that_is_a_link(tmp_path):
    """A host's prove.json that links elsewhere (a passing report outside REPORTS) fails that host, unread."""
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"ok": true, "steps": []}')
    reports = tmp_path / "reports"
    (reports / "host1").mkdir(parents=True)
    (reports / "host1" / "prove.json").symlink_to(elsewhere)
    done = rig_in(reports, "fleet", "summary", ".")
    assert done.returncode != 0 and "FAILED on host1" in done.stdout, done.stdout + done.stderr
    assert "a link there is never followed" in (reports / "summary.md").read_text()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("\n\r\x1b\x07\x9b")))
def test_a_progress_line_is_one_rig_line_whatever_a_name_in_it_holds(name):
    """A venv path with a newline and an escape sequence printed a fake `rig: error:` line and cleared the
    terminal: every line rig writes to a person goes through one writer, which makes them visible."""
    import io

    from rig.core import progress

    with contextlib.redirect_stderr(io.StringIO()) as said:
        progress(f"unpacking into {name}")
    err = said.getvalue()
    lines = err.removesuffix("\n").split("\n")
    assert lines[0].startswith("rig: unpacking into ") and all(line.startswith("  ") for line in lines[1:])
    assert all(ch == "\n" or ch.isprintable() for ch in err)


@pytest.mark.parametrize("make, said", [
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.symlink_to(p.parent / "elsewhere"), "a link"),
    (lambda p: [(p.parent / "there").write_text("keep"), p.symlink_to(p.parent / "there")], "a link"),
])
def test_a_single_output_file_is_never_a_device_fifo_or_link_it_would_rename_over(tmp_path, make, said):
    """--junit /dev/full, run as root, once turned the device into a regular file: the file is written by a rename
    over its path, so what stands there must be a regular file (or nothing)."""
    path = tmp_path / "report.xml"
    make(path)
    before = tree(tmp_path)
    with pytest.raises(RigError, match=said):
        outdir.output_file(path, "--junit")
    assert tree(tmp_path) == before
    (tmp_path / "plain.xml").write_text("old")
    assert outdir.output_file(tmp_path / "plain.xml", "--junit") == tmp_path / "plain.xml"
