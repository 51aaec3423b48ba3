"""Patch files and the engine's reading of code: validated on load, drift named, files untouched."""
import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from harness.commands import rig
from harness.paths import REPO

from rig.core import RigError
from rig.patches import Env, _patched, apply, asked, load, status

FLASHINFER = REPO / "rig" / "patches" / "set" / "flashinfer-trtllm-comm-sm120.yml"


def test_every_patch_in_the_repo_loads_with_provenance():
    found = load()
    assert len(found) >= 6 and len({p.id for p in found}) == len(found)
    for p in found:
        assert p.provenance["checked"].startswith("20") and p.provenance["drop_when"]
        assert p.package in ("sglang", "flashinfer-python") and p.file.endswith(".py")


def test_the_free_off_patches_are_what_their_generator_writes(tmp_path):
    """rig/patches/set's free-off files are generated (docs/validation/free-off/make_patches.py): a change made to
    the files alone would be lost at the next generation."""
    import subprocess

    done = subprocess.run([sys.executable, str(REPO / "docs" / "validation" / "free-off" / "make_patches.py"),
                           str(tmp_path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    written = sorted(tmp_path.glob("*.yml"))
    assert [p.name for p in written] == ["sglang-free-off-graphs.yml", "sglang-free-off-worker-0517.yml",
                                         "sglang-free-off-worker-0523.yml"]
    for path in written:
        assert path.read_text() == (REPO / "rig" / "patches" / "set" / path.name).read_text(), path.name


def _write(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load(FLASHINFER.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    (tmp_path / "flashinfer-trtllm-comm-sm120.yml").write_text(yaml.safe_dump(data))
    return tmp_path


@pytest.mark.parametrize("change, named", [
    ({"needed": "0.6.3 or so"}, "flashinfer-trtllm-comm-sm120.yml: needed: '0.6.3 or so' is not a version range"),
    ({"check": None}, "flashinfer-trtllm-comm-sm120.yml: check: is required"),
    ({"hunks": []}, "hunks: needs at least one hunk"),
    ({"hunks": [{"find": "x"}]}, "hunks[0].replace: is required"),
    ({"colour": "red"}, "unknown key 'colour'"),
    ({"id": "another"}, "must be named after its id (another.yml)"),
])
def test_a_malformed_patch_file_is_refused_naming_the_key(tmp_path, change, named):
    with pytest.raises(RigError, match=named.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        load(_write(tmp_path, **change))


@pytest.mark.parametrize("empty", ["", None])
def test_an_empty_opt_in_is_refused_never_a_patch_for_everyone(tmp_path, empty):
    """`opt_in: ""` (or null) read as no opt-in: a patch its author meant to be asked for applied to everyone."""
    data = yaml.safe_load(FLASHINFER.read_text())
    (tmp_path / "flashinfer-trtllm-comm-sm120.yml").write_text(yaml.safe_dump({**data, "opt_in": empty}))
    with pytest.raises(RigError, match=r"flashinfer-trtllm-comm-sm120.yml: top level: 'opt_in' is empty: give it a "
                                       r"value, or leave the key out"):
        load(tmp_path)


def test_an_anchor_found_twice_is_drift_not_a_guess():
    p = load()[0]
    find = p.hunks[0][0]
    state, why = _patched(find + "\n" + find, p)
    assert state == "drifted" and "found 2 times" in why


def _fake_package(tmp_path: Path, text: str) -> tuple[Env, Path]:
    """An environment whose flashinfer-python 0.6.3 holds TEXT as the patched file (files only)."""
    root = tmp_path / "site"
    target = root / "flashinfer" / "jit" / "comm.py"
    target.parent.mkdir(parents=True)
    target.write_text(text)
    env = Env(python=sys.executable, prefix=tmp_path,
              packages={"flashinfer-python": {"version": "0.6.3", "root": str(root)}})
    return env, target


def test_a_patch_whose_result_does_not_compile_changes_nothing(tmp_path):
    find = next(p for p in load() if p.id == "flashinfer-trtllm-comm-sm120").hunks[0][0]
    env, target = _fake_package(tmp_path, find + "    )\n")
    (tmp_path / "p").mkdir()
    broken = load(_write(tmp_path / "p", hunks=[{"find": find, "replace": find + "  ((\n"}]))
    before = target.read_bytes()
    with pytest.raises(RigError, match="does not compile, nothing was changed"):
        apply(env, broken)
    assert target.read_bytes() == before and not (tmp_path / ".rig-patches.json").exists()


def test_status_of_a_file_missing_from_the_package_is_drift(tmp_path):
    env, target = _fake_package(tmp_path, "")
    target.unlink()
    row = next(r for r in status(env, load()) if r["id"] == "flashinfer-trtllm-comm-sm120")
    assert row["status"] == "drifted" and "is not in flashinfer-python 0.6.3" in row["detail"]


def test_the_cli_needs_an_environment_and_says_how(tmp_path):
    import subprocess

    from harness.paths import BIN

    # outside a checkout no stack is found, so no venv either (the one CLI grammar: --venv, else the stack's)
    done = subprocess.run([str(BIN / "rig"), "patch", "status"], cwd=tmp_path, capture_output=True, text=True,
                          check=False, env={k: v for k, v in os.environ.items() if k != "RIG_STACK"})
    assert done.returncode == 2 and "--venv DIR, --python PATH or --stack FILE" in done.stderr
    done = rig("patch", "status")  # in the checkout: the default stack's venv, which this machine does not have
    said = "is not a virtualenv (no bin/python)\nrig: hint: give --venv one, or set the stack's venv key"
    assert done.returncode == 2 and said in done.stderr
    done = rig("patch", "apply", "--venv", str(tmp_path))
    assert done.returncode == 2 and "is not a virtualenv (no bin/python)" in done.stderr


def test_status_on_an_environment_without_the_packages_says_not_installed():
    done = rig("patch", "status", "--json", "--python", sys.executable)
    rows = json.loads(done.stdout)["patches"]
    assert done.returncode == 0
    assert {r["status"] for r in rows if r["package"] == "sglang"} == {"not-applicable"}


def test_an_opt_in_patch_waits_for_its_feature_and_goes_when_no_longer_asked(tmp_path):
    sm120 = next(p for p in load() if p.id == "flashinfer-trtllm-comm-sm120")
    env, target = _fake_package(tmp_path, sm120.hunks[0][0] + "    )\n")
    (tmp_path / "p").mkdir()
    found = load(_write(tmp_path / "p", opt_in="faster", check="pass"))  # this file alone imports nothing
    original = target.read_bytes()
    row = status(env, found)[0]
    assert (row["status"], row["detail"]) == ("opt-in", "applied where opt-in faster is asked for")
    assert apply(env, found)["changed"] is False and target.read_bytes() == original
    assert apply(env, found, opted=frozenset({"faster"}))["changed"] and target.read_bytes() != original
    assert status(env, found, frozenset({"faster"}))[0]["status"] == "applied"
    assert "an apply without it takes it out" in status(env, found)[0]["detail"]
    planned = apply(env, found, check=True)
    assert planned["changed"] and planned["msg"].startswith("would take out flashinfer-trtllm-comm-sm120")
    assert target.read_bytes() != original  # check mode changed nothing
    dropped = apply(env, found)
    assert dropped["changed"] and target.read_bytes() == original and not (tmp_path / ".rig-patches.json").exists()
    with pytest.raises(RigError, match="no patch of the set is opt-in 'fastest'; the opt-in features are: faster"):
        asked(found, ["fastest"])


def _opt_in_set(tmp_path: Path, **more) -> list:
    """The flashinfer patch as opt-in 'faster' (its check importing nothing), plus MORE patch files."""
    (tmp_path / "p").mkdir(exist_ok=True)
    _write(tmp_path / "p", opt_in="faster", check="pass")
    for name, data in more.items():
        (tmp_path / "p" / f"{name}.yml").write_text(yaml.safe_dump(data))
    return load(tmp_path / "p")


def test_opt_in_code_that_was_there_before_rig_is_not_rigs_to_take_out(tmp_path):
    sm120 = next(p for p in load() if p.id == "flashinfer-trtllm-comm-sm120")
    env, target = _fake_package(tmp_path, sm120.hunks[0][1] + "    )\n")  # a build that carries the change
    found = _opt_in_set(tmp_path)
    assert status(env, found)[0]["status"] == "applied"
    before = target.read_bytes()
    assert apply(env, found)["changed"] is False and target.read_bytes() == before


def test_two_opt_in_patches_on_one_anchor_are_refused_as_a_conflict(tmp_path):
    sm120 = next(p for p in load() if p.id == "flashinfer-trtllm-comm-sm120")
    env, target = _fake_package(tmp_path, sm120.hunks[0][0] + "    )\n")
    other = {**yaml.safe_load(FLASHINFER.read_text()), "id": "other", "opt_in": "other", "check": "pass"}
    other["hunks"] = [{"find": sm120.hunks[0][0], "replace": sm120.hunks[0][0].replace("(", "( ", 1)}]
    found = _opt_in_set(tmp_path, other=other)
    before = target.read_bytes()
    with pytest.raises(RigError, match="change the same code .* they cannot both be applied. Nothing was changed"):
        apply(env, found, opted=frozenset({"faster", "other"}))
    assert target.read_bytes() == before


def test_taking_out_over_a_file_changed_since_follows_force(tmp_path):
    sm120 = next(p for p in load() if p.id == "flashinfer-trtllm-comm-sm120")
    env, target = _fake_package(tmp_path, sm120.hunks[0][0] + "    )\n")
    found = _opt_in_set(tmp_path)
    original = target.read_bytes()
    apply(env, found, opted=frozenset({"faster"}))
    target.write_bytes(target.read_bytes() + b"# edited by hand\n")
    with pytest.raises(RigError, match="pass --force to restore rig's backup over it"):
        apply(env, found)
    assert apply(env, found, force=True)["changed"] and target.read_bytes() == original
