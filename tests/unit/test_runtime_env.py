"""The venv's sitecustomize: rendered from the stack, loaded by that venv's interpreters only."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness.commands import rig
from harness.paths import REPO

from rig.machine import doctor
from rig.python import runtime_env
from rig.stack.spec import load

PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


@pytest.fixture
def venv(tmp_path) -> Path:
    path = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


def stack(pcie: bool = True, **variables) -> dict:
    data = load(REPO / "stacks" / "default.yml")
    data["environment"].update(nccl_pcie_only=pcie, vars=variables)
    return data


def environ_of(python: Path, **inherited) -> dict:
    done = subprocess.run([str(python), "-c", PRINT_ENV], capture_output=True, text=True, env=inherited, check=True)
    return json.loads(done.stdout)


def test_a_fresh_interpreter_of_the_venv_has_the_environment_and_no_other_does(venv):
    env = runtime_env.environment(stack(NCCL_DEBUG="WARN"))
    assert runtime_env.install(venv, env, "s")["changed"]
    seen = environ_of(venv / "bin" / "python")
    assert seen["CUDA_HOME"] == "/usr/local/cuda-13.0"
    assert seen["TRITON_PTXAS_PATH"] == "/usr/local/cuda-13.0/bin/ptxas"
    assert seen["TORCH_CUDA_ARCH_LIST"] == "12.0a;9.0a" and seen["FLASHINFER_CUDA_ARCH_LIST"] == "12.0a 9.0a"
    assert seen["NCCL_P2P_LEVEL"] == "SYS" and seen["NCCL_DEBUG"] == "WARN"
    other = environ_of(Path(sys.executable))
    assert not {"CUDA_HOME", "TRITON_PTXAS_PATH", "NCCL_P2P_LEVEL"} & set(other)
    # -S skips site initialisation: nothing rig wrote is imported then
    bare = subprocess.run([str(venv / "bin" / "python"), "-S", "-c", PRINT_ENV], capture_output=True, text=True, env={},
                          check=False)
    assert "CUDA_HOME" not in json.loads(bare.stdout)


def test_the_cuda_variables_win_over_inherited_ones_and_the_defaults_do_not(venv):
    runtime_env.install(venv, runtime_env.environment(stack()), "s")
    seen = environ_of(venv / "bin" / "python", CUDA_HOME="/usr/local/cuda-12.8", NCCL_P2P_LEVEL="NVL")
    assert seen["CUDA_HOME"] == "/usr/local/cuda-13.0" and seen["NCCL_P2P_LEVEL"] == "NVL"


def test_a_sitecustomize_already_in_the_venv_keeps_running(venv):
    site = runtime_env.site_packages(venv)
    theirs = "import os\nos.environ['THEIRS'] = 'yes'\n"
    (site / "sitecustomize.py").write_text(theirs)
    runtime_env.install(venv, runtime_env.environment(stack()), "s")
    seen = environ_of(venv / "bin" / "python")
    assert seen["THEIRS"] == "yes" and seen["CUDA_HOME"] == "/usr/local/cuda-13.0"
    assert (site / "sitecustomize.py").read_text() == theirs
    runtime_env.remove(venv)
    assert (site / "sitecustomize.py").read_text() == theirs and "CUDA_HOME" not in environ_of(venv / "bin" / "python")


def test_flashinfer_jit_compiles_under_the_users_home_keyed_by_the_toolkit_and_flashinfer(venv, tmp_path):
    runtime_env.install(venv, runtime_env.environment(stack()), "s")
    home = tmp_path / "home"
    seen = environ_of(venv / "bin" / "python", HOME=str(home))
    assert seen["FLASHINFER_WORKSPACE_BASE"] == str(home / ".cache/rig/flashinfer-jit/cuda-13.0.2-flashinfer-0.7.2")
    assert environ_of(venv / "bin" / "python", HOME=str(home), FLASHINFER_WORKSPACE_BASE="/srv/jit")[
        "FLASHINFER_WORKSPACE_BASE"] == "/srv/jit"  # a default: the process's own value wins
    upgraded = stack()
    upgraded["cuda"]["version"] = "13.0.3"
    runtime_env.install(venv, runtime_env.environment(upgraded), "s")
    assert environ_of(venv / "bin" / "python", HOME=str(home))["FLASHINFER_WORKSPACE_BASE"].endswith(
        "/cuda-13.0.3-flashinfer-0.7.2")  # an upgraded toolkit never loads what the old one compiled
    no_flashinfer = stack()
    no_flashinfer["flashinfer"] = {}
    assert runtime_env.environment(no_flashinfer)["home"] == {}
    assert "HOME = {\n}" not in runtime_env.render(runtime_env.environment(stack()), "s")


@pytest.mark.parametrize("value", ["/etc/jit", "../../etc", "a/../../b", "", "a\nb"])
def test_a_home_path_that_leaves_the_home_is_refused(value):
    env = {**runtime_env.environment(stack()), "home": {"FLASHINFER_WORKSPACE_BASE": value}}
    with pytest.raises(runtime_env.RigError, match="is not a path under the user's home"):
        runtime_env.render(env, "s")


@pytest.mark.parametrize("section, name, value, problem", [
    ("home", "A=B", "x", "'A=B' is not an environment variable name"),
    ("defaults", "", "x", "'' is not an environment variable name"),
    ("home", "CUDA_HOME", "x", "CUDA_HOME is set twice"),
    ("defaults", "NCCL_DEBUG", 5, "5 is not a text value"),
    ("pinned", "NCCL_DEBUG", "a\0b", "is not a text value")])
def test_what_the_module_cannot_hold_is_refused_before_anything_is_written(venv, section, name, value, problem):
    env = runtime_env.environment(stack())
    env[section] = {**env[section], name: value}
    with pytest.raises(runtime_env.RigError, match=problem):
        runtime_env.install(venv, env, "s")
    assert not (runtime_env.site_packages(venv) / runtime_env.PTH).exists()
    shown = {**env, "stack": "s"}
    done = rig("env", "install", "--venv", str(venv), "--env-json", json.dumps(shown))
    assert done.returncode == 2 and (name or "''") in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("section", ["pinned", "defaults"])
def test_a_run_time_cache_the_stack_sets_itself_is_left_to_the_stack_on_an_image_venv(section):
    """image_env added TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR whatever the stack set: a stack that set either
    was refused on every image venv (a name in two sections)."""
    env = runtime_env.environment(stack())
    env[section] = {**env[section], "TRITON_CACHE_DIR": "/srv/triton"}
    imaged = runtime_env.image_env(env)
    assert imaged["caches"] == {"TORCHINDUCTOR_CACHE_DIR": "torchinductor",
                                "FLASHINFER_WORKSPACE_BASE": env["home"]["FLASHINFER_WORKSPACE_BASE"][11:]}
    text = runtime_env.render(imaged, "s")
    assert text.count('"TRITON_CACHE_DIR"') == 1 and '"TRITON_CACHE_DIR": "/srv/triton",' in text


def test_install_is_idempotent_check_writes_nothing_and_remove_undoes_it(venv):
    env = runtime_env.environment(stack())
    site = runtime_env.site_packages(venv)
    before = sorted(p.name for p in site.iterdir())
    planned = runtime_env.install(venv, env, "s", check=True)
    assert planned["changed"] and "+    \"CUDA_HOME\": \"/usr/local/cuda-13.0\"," in planned["diff"]
    assert sorted(p.name for p in site.iterdir()) == before
    assert runtime_env.install(venv, env, "s")["changed"]
    assert runtime_env.install(venv, env, "s") == {**runtime_env.install(venv, env, "s"), "changed": False}
    changed = runtime_env.install(venv, runtime_env.environment(stack(pcie=False)), "s", check=True)
    assert changed["changed"] and '-    "NCCL_P2P_LEVEL": "SYS",' in changed["diff"]
    assert runtime_env.remove(venv)["changed"] and sorted(p.name for p in site.iterdir()) == before
    assert not runtime_env.remove(venv)["changed"]


def test_doctor_checks_the_environment_a_fresh_interpreter_has(venv, tmp_path):
    (venv / ".rig-stack.json").write_text(json.dumps({"lock_hash": "ab" * 32, "packages": []}))
    names = {"sitecustomize", "triton-ptxas"}
    missing = {c.name: c for c in doctor.run("13.0.2", ["12.0a"], str(tmp_path), str(venv)) if c.name in names}
    assert missing["sitecustomize"].status == "fail" and "rig env install" in missing["sitecustomize"].fix
    runtime_env.install(venv, runtime_env.environment(stack()), "s")
    # the stack's CUDA and archs differ from what the doctor is asked about: named, with the values
    checks = {c.name: c for c in doctor.run("13.0.2", ["12.0a"], "/opt/other", str(venv)) if c.name in names}
    assert checks["sitecustomize"].status == "fail"
    assert "CUDA_HOME='/usr/local/cuda-13.0' (want '/opt/other/cuda-13.0')" in checks["sitecustomize"].detail
    checks = {c.name: c for c in doctor.run("13.0.2", ["12.0a", "9.0a"], "/usr/local", str(venv)) if c.name in names}
    assert checks["sitecustomize"].status == "pass"
    # no toolkit on this machine at /usr/local/cuda-13.0 with ptxas: named, with the fix
    if not os.access("/usr/local/cuda-13.0/bin/ptxas", os.X_OK):
        assert checks["triton-ptxas"].status == "fail" and "is not an executable" in checks["triton-ptxas"].detail


def test_cli_renders_installs_and_refuses_bad_input(venv, tmp_path):
    shown = json.loads(rig("env", "show", "--json").stdout)
    assert shown["stack"] == "sm120-sglang-0.5.23" and shown["defaults"]["NCCL_IB_DISABLE"] == "1"
    done = rig("env", "install", "--venv", str(venv), "--env-json", json.dumps(shown), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["changed"]
    again = json.loads(rig("env", "install", "--venv", str(venv), "--json").stdout)
    assert not again["changed"]  # the role's JSON and the stack file render the same module
    bad = rig("env", "install", "--venv", str(venv), "--env-json", '{"pinned": {}}')
    assert bad.returncode == 2 and "--env-json is not what `rig env show --json` prints" in bad.stderr
    nowhere = rig("env", "install", "--venv", str(tmp_path / "none"))
    assert nowhere.returncode == 2 and "is not a virtualenv" in nowhere.stderr


def test_a_malformed_environment_section_is_refused(tmp_path):
    path = tmp_path / "s.yml"
    path.write_text("name: s\ncuda: {version: '13.0.2'}\nenvironment: {vars: {'BAD-NAME': x}}\n")
    done = rig("env", "show", "--stack", str(path))
    assert done.returncode == 2 and "environment.vars: 'BAD-NAME' is not an environment variable name" in done.stderr


def test_the_start_digest_changes_with_the_lock_the_built_wheels_and_the_environment_and_only_reads(venv):
    """What a server's unit names, so that it restarts: the venv's marker, its built wheels' list and rig's
    environment module, each read as bytes (not text), a missing one as nothing, a FIFO refused, nothing written."""
    site = runtime_env.site_packages(venv)
    seen = [runtime_env.start_digest(venv)]
    runtime_env.install(venv, {"pinned": {"CUDA_HOME": "/usr/local/cuda-13.0"}, "defaults": {}, "home": {}}, "tiny")
    seen.append(runtime_env.start_digest(venv))
    (venv / ".rig-stack.json").write_bytes(b'{"lock_hash": "\xff"}')  # not UTF-8: bytes are hashed
    seen.append(runtime_env.start_digest(venv))
    (venv / ".rig-built.json").write_text("built==1\n")
    seen.append(runtime_env.start_digest(venv))
    no_record = runtime_env.start_digest(venv, records=(".rig-patches.json",))
    (venv / ".rig-patches.json").write_text('{"files": {}}')  # rig server args names the patch record too
    seen.append(runtime_env.start_digest(venv, records=(".rig-patches.json",)))
    assert len(set(seen)) == 5 and no_record != seen[-1] and runtime_env.start_digest(venv) == seen[-2]
    with pytest.raises(runtime_env.RigError, match="outside"):
        runtime_env.start_digest(venv, records=("../elsewhere",))
    files = sorted(p.name for p in site.iterdir())
    (venv / ".rig-built.json").unlink()
    os.mkfifo(venv / ".rig-built.json")
    with pytest.raises(runtime_env.RigError, match="not a regular file"):
        runtime_env.start_digest(venv)
    assert sorted(p.name for p in site.iterdir()) == files
