"""Repository hygiene that a user relies on: playbooks parse, role READMEs are current."""
import subprocess
import sys

import pytest

from conftest import BIN, REPO, ansible_env

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
