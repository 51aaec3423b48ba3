"""What every command group shares: defaults, exit statuses, options, parameter types and output.

The grammar every command follows, declared here once:
- the stack is `--stack FILE`, else $RIG_STACK, else stacks/default.yml in the nearest directory at or above the
  current one that has it (as cargo finds Cargo.toml); `--help` shows which file that is;
- a venv a command needs is `--venv DIR`, else the stack's `venv` key; an optional one says what its absence means;
- a result directory is `--out DIR`; one file written is `--output FILE` (or `--junit FILE`); every one is
  checked when the command line is read, by one rule (rig.core.outdir): never empty, never where a file or a
  link to nothing is in the way, never a run's own record;
- a number is read by one reader (Number): ASCII digits only;
- a mode flag that makes other options meaningless refuses them (`refuse_unused`);
- a choice misspelt is answered with the close matches.
"""
from __future__ import annotations

import difflib
import errno
import functools
import math
import os
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
from click.core import ParameterSource

from rig.core import RigError, check, defaults, numbers, outdir
from rig.core.documents import dump_json
from rig.core.escape import terminal
from rig.core.fs import atomic_write
from rig.stack.spec import KEY_ENV, load

STACKS_DEFAULT = Path("stacks") / "default.yml"
DEFAULT_CACHE = defaults.cache_dir()
DEFAULT_BUNDLE = os.environ.get("RIG_BUNDLE", str(Path(DEFAULT_CACHE) / "engine" / "rig.pyz"))
STACK_ENV = "RIG_STACK"

# exit statuses, named once: every command and the error boundary in rig.cli use these
OK = 0
JUDGED_FAIL = 1  # the command ran and judged: a check failed (doctor, verify, audit, smoke, bench...)
ERROR = 2  # bad input, or a host problem to fix (the one `rig: error:` line)
PARTIAL = 3  # `rig lock` wrote a lock that could not be fully resolved
INTERNAL = 70  # a defect of rig's own (EX_SOFTWARE)
INTERRUPTED = 130  # Ctrl-C
SIGNALLED = 128  # plus the signal's number: SIGTERM or SIGHUP


def default_stack(start: Path | None = None) -> str | None:
    """stacks/default.yml in START (the current directory) or the nearest directory above it that has one (a
    link to nothing too: need_stack says so, rather than a stack further up being taken silently)."""
    try:
        here = (start or Path.cwd()).absolute()
    except FileNotFoundError:  # the current directory was deleted: nothing is found from it (main says so)
        return None
    for directory in (here, *here.parents):  # a directory there too: --stack's type refuses it in words
        if (directory / STACKS_DEFAULT).exists() or (directory / STACKS_DEFAULT).is_symlink():
            return str(directory / STACKS_DEFAULT)
    return None


def _dangling(path: str) -> str | None:
    """Where PATH, a link to nothing, points; None when PATH is no such link."""
    return os.readlink(path) if os.path.islink(path) and not os.path.exists(path) else None


