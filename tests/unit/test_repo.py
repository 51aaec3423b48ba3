"""Repository hygiene that a user relies on: playbooks parse, role READMEs are current."""
import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import BIN, REPO, ansible_env, run

PLAYBOOKS = sorted(p.name for p in (REPO / "playbooks").glob("*.yml"))


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_syntax(playbook):
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(REPO / "inventory" / "local"),
                           "--syntax-check", str(REPO / "playbooks" / playbook)],
                          capture_output=True, text=True, env=ansible_env(), cwd=REPO, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_role_readmes_are_rendered_from_their_argument_specs():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "role_readme.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def test_readme_opens_with_the_two_set_up_commands():
    text = (REPO / "README.md").read_text()
    first_block = text.split("```")[1]
    assert [line for line in first_block.splitlines()[1:] if line.strip()] == ["make provision", "make test"]


WORKFLOWS = [("github-actions.yml", "vendor.github-workflows"), ("gitlab-ci.yml", "vendor.gitlab-ci")]


@pytest.mark.parametrize("name, schema", WORKFLOWS)
def test_the_example_ci_workflows_pass_their_schemas_and_a_broken_one_does_not(tmp_path, name, schema):
    def check(path):
        return subprocess.run([str(BIN / "check-jsonschema"), "--builtin-schema", schema, str(path)],
                              capture_output=True, text=True, check=False)

    workflow = REPO / "docs" / "ci" / name
    done = check(workflow)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rig validate" in workflow.read_text() and "--junit" in workflow.read_text()
    broken = tmp_path / name
    broken.write_text(workflow.read_text().replace("runs-on:", "runs_on:").replace("stage: validate", "stage: [1]"))
    assert check(broken).returncode != 0


def test_plays_become_root_on_real_hosts_not_in_containers_unless_the_inventory_says(tmp_path):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {
        "box": {"ansible_connection": "community.docker.docker_api"},
        "real": {"ansible_host": "192.0.2.1"},
        "rootlogin": {"ansible_host": "192.0.2.2", "rig_become": False},
        "boxwithsudo": {"ansible_connection": "community.docker.docker_api", "rig_become": True}}}}))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
           "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    # what every play in playbooks/ says for become, evaluated with that dir's group_vars (no host is contacted)
    done = run([str(BIN / "ansible"), "-i", str(inventory), "--playbook-dir", str(REPO / "playbooks"), "all",
                "-m", "debug", "-a", "msg={{ rig_become | default(rig_become_default) }}"], env=env)
    assert done.returncode == 0, done.stderr
    said = {host: result["msg"] for host, result in json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"].items()}
    assert said == {"box": False, "real": True, "rootlogin": False, "boxwithsudo": True}
    for playbook in (REPO / "playbooks").glob("*.yml"):
        for play in yaml.safe_load(playbook.read_text()):
            assert play.get("become", "{{ rig_become | default(rig_become_default) }}") == \
                "{{ rig_become | default(rig_become_default) }}", playbook.name


def test_the_roles_and_the_dockerfile_spell_the_paths_rig_core_defaults_names():
    """Ansible and Docker cannot import rig.core.defaults: their own spellings are held to it here."""
    from rig.core import defaults

    def role(name: str) -> dict:
        return yaml.safe_load((REPO / "roles" / name / "defaults" / "main.yml").read_text())

    venvs = {role("python_stack")["python_stack_venv"], role("sglang_patches")["sglang_patches_venv"],
             role("wheel_build")["wheel_build_venv"]}
    assert venvs == {defaults.VENV}
    assert role("cuda_toolkit")["cuda_toolkit_state_dir"] == defaults.STATE_DIR
    dockerfile = (REPO / "rig" / "image" / "Dockerfile").read_text()
    assert f"--venv {defaults.VENV} " in dockerfile and f" {defaults.IMAGE_ROOT}/patches/" in dockerfile
    assert f"{defaults.IMAGE_ROOT}/rig.pyz" in dockerfile


def test_the_suites_results_callback_counts_what_ansibles_recap_counts(tmp_path):
    """Play.recap and Play.changed_tasks read the JSON of tests/callback_plugins/rig_results.py, not the text."""
    from conftest import Play

    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump([{"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": [
        {"name": "Change something", "ansible.builtin.command": "true"},
        {"name": "Change nothing", "ansible.builtin.command": "true", "changed_when": False},
        {"name": "Loop twice", "ansible.builtin.command": "true", "loop": [1, 2]},
        {"name": "Fail", "ansible.builtin.fail": {"msg": "as asked"}, "when": "fail | default(false) | bool"}]}]))
    cmd = [str(BIN / "ansible-playbook"), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
           str(book)]
    done = Play.run(cmd).expect_ok()
    assert (done.recap("ok"), done.recap("changed"), done.recap("skipped"), done.recap("failed")) == (3, 2, 1, 0)
    assert done.changed_tasks() == ["Change something: localhost", "Loop twice: localhost"]
    assert done.recap("changed", "localhost") == 2
    failed = Play.run(cmd + ["-e", "fail=true"])
    assert not failed.ok and failed.recap("failed", "localhost") == 1
    with pytest.raises(AssertionError, match="elsewhere is not in the recap"):
        failed.recap("ok", "elsewhere")


