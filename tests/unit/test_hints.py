"""A hint names a command that works from where the user is: in a checkout with no venv, the commands that need one
say how to make it, and each command that hint names runs there, or refuses only for a step the hint names
before it (never sends the user on to a command the hint did not mention)."""
import re
import shutil

import click
import pytest
from harness.commands import run
from harness.paths import BIN, REPO

from rig.cli import cli
from rig.core.hints import CREATE_VENV
from rig.python.lock import lock_path

NEED_A_VENV = [["tune", "--check"], ["prove", "--check"], ["env", "install", "--check"], ["patch", "status"],
               ["server", "args"]]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A checkout's stacks, whose default stack's venv is not there, and a cache of its own."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(REPO / "stacks", root / "stacks", symlinks=True)
    target = (root / "stacks" / "default.yml").resolve()
    text = target.read_text()
    assert "\nvenv: /opt/rig/venv\n" in text
    target.write_text(text.replace("\nvenv: /opt/rig/venv\n", f"\nvenv: {root / 'venv'}\n")
                      .replace('model: ""', 'model: "testmodel"'))
    return root


def _rig(checkout, *args: str):
    return run([str(BIN / "rig"), *args], cwd=checkout, timeout=120,
               env={"PATH": "/usr/bin:/bin", "HOME": str(checkout), "RIG_CACHE": str(checkout / "cache")})


@pytest.mark.parametrize("argv", NEED_A_VENV, ids=" ".join)
def test_a_command_that_needs_the_missing_venv_says_how_to_make_it(checkout, argv):
    done = _rig(checkout, *argv)
    assert done.returncode == 2 and CREATE_VENV in done.stderr, done.stderr


def _takes_check(argv: list[str]) -> bool:
    """Whether the command ARGV names (its groups' words first) has --check."""
    command = cli
    for word in argv:
        if not isinstance(command, click.Group):
            break
        command = command.get_command(click.Context(command), word)
    return any(p.name == "check" for p in command.params)


def test_every_command_the_venv_hint_names_runs_in_a_checkout_without_one(checkout):
    named = re.findall(r"`(rig [^`]+)`", CREATE_VENV)
    assert len(named) == 3
    lock = lock_path(checkout / "stacks" / "default.yml").relative_to(checkout)
    for index, command in enumerate(named):
        argv = command.replace("LOCK", str(lock)).replace("DIR", "wheelhouse").split()[1:]
        done = _rig(checkout, *argv, *(["--check"] if _takes_check(argv) else []))
        earlier = [c.split(" LOCK")[0] for c in named[:index]]
        assert done.returncode == 0 or any(f"`{e}`" in done.stderr for e in earlier), (command, done.stderr)