def _loops(path: str) -> bool:
    """Whether PATH is a link that leads back to itself (ELOOP)."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def _no_stack() -> click.UsageError:
    return click.UsageError(f"no stack: give --stack FILE or set {STACK_ENV} (no {STACKS_DEFAULT} in "
                            f"{Path.cwd()} or any directory above it)")


def need_stack(path: str | None) -> str:
    """The stack a command needs: PATH, or the one error that says how to give it."""
    if path is None:
        raise _no_stack()
    if _loops(path):
        raise RigError(f"stack file {path} is a link that leads back to itself (through {os.readlink(path)}): "
                       "point it at a stack file or give --stack FILE")
    if (target := _dangling(path)) is not None:
        raise RigError(f"stack file {path} is a link to {target}, which does not exist: point the link at a stack "
                       "file or give --stack FILE")
    return path


class StackOption(click.Option):
    """--stack: the option, else $RIG_STACK, else the nearest stacks/default.yml; its help names the file."""

    def get_help_extra(self, ctx):
        extra = super().get_help_extra(ctx)
        found = default_stack()
        missing = found and _dangling(found)
        extra["default"] = f"{found} (the nearest {STACKS_DEFAULT}; a link to {missing}, which does not exist)" \
            if missing else f"{found} (the nearest {STACKS_DEFAULT})" if found else \
            f"none: no {STACKS_DEFAULT} here or above"
        return extra


class _OldStackArgument(click.Argument):
    """The positional STACK of before --stack: accepted for one release, shown nowhere."""

    def get_usage_pieces(self, ctx):
        return []


def stack_option(required: bool = True, positional: bool = False, **settings):
    """--stack, declared once (STACK_PATH): from the option, $RIG_STACK or the nearest stacks/default.yml.
    REQUIRED: the command refuses to run without one (else it gets None and says when it needs one).
    POSITIONAL: the command once took the stack as its argument; that spelling still runs for one release."""
    def declare(func):
        @functools.wraps(func)
        def run(*args, **kwargs):
            old = kwargs.pop("old_stack", None)
            if old is not None:
                if click.get_current_context().get_parameter_source("stack_path") is ParameterSource.COMMANDLINE:
                    raise click.UsageError(f"give the stack once: --stack {kwargs['stack_path']} or the old "
                                           f"positional {old}, not both")
                click.echo("rig: the stack as an argument is now `--stack FILE`; the old spelling goes in the next "
                           "release", err=True)
                kwargs["stack_path"] = old
            if required:
                need_stack(kwargs["stack_path"])
            return func(*args, **kwargs)

        if positional:
            run = click.argument("old_stack", required=False, cls=_OldStackArgument, type=FILE)(run)
        return click.option("--stack", "stack_path", cls=StackOption, envvar=STACK_ENV, show_envvar=True,
                            default=default_stack, metavar="FILE", type=FILE,
                            **{"help": "The stack file.", **settings})(run)

    return declare


VENV_DEFAULT = "Default: the stack's `venv` key."
class PathArg(click.Path):
    """A path on the command line: one with a NUL byte (no system call takes it) is refused in rig's words, and a
    file where a directory stands (or the other way round) as click.Path says."""

    def convert(self, value, param, ctx):
        if "\0" in str(value):
            raise RigError(f"{_named(param)} {str(value)!r}: a path cannot hold a NUL byte")
        return super().convert(value, param, ctx)


FILE = PathArg(dir_okay=False)
DIR = PathArg(file_okay=False)


class Directory(click.Path):
    """A directory named on the command line, never empty: `--venv ""` would mean the stack's venv, `--out ""`
    the current directory."""

    def __init__(self) -> None:
        super().__init__(file_okay=False)

    def convert(self, value, param, ctx):
        if not str(value):
            raise RigError(f"{_named(param)} '': an empty path; give a directory, or leave the option out")
        return value


class OutDir(Directory):
    """A result directory (--out): the one output rule (rig.core.outdir.results_dir) applied when the command line
    is read, before any work; OUTPUTS are the files the command writes into it."""

    def __init__(self, outputs: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.outputs = outputs

    def convert(self, value, param, ctx):
        return str(outdir.results_dir(value, self.outputs, _named(param)))  # what was checked is what is written


class OutFile(click.Path):
    """The one file a command writes (--output, --junit): the output rule (rig.core.outdir.output_file) applied
    when the command line is read."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False)

    def convert(self, value, param, ctx):
        return str(outdir.output_file(value, _named(param)))  # what was checked is what is written


def _named(param: click.Parameter | None) -> str:
    return param.opts[0] if param is not None and param.opts else "the value"


def venv_option(optional: str | None = None, **settings):
    """--venv, declared once (VENV_PATH). A command that needs a venv takes the stack's `venv` key when none is
    given (resolve it with venv_of); OPTIONAL says what a command that can do without one does then."""
    said = settings.pop("help", "The stack's virtualenv.")
    said = f"{said} Without it: {optional}" if optional else f"{said} {VENV_DEFAULT}"
    return click.option("--venv", "venv_path", type=Directory(), metavar="DIR", help=said, **settings)