PATCHED = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from ansible import constants as C
from ansible.executor import module_common
original = module_common._CachedModule.dump
import rig_results
rig_results.CallbackModule()
print(json.dumps({"patched": module_common._CachedModule.dump is not original,
                  "linked": os.path.lexists(os.path.join(C.DEFAULT_LOCAL_TMP, "ansiballz_cache"))}))
"""


def test_the_results_callback_patches_ansible_only_when_a_test_asks(tmp_path):
    """Loaded without $RIG_ANSIBALLZ_CACHE, the suite's callback leaves ansible-core's module_common as it is and
    links no payload cache: the plays of the end-to-end tests (site, upgrade, rollout), which never ask, run the
    Ansible users run. Asked, it does both (so this test can tell)."""
    env = {k: v for k, v in ansible_env().items() if k != "RIG_ANSIBALLZ_CACHE"}
    script = [sys.executable, "-c", PATCHED, str(REPO / "tests" / "callback_plugins")]
    stock = subprocess.run(script, capture_output=True, text=True, env=env, check=False)
    assert stock.returncode == 0, stock.stderr
    assert json.loads(stock.stdout) == {"patched": False, "linked": False}
    asked = subprocess.run(script, capture_output=True, text=True, check=False,
                           env={**env, "RIG_ANSIBALLZ_CACHE": str(tmp_path / "payloads")})
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout) == {"patched": True, "linked": True}
    # the opt-in is a marker; the end-to-end tests carry none
    from conftest import PAYLOAD_CACHE

    integration = REPO / "tests" / "integration"
    assert PAYLOAD_CACHE not in (integration / "test_upgrade.py").read_text()
    assert PAYLOAD_CACHE not in (integration / "test_rollout.py").read_text()
    site = (integration / "test_python_stack.py").read_text()
    before = site.split("\ndef test_site_yml_with_the_default_stack_provisions_a_box_with_no_internet(")[0]
    assert not before.rstrip().endswith("@PAYLOADS") and PAYLOAD_CACHE not in site.split("pytestmark")[1].split("\n")[0]


def test_the_suites_module_payloads_carry_bytecode_that_python_reads(tmp_path, monkeypatch):
    """The callback keeps each payload's module_utils compiled beside their sources: Python imports the bytecode
    from the zip, and a Python of another version (another magic number) reads the source instead. The module
    itself stays source (its frames name it as Ansible's deprecations read them)."""
    import base64
    import io
    import pickle
    import zipfile

    from conftest import Play

    monkeypatch.syspath_prepend(str(REPO / "tests" / "callback_plugins"))
    from rig_results import _with_bytecode

    plain = io.BytesIO()
    with zipfile.ZipFile(plain, "w") as payload:
        for name, text in (("__init__.py", ""), ("module_utils/__init__.py", ""), ("module_utils/mod.py", "VALUE = 42"),
                           ("module_utils/new.py", "def f[T](): pass"),
                           ("modules/__init__.py", ""), ("modules/task.py", "")):
            payload.writestr(f"ansible/{name}", text)
    zipped = tmp_path / "payload.zip"
    zipped.write_bytes(base64.b64decode(_with_bytecode(base64.b64encode(plain.getvalue()))))
    assert sorted(n for n in zipfile.ZipFile(zipped).namelist() if n.endswith(".pyc")) == [
        "ansible/module_utils/__init__.pyc", "ansible/module_utils/mod.pyc"]  # 3.12 syntax and the module: source
    show = ("import sys; sys.path.insert(0, sys.argv[1]); import ansible.module_utils.mod as m; "
            "print(m.VALUE, m.__file__)")
    assert run([sys.executable, "-c", show, str(zipped)]).stdout.split() == ["42",
                                                                             f"{zipped}/ansible/module_utils/mod.pyc"]
    other = tmp_path / "other.zip"  # the same bytes but the magic number: another Python's bytecode
    with zipfile.ZipFile(zipped) as source, zipfile.ZipFile(other, "w") as payload:
        for name in source.namelist():
            data = source.read(name)
            payload.writestr(name, b"\0\0\r\n" + data[4:] if name.endswith(".pyc") else data)
    assert run([sys.executable, "-c", show, str(other)]).stdout.split() == ["42",
                                                                            f"{other}/ansible/module_utils/mod.py"]

    # a play's module comes from the cache with ansible.module_utils compiled
    monkeypatch.setenv("RIG_ANSIBALLZ_CACHE", str(tmp_path / "cache"))
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump([{"hosts": "localhost", "connection": "local", "gather_facts": False,
                                     "tasks": [{"name": "Run", "ansible.builtin.command": "true"}]}]))
    Play.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
              str(book)]).expect_ok()
    cached = [p for p in (tmp_path / "cache").glob("ansible.modules.command-*") if p.suffix != ".lock"]
    assert len(cached) == 1
    names = zipfile.ZipFile(io.BytesIO(base64.b64decode(pickle.loads(cached[0].read_bytes()).zip_data))).namelist()
    assert {"ansible/module_utils/basic.py", "ansible/module_utils/basic.pyc", "ansible/modules/command.py"} <= \
        set(names) and "ansible/modules/command.pyc" not in names


def test_every_module_and_test_the_box_run_groups_by_name_exists():
    """A renamed module or test would leave its group silently (the scheduler groups the rest by module)."""
    from conftest import GROUPS, LEADS, worker_group

    for key, group in [*GROUPS.items(), *((lead, None) for lead in LEADS)]:
        module, _, test = key.partition("::")
        source = (REPO / "tests" / "integration" / f"{module}.py").read_text()
        assert not test or f"\ndef {test}(" in source, key
        assert group is None or worker_group(f"tests/integration/{module}.py::{test or 'test_any'}[a-b]") == group


def test_the_box_run_orders_groups_by_first_and_each_lead_first_in_its_group():
    """The order pytest_collection_modifyitems gives: FIRST's groups in turn, a group's lead before the rest."""
    from conftest import FIRST, LEADS, worker_group

    done = run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "box or venv", "tests/integration"],
               cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    groups = [worker_group(i) for i in ids]
    ranks = [FIRST.index(g) if g in FIRST else len(FIRST) for g in groups]
    assert ranks == sorted(ranks)
    for lead in LEADS:
        at = next(n for n, i in enumerate(ids) if lead.split("::")[1] in i)
        assert at == groups.index(groups[at]), (lead, ids[groups.index(groups[at])])
