"""The README's first screen says only what the repository does: each make target it names exists, each rig
command it shows parses, the box it names is the Makefile's, and a count it gives is the count a command makes."""
import re

import click
from harness.paths import REPO

from rig.ci.validate import tally
from rig.cli import cli
from rig.machine import doctor
from rig.patches.env import Env
from rig.patches.patchset import load, patch_files
from rig.patches.report import status

README = (REPO / "README.md").read_text()
FIRST = README[:README.index("\n## Architecture")]  # the set-up and how to run rig


def test_every_make_target_the_first_screen_names_exists():
    targets = set(re.findall(r"(?m)^([a-z-]+):", (REPO / "Makefile").read_text()))
    named = set(re.findall(r"`make ([a-z-]+)", FIRST)) | set(re.findall(r"(?m)^make ([a-z-]+)", FIRST))
    assert {"provision", "test", "clean-box"} <= named and named <= targets, named - targets


def test_every_rig_command_the_first_screen_shows_parses():
    shown = re.findall(r"(?m)^\.venv/bin/rig ([^#\n]+?)\s*(?:#|$)", FIRST)
    assert len(shown) >= 2
    for line in shown:
        words, command = line.split(), cli
        while isinstance(command, click.Group):
            command = command.get_command(click.Context(command), words.pop(0))
            assert command is not None, line
        command.make_context(line, words, resilient_parsing=False)  # an unknown option or a missing value raises


def test_the_box_and_the_venv_the_first_screen_names_are_the_ones_make_uses():
    makefile = (REPO / "Makefile").read_text()
    assert f"rig doctor --container {doctor.BOX}" in FIRST and f"`{doctor.BOX}`" in FIRST
    assert "VENV ?= .venv\n" in makefile and "rig is $(VENV)/bin/rig" in makefile and "`.venv/bin/rig`" in FIRST


def test_the_patch_count_is_the_sets_and_validate_counts_every_patch_of_it():
    plan = load()
    shown = re.search(r"`set/\*\.yml \((\d+)\)`", README)
    assert shown and int(shown[1]) == len(plan) == len(list(patch_files(None)))
    rows = status(Env(python="", prefix=REPO, packages={}), plan)
    assert tally(rows) == f"{len(plan)} patches: {len(plan)} not-applicable"
    # an opt-in patch not asked for is one of the set too: validate once left it out of its counts
    assert tally([{"status": "needed"}, {"status": "opt-in"}, {"status": "upstream"}]) == \
        "3 patches: 1 needed, 1 upstream, 1 opt-in"