def venv_of(venv_path: str | None, stack_path: str | None) -> str:
    """The venv a command works on: --venv, else the stack's `venv` key."""
    if venv_path is not None:
        return venv_path
    return load(need_stack(stack_path))["venv"]


def refuse_unused(mode: str, *used: str) -> None:
    """MODE (a mode option, given) ignores every option but USED (parameter names): one given on the command
    line anyway is refused, naming it, before anything runs."""
    ctx = click.get_current_context()
    unused = [p for p in ctx.command.params if p.name not in (*used, "as_json") and isinstance(p, click.Option)
              and ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE]
    if unused:
        names = ", ".join(p.opts[0] for p in unused)
        raise click.UsageError(f"{names} {'has' if len(unused) == 1 else 'have'} no effect with {mode}: leave "
                               f"{'it' if len(unused) == 1 else 'them'} out")


class Choice(click.Choice):
    """click's Choice, with the close matches said when a value is misspelt (`--skip dcotor`: doctor)."""

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            near = difflib.get_close_matches(str(value), [str(c) for c in self.choices], n=3, cutoff=0.6)
            choices = ", ".join(map(str, self.choices))
            hint = f"did you mean {' or '.join(near)}? " if near else ""
            self.fail(f"{value!r} is not a choice: {hint}choose from {choices}", param, ctx)


def out_option(default: str | None, what: str, outputs: tuple[str, ...] = (), **settings):
    """--out DIR, declared once: the directory a command writes its results to (a new one or a directory),
    OUTPUTS the files it writes there; checked by the one output rule (OutDir)."""
    given: dict[str, Any] = {"default": default, "show_default": True} if default is not None else {}  # None: given
    return click.option("--out", "out_dir", type=OutDir(outputs), metavar="DIR", help=f"The result directory: {what}",
                        **given, **settings)


def output_option(what: str = "Write here instead of stdout.", **settings):
    """--output FILE, declared once: the one file a command writes (instead of printing it)."""
    return click.option("--output", type=OutFile(), metavar="FILE", help=what, **settings)


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
api_key_env_option = click.option("--api-key-env", default=KEY_ENV, show_default=True,
                                  help="Environment variable holding the server's API key (sent, never printed).")
prompts_option = click.option("--prompts", "prompts_path", type=FILE, metavar="FILE",
                              help="A JSONL ({\"prompt\", \"max_tokens\"} per line) or ShareGPT JSON prompt file "
                                   "(default: rig's).")
SERVER_URL = "http://127.0.0.1:30000"  # where the stack's server listens unless server.host/port say otherwise


def cache_option(**settings):
    """--cache, declared once: the controller's cache (wheels, CUDA wheels, tools, the engine bundle)."""
    return click.option("--cache", **{"default": DEFAULT_CACHE, "show_default": True, "type": DIR,
                                      "metavar": "DIR", "help": "The controller's cache.", **settings})


def patches_option(help: str = "Directory of patch files (default: rig's own patch set)."):  # noqa: A002 - click's
    """--patches, declared once: a directory of patch files instead of rig's own patch set."""
    return click.option("--patches", "patch_dir", type=DIR, metavar="DIR", help=help)
check_option = click.option("--check", is_flag=True, help="Dry run: say what would change, change nothing.")
prefix_option = click.option("--prefix", default="/usr/local", show_default=True, type=DIR, metavar="DIR",
                             help="Where the cuda-X.Y trees live.")


def judged(ok: bool) -> None:
    """End a command that judged something: OK when it passed, JUDGED_FAIL when not."""
    sys.exit(OK if ok else JUDGED_FAIL)


class Url(click.ParamType):
    """A URL checked when the command line is read: scheme, host and port, so nothing fails later."""
    name = "url"

    def __init__(self, schemes: tuple[str, ...] = ("http", "https")):
        self.schemes = schemes

    def convert(self, value, param, ctx):
        if not value:
            return value
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises on a port out of range
        except ValueError as exc:
            self.fail(f"{value!r} is not a URL: {exc}", param, ctx)
        if parts.scheme not in self.schemes or (parts.scheme != "file" and not parts.hostname) or \
                any(c.isspace() or not c.isprintable() for c in value):
            self.fail(f"{value!r} is not a {'/'.join(self.schemes)} URL, e.g. http://127.0.0.1:30000", param, ctx)
        return value


