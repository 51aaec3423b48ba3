"""Stack files: validated on load, errors name the file, the key and what is allowed."""
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml
from harness.commands import rig
from harness.paths import REPO

from rig.core import RigError
from rig.python.stack_vars import ansible_vars
from rig.stack.spec import load, validate

GOOD = {"name": "t", "cuda": {"version": "13.0.2"}, "archs": ["12.0a", "9.0a"]}


def test_the_default_stack_loads_with_defaults_filled_in():
    stack = load(REPO / "stacks" / "default.yml")
    assert stack["cuda"]["version"].startswith("13.0.")
    assert stack["cuda"]["method"] == "wheels"
    assert stack["archs"] == ["12.0a", "9.0a"]
    assert stack["cuda"]["make_default"] is False


@pytest.mark.parametrize("change, named", [
    ({"cuda": {"version": "13.0.9"}}, "cuda.version: unknown CUDA version '13.0.9'"),
    ({"cuda": {"version": "13.0.2", "method": "conda"}}, "cuda.method: 'conda' is not allowed"),
    ({"cuda": {"version": "13.0.2", "colour": 1}}, "cuda: unknown key 'colour'"),
    ({"archs": ["8.6"]}, "archs[0]: '8.6' is not allowed"),
    ({"archs": "12.0a"}, "archs: expected list"),
    ({"cuda": {"version": "13.0.2", "make_default": "yes"}}, "cuda.make_default: expected bool"),
    ({"cuda": {"version": "13.0.2", "runfile": {"sha256": "abc"}}}, "cuda.runfile.sha256: must be 64"),
    ({"extra": True}, "unknown key 'extra'"),
    ({"tune": {"start_timeout": 900, "colour": 1}}, "tune: unknown key 'colour'"),  # the moved key is not the one
    ({"tune": {"start_timeout": 900}, "server": {"start_timeout": 900}},
     "tune.start_timeout and server.start_timeout are one setting, given twice; keep server.start_timeout"),
    ({"extensions": [{"package": "x", "version": "1.0"}]}, "extensions[0].source: is required"),
    ({"extensions": [{"package": "x", "version": "1.0", "source": {}}]}, "extensions[0].source: give either git"),
    ({"extensions": [{"package": "x", "version": "1.0", "source": {"git": "https://h/x.git"}}]},
     "extensions[0].source: a git source needs a ref"),
    ({"extensions": [{"package": "x y", "version": "1.0", "source": {"path": "."}}]},
     "extensions[0].package: 'x y' is not a package name"),
    ({"extensions": [{"package": "x", "version": "one", "source": {"path": "."}}]},
     "extensions[0].version: 'one' is not a version"),
])
def test_bad_values_are_errors_that_name_the_key(change, named):
    with pytest.raises(RigError, match="^s.yml: ") as err:
        validate({**GOOD, **change}, "s.yml")
    assert named in str(err.value)


def test_a_missing_required_key_is_named():
    with pytest.raises(RigError, match=r"s.yml: cuda: is required"):
        validate({"name": "t"}, "s.yml")


def test_cli_refuses_malformed_yaml_and_names_the_file(tmp_path):
    bad = tmp_path / "broken.yml"
    bad.write_text("name: [unclosed\n")
    done = rig("stack", "show", "--stack", str(bad))
    assert done.returncode == 2
    assert done.stderr == f"rig: error: {bad}: line 2, column 1: not valid YAML: expected ',' or ']', but got " \
        "'<stream end>' (while parsing a flow sequence)\n"  # one line: where, what was expected
    not_a_mapping = tmp_path / "list.yml"
    not_a_mapping.write_text("- 1\n")
    assert "must be a mapping" in rig("stack", "show", "--stack", str(not_a_mapping)).stderr


def test_stack_vars_are_what_the_roles_read(tmp_path):
    path = tmp_path / "s.yml"
    path.write_text(yaml.safe_dump({**GOOD, "cuda": {"version": "13.0.1", "make_default": True}}))
    out = tmp_path / "vars.json"
    assert rig("stack", "vars", "--stack", str(path), "--output", str(out)).returncode == 0
    assert json.loads(out.read_text()) == ansible_vars(load(path))
    assert json.loads(out.read_text())["cuda_toolkit_version"] == "13.0.1"
    assert json.loads(out.read_text())["cuda_toolkit_make_default"] is True


