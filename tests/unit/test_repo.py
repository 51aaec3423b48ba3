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
                          capture_output=True, text=True, env=ansible_env(), cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr


def test_role_readmes_are_rendered_from_their_argument_specs():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "role_readme.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_readme_opens_with_the_two_set_up_commands():
    text = (REPO / "README.md").read_text()
    first_block = text.split("```")[1]
    assert [line for line in first_block.splitlines()[1:] if line.strip()] == ["make provision", "make test"]