_NUMERALS = {int: re.compile(r"[+-]?[0-9]+"),
             float: re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(nan|inf)", re.IGNORECASE)}


class Number(click.ParamType):
    """Every number option's reader: ASCII digits only (Python's int and float take any script's digits, `1_0`
    and spaces: `--max-tokens ١٢` would be 12), at most numbers.MAX_CHARS of them; then LOW to HIGH where the
    option says so, else its consumer's range holds (the stack schema's for the plan's options; nan and inf
    reach it as such). MANY: comma-separated, e.g. 1,4,16, shown in --help as LETTER[,LETTER...]. A refusal is a
    RigError, so that a value gets the same words whichever command reads it."""

    def __init__(self, kind: type = int, low: float | None = None, high: float | None = None, many: bool = False,
                 letter: str = "N"):
        self.kind, self.low, self.high, self.many, self.letter = kind, low, high, many, letter
        self.name = ("integer" if kind is int else "float") + (" range" if (low, high) != (None, None) else "")
        self.noun = "whole number" if kind is int else "number"

    def _ranged(self, value: int | float, option: str) -> int | float:
        low, high = (-math.inf if self.low is None else self.low), (math.inf if self.high is None else self.high)
        if (self.low, self.high) != (None, None) and not low <= value <= high:  # nan is in no range
            span = f"from {low} to {high}" if self.low is not None and self.high is not None else \
                f"at least {low}" if self.low is not None else f"at most {high}"
            raise RigError(f"{option} {value}: give a {self.noun} {span}")
        return value

    def get_metavar(self, param, ctx):
        return f"{self.letter}[,{self.letter}...]" if self.many else super().get_metavar(param, ctx)

    def convert(self, value, param, ctx):
        option = _named(param)
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # a default, a number already
            return self._ranged(value, option)
        text = str(value)
        items = text.split(",") if self.many else [text]
        if not all(len(item) <= numbers.MAX_CHARS and _NUMERALS[self.kind].fullmatch(item) for item in items):
            said = f"comma-separated {self.noun}s in ASCII digits, e.g. {'1,4,16' if self.kind is int else '2,8'}" \
                if self.many else f"a {self.noun} in ASCII digits, e.g. 12"
            raise RigError(f"{option} {text!r}: give {said}")
        values = [self._ranged(self.kind(item), option) for item in items]
        return values if self.many else values[0]


class Seconds(Number):
    """A wait: finite, above 0 and at most a week (nan or inf would wait forever)."""

    def __init__(self) -> None:
        super().__init__(float, 0, 7 * 86400)
        self.name = "seconds"

    def _ranged(self, value, option):
        if not 0 < value <= 7 * 86400:
            raise RigError(f"{option} {value}: give seconds above 0 and at most a week (604800)")
        return value


junit_option = click.option("--junit", type=OutFile(),
                            help="Also write the checks as a JUnit XML file (CI systems list each one).")


def write_junit(path: str | None, checks: list, suite: str) -> None:
    """The checks (rig.core.check.Check) as JUnit XML at PATH, when one was given."""
    if path:
        atomic_write(path, check.junit(checks, suite))


def to_file_or_stdout(text: str, out: str | None) -> None:
    if out:
        atomic_write(out, text)
    else:
        click.echo(text, nl=False)


def emit(result: dict, as_json: bool) -> None:
    """RESULT on stdout: as JSON, or its message with whatever input put in it (a log line's terminal
    escapes) made visible."""
    if as_json:
        click.echo(dump_json(result, "the result", indent=2, sort_keys=True))
    else:
        click.echo(terminal(result.get("msg") or "\n".join(f"{k}: {v}" for k, v in result.items())))


def moved(command: click.Command, now: str) -> click.Command:
    """COMMAND under its old top-level name for one release: hidden from `rig --help`, its help and every
    run saying where it went (on stderr, so --json output stays parseable)."""
    line = f"`rig {command.name}` is now `rig {now}`; the old name goes in the next release"

    def run(**kwargs):
        click.echo(f"rig: {line}", err=True)
        return command.callback(**kwargs) if command.callback else None

    return click.Command(command.name, params=command.params, callback=run, hidden=True,
                         help=f"Deprecated: {line}.\n\n{command.help or ''}", short_help=f"Deprecated: use rig {now}.")


def moved_option(old: str, now: str):
    """OLD, an option that became the command NOW, kept hidden for one release: given, it says where it went."""
    def refuse(ctx: click.Context, param: click.Parameter, value: object) -> None:
        if value is not None:
            raise click.UsageError(f"`{ctx.command_path} {old} DIR` is now `rig {now} DIR`", ctx)

    return click.option(old, hidden=True, expose_value=False, callback=refuse, help=f"Moved: rig {now}.")


# The plan's options: (stack key under bench, type, what it sets); --KEY spelled with dashes. Their ranges are
# the stack schema's (rig.serving.measure.plan), so Number reads only the digits.
PLAN_OPTIONS = (
    ("concurrency", Number(int, many=True, letter="C"), "Closed-loop levels, comma-separated, e.g. 1,4,16,64"),
    ("max_tokens", Number(int), "Output tokens per request"),
    ("rounds", Number(int), "Rounds per level, servers interleaved"),
    ("min_requests", Number(int), "Each round sends at least max(this, 2C) requests"),
    ("min_seconds", Number(float), "Each round lasts at least this long"),
    ("temperature", Number(float), "Sampling temperature of every request; 0 is greedy"),
    ("top_p", Number(float), "Sampling top_p of every request"),
    ("seed", Number(int), "Poisson arrivals and the prompt file's order"),
    ("warmup", Number(int), "Requests sent before a server is measured"),
    ("slo_ttft_ms", Number(float), "Goodput SLO on TTFT; 0: none"),
    ("slo_tpot_ms", Number(float), "Goodput SLO on TPOT; 0: none"),
    ("read_timeout", Seconds(), "Seconds without a byte before a request fails"),
    ("request_timeout", Seconds(), "Seconds a whole request may take"),
)
SERIAL_OPTIONS = (("serial_runs", Number(int), "Serial runs"), ("serial_tokens", Number(int), "Tokens per serial run"))


def plan_options(serial: bool = False):
    """The measurement plan's options, declared once for bench and tune: each left out means the stack's bench
    section, and each given is checked by the same schema field as that key (rig.serving.measure.plan)."""
    options = [click.option("--" + key.replace("_", "-"), type=kind, help=f"{what} (default: bench.{key}).")
               for key, kind, what in PLAN_OPTIONS + (SERIAL_OPTIONS if serial else ())]

    def declare(command):
        for option in reversed(options):
            command = option(command)
        return command

    return declare


class RigGroup(click.Group):
    r"""Every rig group: an unknown subcommand is answered in rig's voice with the close matches among the ones
    users see (`no command 'shwo' in \`rig stack\`: did you mean \`rig stack show\`?`)."""

    def shown(self, ctx: click.Context) -> list[str]:
        return [name for name in self.list_commands(ctx)
                if (command := self.get_command(ctx, name)) is not None and not command.hidden]

    def resolve_command(self, ctx, args):
        if args and not args[0].startswith("-") and not ctx.resilient_parsing and \
                self.get_command(ctx, args[0]) is None:
            near = difflib.get_close_matches(args[0], self.shown(ctx), n=3, cutoff=0.6)
            hint = f": did you mean {' or '.join(f'`{ctx.command_path} {n}`' for n in near)}?" if near else ""
            where = f" in `{ctx.command_path}`" if ctx.parent is not None else ""
            raise click.UsageError(f"no command {args[0]!r}{where}{hint}", ctx)
        return super().resolve_command(ctx, args)


def group(name: str | None = None, **kwargs):
    """click.group with rig's voice for unknown subcommands (RigGroup)."""
    return click.group(name, cls=RigGroup, **kwargs)
