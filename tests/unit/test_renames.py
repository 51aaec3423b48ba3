"""Old spellings (a command, an option, a stack key) are read until the release each names, with a warning that
says what to write now and when the old one goes; the suite fails once rig reaches that release."""
import importlib
import json

import yaml
from harness.commands import rig
from harness.paths import REPO
from packaging.version import Version

import rig as package
from rig.cli import COMMANDS
from rig.core.renames import DECLARED
from rig.stack.spec import MOVED_KEYS, load


def test_every_rename_names_a_release_after_this_one_and_is_removed_by_then():
    for entry in COMMANDS:  # every command module, whose renames are declared as it is imported
        importlib.import_module(f"rig.cli.{entry.where.partition(':')[0]}")
    assert {"`--check`", "`--timeout`", "the stack as an argument", "`rig probe`", "`--summary DIR`",
            "tune.start_timeout"} <= {r.old for r in DECLARED}
    due = [str(r) for r in DECLARED if Version(r.removed_in) <= Version(package.__version__)]
    assert due == []  # rig has reached its release: remove the old spelling (and this rename)


def _stack_with(tmp_path, change):
    data = yaml.safe_load((REPO / "stacks" / "cuda-13.0.yml").read_text())
    for section, values in change.items():
        data[section] = {**(data.get(section) or {}), **values}
    path = tmp_path / "old.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_an_old_stack_key_is_read_at_its_new_place_with_one_warning_naming_the_release(tmp_path, capsys):
    path = _stack_with(tmp_path, {"tune": {"start_timeout": 777}})
    before = path.read_text()
    for _ in range(2):  # read twice, warned once
        stack = load(path)
        assert stack["server"]["start_timeout"] == 777 and "start_timeout" not in stack["tune"]
    assert capsys.readouterr().err == (f"rig: warning: {path}: tune.start_timeout is now server.start_timeout; the old "
                                       "key is removed in rig 0.2.0\n")
    assert path.read_text() == before and [str(r) for r in MOVED_KEYS if r.old == "tune.start_timeout"]


def test_an_old_stack_key_beside_its_new_one_is_refused_naming_both(tmp_path):
    path = _stack_with(tmp_path, {"tune": {"start_timeout": 777}, "server": {"start_timeout": 900}})
    done = rig("stack", "show", "--json", "--stack", str(path))
    answer = json.loads(done.stdout)
    assert done.returncode == 2 and answer["error"].endswith(
        "tune.start_timeout and server.start_timeout are one setting, given twice")
    assert answer["hint"] == "keep server.start_timeout and remove tune.start_timeout"


def test_an_old_option_is_read_with_a_warning_and_both_spellings_at_once_are_refused():
    url = "http://127.0.0.1:9"  # nothing listens: smoke fails at once, after the line was read
    old = rig("smoke", "--url", url, "--timeout", "1", "--json")
    assert old.returncode == 2 and "within 1 s" in json.loads(old.stdout)["error"]
    assert old.stderr.splitlines()[0] == ("rig: warning: `--timeout` is now `--start-timeout`; the old spelling is "
                                          "removed in rig 0.2.0")
    both = rig("smoke", "--url", url, "--timeout", "1", "--start-timeout", "1")
    assert both.returncode == 2 and both.stderr.splitlines() == [
        "rig: error: --start-timeout given twice, once as --timeout",
        "rig: hint: give --start-timeout alone (--timeout is its old spelling)"]
    assert "--timeout is its old spelling, removed in rig 0.2.0" in " ".join(rig("smoke", "--help").stdout.split())


def test_a_moved_option_is_refused_naming_the_command_it_became_and_the_release():
    done = rig("prove", "--summary", ".", "--json")
    answer = json.loads(done.stdout)
    assert done.returncode == 2 and answer["error"].endswith(
        "`--summary DIR` is now `rig fleet summary DIR`; the old spelling is removed in rig 0.2.0")
    assert answer["hint"] == "run `rig fleet summary DIR`"
