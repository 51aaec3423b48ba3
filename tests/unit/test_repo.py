"""Repository hygiene that a user relies on: playbooks parse, role READMEs are current."""
import json
import os
import subprocess
import sys

import pytest
import yaml
from harness.commands import run
from harness.paths import BIN, REPO
from harness.plays import ansible_env

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
    from harness.plays import Play

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


def test_every_module_and_test_the_box_run_groups_by_name_exists():
    """A renamed module or test would leave its group silently (the scheduler groups the rest by module)."""
    from harness.worker_groups import GROUPS, LEADS, worker_group

    for key, group in [*GROUPS.items(), *((lead, None) for lead in LEADS)]:
        module, _, test = key.partition("::")
        source = (REPO / "tests" / "integration" / f"{module}.py").read_text()
        assert not test or f"\ndef {test}(" in source, key
        assert group is None or worker_group(f"tests/integration/{module}.py::{test or 'test_any'}[a-b]") == group


def test_the_box_run_orders_groups_by_first_and_each_lead_first_in_its_group():
    """The order pytest_collection_modifyitems gives (the box run's and the quick run's alike): FIRST's groups in
    turn, a group's lead before the rest."""
    from harness.worker_groups import FIRST, LEADS, worker_group

    done = run([sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/integration"],
               cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    groups = [worker_group(i) for i in ids]
    ranks = [FIRST.index(g) if g in FIRST else len(FIRST) for g in groups]
    assert ranks == sorted(ranks)
    for lead in LEADS:
        at = next(n for n, i in enumerate(ids) if lead.split("::")[1] in i)
        assert at == groups.index(groups[at]), (lead, ids[groups.index(groups[at])])
