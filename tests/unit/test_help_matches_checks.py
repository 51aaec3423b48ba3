"""Every command's --help says what its options accept: a choice lists exactly the values the option takes (prose
that names some of them names them all), and a list option shows a list metavar and takes a list."""
import re

import click
import pytest

from rig.cli import cli
from rig.cli.common import Number
from rig.serving.prove import STEPS


def _commands(group: click.Group = cli, path: str = "rig"):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from _commands(command, f"{path} {name}")
        elif command is not None:
            yield f"{path} {name}", command


COMMANDS = dict(_commands())


def _options(kind: type):
    return [(f"{path} {param.opts[0]}", command, param) for path, command in COMMANDS.items()
            for param in command.params if isinstance(param, click.Option) and isinstance(param.type, kind)]


def _help(command: click.Command, name: str) -> str:
    return " ".join(command.get_help(click.Context(command, info_name=name)).split())


@pytest.mark.parametrize("where, command, param", _options(click.Choice), ids=lambda v: v if isinstance(v, str) else "")
def test_a_choices_help_lists_exactly_the_values_it_accepts(where, command, param):
    ctx = click.Context(command)
    choices = [str(c) for c in param.type.choices]
    shown = re.search(r"\[([^\]]*)\]", param.make_metavar(ctx))
    assert shown and shown[1].split("|") == choices, where
    assert param.make_metavar(ctx) in _help(command, where.split(" --")[0])
    for choice in choices:
        assert param.type.convert(choice, param, ctx) == choice
    with pytest.raises(click.BadParameter):
        param.type.convert("not-a-choice", param, ctx)
    named = [c for c in choices if re.search(rf"\b{re.escape(c)}\b", param.help or "")]
    assert len(named) < 2 or named == choices, f"{where}'s help names {named} of {choices}"


def test_proves_skip_offers_every_step_prove_runs():
    skip = next(p for p in COMMANDS["rig prove"].params if p.name == "skip")
    assert list(skip.type.choices) == list(STEPS) and "acceptance" in STEPS


LISTS = [(where, command, param) for where, command, param in _options(Number) if param.type.many]


def test_the_list_options_are_found():
    assert {"rig bench --concurrency", "rig tune --concurrency", "rig tune --request-rate"} <= {w for w, _, _ in LISTS}


@pytest.mark.parametrize("where, command, param", LISTS, ids=lambda v: v if isinstance(v, str) else "")
def test_a_list_option_shows_a_list_metavar_and_takes_a_list(where, command, param):
    ctx = click.Context(command)
    metavar = param.make_metavar(ctx)
    assert re.fullmatch(r"([A-Z])\[,\1\.\.\.\]", metavar), f"{where} shows {metavar}"
    assert metavar in _help(command, where.split(" --")[0])
    assert param.type.convert("1,2", param, ctx) == [1, 2]


@pytest.mark.parametrize("where, command, param", _options(click.ParamType), ids=lambda v: v if isinstance(v, str) else "")
def test_an_option_whose_help_gives_a_list_takes_one(where, command, param):
    if re.search(r"comma-separated|e\.g\. \d+,\d+", param.help or ""):
        assert isinstance(param.type, Number) and param.type.many, f"{where}'s help gives a list it does not take"