def test_kept_stack_vars_are_named_by_their_content_and_rewritten_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("RIG_CACHE", str(tmp_path / "cache"))
    stacks = []
    for version in ("13.0.1", "13.0.2"):
        stacks.append(tmp_path / f"{version}.yml")
        stacks[-1].write_text(yaml.safe_dump({**GOOD, "cuda": {"version": version}}))
    kept = [Path(rig("stack", "vars", "--stack", str(path), "--keep").stdout.strip()) for path in (*stacks, stacks[0])]
    assert kept[0] == kept[2] != kept[1] and kept[0].parent == tmp_path / "cache" / "stack-vars"
    assert json.loads(kept[0].read_text()) == ansible_vars(load(stacks[0]))
    assert kept[0].name == hashlib.sha256(kept[0].read_bytes()).hexdigest() + ".json"
    assert kept[0].stat().st_mode & 0o777 == 0o600
    kept[0].write_text("{}")  # altered in the cache: the next run writes it anew, it never reads it
    assert Path(rig("stack", "vars", "--stack", str(stacks[0]), "--keep").stdout.strip()) == kept[0]
    assert json.loads(kept[0].read_text()) == ansible_vars(load(stacks[0]))
    done = rig("stack", "vars", "--stack", str(stacks[0]), "--keep", "--output", str(tmp_path / "v.json"))
    assert done.returncode == 2 and "give --output or --keep, not both" in done.stderr
    # a link planted where the kept files go, pointing out of the cache: refused, nothing written there
    (tmp_path / "elsewhere").mkdir()
    shutil.rmtree(tmp_path / "cache" / "stack-vars")
    (tmp_path / "cache" / "stack-vars").symlink_to(tmp_path / "elsewhere")
    planted = rig("stack", "vars", "--stack", str(stacks[1]), "--keep")
    assert planted.returncode == 2 and "leads outside" in planted.stderr and not list((tmp_path / "elsewhere").iterdir())


def test_role_defaults_agree_with_the_engine_where_both_say_a_value():
    """A role run without a stack file behaves as a stack that sets nothing beyond its CUDA version."""
    defaults = {}
    for path in sorted((REPO / "roles").glob("*/defaults/main.yml")):
        defaults.update(yaml.safe_load(path.read_text()) or {})
    from rig.core.cuda_releases import RELEASES
    from rig.cuda.toolkit import DEFAULT_STATE_DIR

    assert defaults["cuda_toolkit_version"] in RELEASES
    rendered = ansible_vars(validate({**GOOD, "cuda": {"version": defaults["cuda_toolkit_version"]}}))
    said = {k: v for k, v in defaults.items()
            if k in rendered and v != "" and not (isinstance(v, str) and "{{" in v)}
    assert {"cuda_toolkit_method", "cuda_toolkit_components", "cuda_toolkit_make_default"} <= set(said)
    assert said == {k: rendered[k] for k in said}
    assert defaults["cuda_toolkit_state_dir"] == DEFAULT_STATE_DIR


@pytest.mark.parametrize("written, value", [("8.5E-1", 0.85), ("85e-2", 0.85), ("9e-1", 0.9)])
def test_a_stack_written_as_json_takes_exponent_numbers_as_numbers(tmp_path, written, value):
    """JSON is YAML 1.2, where 1e3 is a number; PyYAML's YAML 1.1 read it as text ("got str")."""
    data = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    data["server"]["mem_fraction_static"] = "@@"
    path = tmp_path / "stack.json"
    path.write_text(json.dumps(data).replace('"@@"', written))
    assert load(path)["server"]["mem_fraction_static"] == value


@pytest.mark.parametrize("section, key, value", [("server", "attention_backends", ["triton", "fa3", "triton"]),
                                                 ("tune", "step0", ["step0", "step0"]),
                                                 ("bench", "concurrency", [4, 1, 4]),
                                                 ("tune", "profile_levels", [64, 64]),
                                                 ("tune", "request_rates", [2, 2.0]),  # one rate, by value
                                                 (None, "archs", ["9.0a", "9.0a"])])
def test_a_list_that_names_one_thing_twice_is_refused(tmp_path, section, key, value):
    data = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    (data.setdefault(section, {}) if section else data)[key] = value
    path = tmp_path / "stack.yml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RigError, match=rf"{section + '.' if section else ''}{key}: .* given more than once"):
        load(path)


def test_a_profile_level_that_the_options_levels_leave_unmeasured_is_refused(tmp_path):
    """The stack's loader holds tune.profile_levels to bench.concurrency; --concurrency may change the levels after
    it, so rig tune holds them to the plan's before anything is asked of the venv."""
    from rig.serving.measure.plan import plan_from
    from rig.serving.tune.measure import prepare

    stack = {"bench": {"concurrency": [3, 64]}, "tune": {"request_rates": [], "profile_levels": [3, 64]}}
    with pytest.raises(RigError, match="tune.profile_levels lists 3, a concurrency no level measures"):
        prepare(stack, str(tmp_path / "no-venv"), plan_from(stack["bench"], concurrency=[1, 64]),
                tmp_path / "step0.json")


@pytest.mark.parametrize("value, says", [(1e-3, "quote it, so the variable holds what you wrote"),
                                         (10**30, "beyond"), (True, "give a string or a whole number")])
def test_an_environment_value_that_would_not_reach_the_variable_as_written_is_refused(tmp_path, value, says):
    """1e-3 reaches a variable as 0.001 and 1e5 as 100000.0 once YAML reads them as numbers: text is quoted."""
    data = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    data.setdefault("environment", {})["vars"] = {"RIG_TOL": value}
    path = tmp_path / "stack.yml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RigError, match=f"environment.vars: RIG_TOL: .*{says}"):
        load(path)


@pytest.mark.parametrize("name, value, says", [
    ("RIG_FREE_OFF", "off", "not one of its values; give one of: 0, 1"),
    ("RIG_FREE_OFF", "", "not one of its values"), ("RIG_FREE_OFF", "true", "not one of its values"),
    ("RIG_FREE_OFF_DRAFT", "Ingest", "give one of: ingest, extend"),
    ("RIG_FREE_OFF_HOLD", "-1", "not a whole number of 0 to 999999"),
    ("RIG_FREE_OFF_HOLD", 1_000_000, "not a whole number"), ("RIG_FREE_OFF_HOLD", "6 4", "not a whole number")])
def test_a_free_off_switch_takes_only_its_documented_values(name, value, says):
    """The patch read off, false, no and "" as on, and tune took Ingest: the stack refuses what it does not say."""
    data = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    with pytest.raises(RigError, match=f"s.yml: environment.vars: {name}: .*{says}"):
        validate({**data, "environment": {"vars": {name: value}}}, "s.yml")


@pytest.mark.parametrize("name", ["RIG_FREE_OFF_DRAF", "RIG_FREE_OFFX", "RIG_FREE_OFF_HOLDS"])
def test_a_misspelt_free_off_switch_is_refused_not_ignored(name):
    """The patch reads its switches by their exact names: RIG_FREE_OFF_DRAF=extend would be ignored, silently."""
    data = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    with pytest.raises(RigError, match=f"s.yml: environment.vars: {name}: no free-off switch is called so .*give one of: "
                                       "RIG_FREE_OFF, RIG_FREE_OFF_DRAFT, RIG_FREE_OFF_CHECK, RIG_FREE_OFF_HOLD"):
        validate({**data, "environment": {"vars": {name: "1"}}}, "s.yml")


@pytest.mark.parametrize("name, value", [("RIG_FREE_OFF", "1"), ("RIG_FREE_OFF", 0), ("RIG_FREE_OFF_DRAFT", "extend"),
                                         ("RIG_FREE_OFF_HOLD", 64), ("RIG_FREE_OFF_HOLD", "999999")])
def test_a_free_off_switch_at_a_documented_value_is_taken(name, value):
    data = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    assert validate({**data, "environment": {"vars": {name: value}}}, "s.yml")["environment"]["vars"] == {name: value}


@pytest.mark.parametrize("empty", ["", None])
def test_an_empty_venv_is_refused_never_this_directory(empty):
    """`venv: ""` packed the current directory."""
    data = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    with pytest.raises(RigError, match="s.yml: top level: 'venv' is empty: give it a value, or leave the key out"):
        validate({**data, "venv": empty}, "s.yml")


@pytest.mark.parametrize("venv", [" ", ".", "~", "venv", "$HOME/v", "/opt/rig/venv\n", " /opt/rig/venv", "/opt/\x1bv"])
def test_a_venv_the_working_directory_or_a_shell_would_decide_is_refused(venv):
    """A relative, home- or variable-relative path, or one with control characters or whitespace at an end, meant
    whatever the working directory (or a shell) made of it."""
    data = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    with pytest.raises(RigError, match="venv.*must be an absolute path"):
        validate({**data, "venv": venv}, "s.yml")
    assert validate({**data, "venv": "/opt/rig/venv"}, "s.yml")["venv"] == "/opt/rig/venv"


def test_a_stack_whose_profile_level_is_not_measured_is_refused_on_load(tmp_path):
    """rig validate (CI, no GPU) refuses what rig tune would: the same rule, read where the stack is read."""
    data = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    data["bench"] = {"concurrency": [1, 64]}
    data["tune"] = {"profile_levels": [3]}
    path = tmp_path / "stack.yml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RigError, match="tune.profile_levels lists 3, a concurrency no level measures"):
        load(path)


RUNBOOK_STACKS = sorted((REPO / "docs" / "validation").rglob("stack*.yml"))


@pytest.mark.parametrize("path", RUNBOOK_STACKS, ids=lambda path: path.relative_to(REPO / "docs" / "validation").as_posix())
def test_the_stacks_the_gpu_runbooks_serve_load(path):
    """A stack a device call runs is checked here first: a loan is too short to find a bad key on the GPU."""
    assert load(path)["name"] == yaml.safe_load(path.read_text())["name"]


@pytest.mark.parametrize("argv", [["stack", "show"], ["stack", "vars"], ["validate"], ["lock", "--verify"],
                                  ["doctor"]], ids=" ".join)
def test_a_missing_stack_file_reads_the_same_in_every_command(tmp_path, argv):
    missing = tmp_path / "nope.yml"
    done = rig(*argv, "--stack", str(missing))
    said = f"rig: error: cannot read stack file {missing}: No such file or directory\n"
    assert (done.returncode, done.stderr) == (2, said)
