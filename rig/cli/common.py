"""What every command group shares: defaults, exit statuses, errors, options and output (what a value may be is
rig.cli.types).

The grammar every command follows, declared here once:
- the stack is `--stack FILE`, else $RIG_STACK, else stacks/default.yml in the nearest directory at or above the
  current one that has it (as cargo finds Cargo.toml); `--help` shows which file that is;
- a venv a command needs is `--venv DIR`, else the stack's `venv` key; an optional one says what its absence means;
- a result directory is `--out DIR`; one file written is `--output FILE` (or `--junit FILE`); every one is
  checked when the command line is read, by one rule (rig.core.outdir): never empty, never where a file or a
  link to nothing is in the way, never a run's own record;
- every path is typed: one here as a click path, one on the target host as HostPath;
- an option several commands take is declared here once (`shared`), as pip's cmdoptions declares its options;
- an old spelling (a command, an option) is still read until the release its Renamed names, and says so;
- a number is read by one reader (Number): ASCII digits only;
- a mode flag that makes other options meaningless refuses them (`refuse_unused`);
- a misspelt command or choice is answered with the close matches;
- an error's remedy is its hint, a line of its own (RigError's hint, UsageError's here).
"""
from __future__ import annotations

import difflib
import errno
import functools
import os
import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from rig.cli.types import DIR, FILE, Choice, Directory, Number, OutDir, OutFile, PathOrUrl, Seconds, Url
from rig.core import RigError, check, defaults
from rig.core.documents import dump_json
from rig.core.escape import terminal
from rig.core.fs import atomic_write
from rig.core.renames import Renamed
from rig.stack.spec import ARCHS, KEY_ENV, load

STACKS_DEFAULT = Path("stacks") / "default.yml"
DEFAULT_CACHE = defaults.cache_dir()
DEFAULT_BUNDLE = os.environ.get("RIG_BUNDLE", str(Path(DEFAULT_CACHE) / "engine" / "rig.pyz"))
STACK_ENV = "RIG_STACK"
SERVER_URL = "http://127.0.0.1:30000"  # where the stack's server listens unless server.host/port say otherwise

# exit statuses, named once: every command and the error boundary in rig.cli use these
OK = 0
JUDGED_FAIL = 1  # the command ran and judged: a check failed (doctor, verify, audit, smoke, bench...)
ERROR = 2  # bad input, or a host problem to fix (the one `rig: error:` line)
PARTIAL = 3  # `rig lock` wrote a lock that could not be fully resolved
CANNOT_HERE = 4  # this host cannot do it this way (`rig venv mount`: no root, loop device or squashfs): fall back
INTERNAL = 70  # a defect of rig's own (EX_SOFTWARE)
INTERRUPTED = 130  # Ctrl-C
SIGNALLED = 128  # plus the signal's number: SIGTERM or SIGHUP
REASONS = {"cannot-mount": CANNOT_HERE}  # a RigError's reason -> its exit status (else ERROR)


class UsageError(click.UsageError):
    """A command line rig refuses, with its remedy apart: the boundary prints HINT as the error's hint line."""

    def __init__(self, message: str, hint: str | None = None, ctx: click.Context | None = None) -> None:
        super().__init__(message, ctx)
        self.hint = hint


# ------------------------------------------------------------------ the stack

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


def need_stack(path: str | None) -> str:
    """The stack a command needs: PATH, or the one error that says how to give it."""
    if path is None:
        raise UsageError(f"no stack: no {STACKS_DEFAULT} in {Path.cwd()} or any directory above it",
                         hint=f"give --stack FILE or set {STACK_ENV}")
    if _loops(path):
        raise RigError(f"stack file {path} is a link that leads back to itself (through {os.readlink(path)})",
                       hint="point it at a stack file or give --stack FILE")
    if (target := _dangling(path)) is not None:
        raise RigError(f"stack file {path} is a link to {target}, which does not exist",
                       hint="point the link at a stack file or give --stack FILE")
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
    """The positional STACK of before --stack: still read (OLD_STACK says until when), shown nowhere."""

    def get_usage_pieces(self, ctx):
        return []


OLD_STACK = Renamed("the stack as an argument", "`--stack FILE`", "0.2.0")


def stack_option(required: bool = True, positional: bool = False, **settings):
    """--stack, declared once (STACK_PATH): from the option, $RIG_STACK or the nearest stacks/default.yml.
    REQUIRED: the command refuses to run without one (else it gets None and says when it needs one).
    POSITIONAL: the command once took the stack as its argument; that spelling is still read (OLD_STACK)."""
    def declare(func):
        @functools.wraps(func)
        def run(*args, **kwargs):
            old = kwargs.pop("old_stack", None)
            if old is not None:
                if click.get_current_context().get_parameter_source("stack_path") is ParameterSource.COMMANDLINE:
                    raise UsageError(f"the stack given twice: --stack {kwargs['stack_path']} and the old positional "
                                     f"{old}", hint="give the stack once, as --stack FILE")
                OLD_STACK.warn()
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


# ------------------------------------------------------------------ old spellings

class RenamedOption(click.Option):
    """An option with a former spelling, OLD: still read until REMOVED_IN, hidden from --help but named in the
    option's help, each use saying on stderr what to write now; both spellings given at once is refused."""

    def __init__(self, *decls: Any, old: str, removed_in: str, **attrs: Any) -> None:
        super().__init__(*decls, **attrs)
        self.old, self.renamed = old, Renamed(f"`{old}`", f"`{self.opts[0]}`", removed_in)
        self.help = f"{self.help or ''} {old} is its old spelling, removed in rig {removed_in}.".lstrip()

    def add_to_parser(self, parser, ctx):
        super().add_to_parser(parser, ctx)
        taken = {"action": "store_const", "const": self.flag_activation_value} if self.is_flag else \
            {"action": "store", "nargs": self.nargs}
        parser.add_option(obj=self, opts=[self.old], dest=f"{self.name} (old)", **taken)

    def consume_value(self, ctx, opts):
        if f"{self.name} (old)" in opts:
            if self.name in opts:
                raise UsageError(f"{self.opts[0]} given twice, once as {self.old}", ctx=ctx,
                                 hint=f"give {self.opts[0]} alone ({self.old} is its old spelling)")
            self.renamed.warn()
            opts = {**opts, self.name: opts[f"{self.name} (old)"]}
        return super().consume_value(ctx, opts)


def moved(command: click.Command, renamed: Renamed) -> click.Command:
    """COMMAND under its old top-level name until the release RENAMED names: hidden from `rig --help`, its help
    and every run saying where it went (on stderr, so --json output stays parseable)."""
    def run(**kwargs):
        renamed.warn()
        return command.callback(**kwargs) if command.callback else None

    return click.Command(command.name, params=command.params, callback=run, hidden=True,
                         help=f"Deprecated: {renamed}.\n\n{command.help or ''}",
                         short_help=f"Deprecated: use {renamed.new}.")


def moved_option(old: str, now: str, removed_in: str):
    """OLD, an option that became the command NOW, kept hidden until REMOVED_IN: given, it is refused, saying where
    it went (it would do what the other command does, in the wrong place)."""
    renamed = Renamed(f"`{old} DIR`", f"`rig {now} DIR`", removed_in)

    def refuse(ctx: click.Context, param: click.Parameter, value: object) -> None:
        if value is not None:
            raise UsageError(str(renamed), hint=f"run `rig {now} DIR`", ctx=ctx)

    return click.option(old, hidden=True, expose_value=False, callback=refuse, help=f"Moved: rig {now}.")


# ------------------------------------------------------------------ options several commands take, each once

def shared(*decls: str, **declared: Any):
    """An option several commands take, declared once, as pip's cmdoptions declares each of its options: the
    decorator factory a command applies, where it may say more (its own help, default, or a type for a path on
    the target host), never declare the option again (tests/unit/test_cli_grammar.py holds every option two
    commands take to one declaration)."""
    def option(**said: Any):
        return click.option(*decls, **{**declared, **said})

    return option


# each command says its default (venv_archive.place.STORE): importing it here would load every command with it
store_option = shared("--store", type=Directory(), show_default=True, metavar="DIR")
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
check_option = click.option("--check", is_flag=True, help="Dry run: say what would change, change nothing.")
api_key_env_option = click.option("--api-key-env", default=KEY_ENV, show_default=True, metavar="NAME",
                                  help="Environment variable holding the server's API key (sent, never printed).")
prompts_option = click.option("--prompts", "prompts_path", type=FILE, metavar="FILE",
                              help="A JSONL ({\"prompt\", \"max_tokens\"} per line) or ShareGPT JSON prompt file "
                                   "(default: rig's).")
prefix_option = click.option("--prefix", default="/usr/local", show_default=True, type=DIR, metavar="DIR",
                             help="Where the cuda-X.Y trees live.")
junit_option = click.option("--junit", type=OutFile(),
                            help="Also write the checks as a JUnit XML file (CI systems list each one).")


# --stack where a command works on one venv: the stack only says which venv, when --venv does not
whose_stack = stack_option(required=False, help="The stack whose venv it is (when --venv is not given).")


def one_venv_change(**venv_settings: Any):
    """A command that changes one venv and says what it did: --venv (VENV_SETTINGS: its own help), else the stack's
    (whose_stack), --check and --json; resolve the venv with venv_of."""
    return options_of(venv_option(**venv_settings), whose_stack, check_option, json_option)


def options_of(*options):
    """One decorator for OPTIONS, applied in their order (the first stands first in --help)."""
    def declare(command):
        for option in reversed(options):
            command = option(command)
        return command

    return declare


def out_option(default: str | None, what: str, outputs: tuple[str, ...] = (), **settings):
    """--out DIR, declared once: the directory a command writes its results to (a new one or a directory),
    OUTPUTS the files it writes there; checked by the one output rule (OutDir)."""
    given: dict[str, Any] = {"default": default, "show_default": True} if default is not None else {}  # None: given
    return click.option("--out", "out_dir", type=OutDir(outputs), metavar="DIR", help=f"The result directory: {what}",
                        **given, **settings)


def output_option(what: str = "Write here instead of stdout.", **settings):
    """--output FILE, declared once: the one file a command writes (instead of printing it)."""
    return click.option("--output", type=OutFile(), metavar="FILE", help=what, **settings)


cache_option = shared("--cache", default=DEFAULT_CACHE, show_default=True, type=DIR, metavar="DIR",
                      help="The controller's cache.")
patches_option = shared("--patches", "patch_dir", type=DIR, metavar="DIR",
                        help="Directory of patch files (default: rig's own patch set).")
opt_in_option = shared("--opt-in", "opt_in", multiple=True, metavar="FEATURE",
                       help="Ask for the opt-in patches of FEATURE (e.g. free-off), beside the stack's "
                            "patches.opt_in; repeatable.")
patched_option = shared("--patched/--unpatched", "patched", default=None,
                        help="The venv carries rig's patch set (the opt-in patches of each --opt-in too), or none.")
python_option = shared("--python", "python", type=FILE, metavar="PATH",
                       help="Use this interpreter instead of the venv's.")
# the CUDA toolkit
toolkit_version_option = shared("--version", "version", required=True, metavar="VERSION",
                                help="Toolkit release, e.g. 13.0.2.")
method_option = shared("--method", type=Choice(["wheels", "runfile", "apt"]), default="wheels", show_default=True,
                       help="A stack's cuda.method; apt is the cuda_toolkit role's, refused here naming it.")
components_option = shared("--component", "components", multiple=True, metavar="NAME",
                           help="cuda-toolkit extra; repeat. Default: all rig needs.")
runfile_sha256_option = shared("--sha256", default="", metavar="SHA256", help="Expected runfile sha256 (runfile method).")
cuda_home_option = shared("--cuda-home", type=DIR, metavar="DIR",
                          help="The CUDA toolkit with nvcc (default: PREFIX/cuda-X.Y of the stack's CUDA).")
state_dir_option = shared("--state-dir", default=defaults.STATE_DIR, show_default=True, type=DIR, metavar="DIR",
                          help="Where rollback state is kept.")
root_option = shared("--root", type=DIR, metavar="DIR", help="Where the tree is seen now; paths are written as seen "
                     "from /.")
arch_option = shared("--arch", "archs", multiple=True, type=Choice(ARCHS),
                     help="A GPU arch the stack targets; repeat (default: the stack's archs).")
# wheels and venvs
lock_option = shared("--lock", "lock_file", type=FILE, metavar="FILE", help="The stack's lock.")
lock_hash_option = shared("--lock-hash", metavar="SHA256", help="The stack lock's hash.")
wheelhouse_option = shared("--wheelhouse", type=DIR, metavar="DIR",
                           help="An exported wheelhouse dir (rig wheelhouse export).")
find_links_option = shared("--find-links", type=PathOrUrl(file_okay=False), metavar="URL_OR_DIR",
                           help="Take the wheels from this URL (or directory); the wheelhouse dir then needs only its "
                                "requirements file (image builds).")
manifest_option = shared("--manifest", type=FILE, metavar="FILE",
                         help="A venv archive's NAME.manifest.json (rig venv pack wrote it).")
jobs_option = shared("--jobs", type=Number(int, 1),
                     help="Parallel compile jobs (default: cores, capped by memory at 4 GiB a job).")
# the machine
pci_root_option = shared("--pci-root", default="/sys/bus/pci/devices", show_default=True, type=DIR, metavar="DIR",
                         help="sysfs PCI devices.")
module_version_option = shared("--module-version-path", default="/sys/module/nvidia/version", show_default=True,
                               type=FILE, metavar="FILE", help="Where the loaded nvidia kernel module tells its version.")
driver_package_option = shared("--driver-package", metavar="PACKAGE", help="The driver's package (nvidia-driver-580-open).")
# serving
url_option = shared("--url", type=Url(), default=SERVER_URL, show_default=True, help="The SGLang server.")
port_option = shared("--port", type=Number(int, 1, 65535), help="The port to serve on.")
tp_option = shared("--tp", type=Number(int, 1, 64), help="GPUs the server splits the model over.")
log_option = shared("--log", "log_path", type=FILE, metavar="FILE", help="The server's log file.")
start_timeout_option = shared("--start-timeout", type=Seconds(), metavar="SECONDS",
                              help="Seconds a server has to start: /health_generate answering 200.")
force_option = shared("--force", is_flag=True, help="Act even over files changed since.")

# The plan's options: stack key under bench -> (type, what it sets); --KEY spelled with dashes. Their ranges are
# the stack schema's (rig.serving.measure.plan), so Number reads only the digits.
PLAN_OPTIONS = {
    "concurrency": (Number(int, many=True, letter="C"), "Closed-loop levels, comma-separated, e.g. 1,4,16,64"),
    "max_tokens": (Number(int), "Output tokens per request"),
    "rounds": (Number(int), "Rounds per level, servers interleaved"),
    "min_requests": (Number(int), "Each round sends at least max(this, 2C) requests"),
    "min_seconds": (Number(float), "Each round lasts at least this long"),
    "temperature": (Number(float), "Sampling temperature of every request; 0 is greedy"),
    "top_p": (Number(float), "Sampling top_p of every request"),
    "seed": (Number(int), "Poisson arrivals and the prompt file's order"),
    "warmup": (Number(int), "Requests sent before a server is measured"),
    "slo_ttft_ms": (Number(float), "Goodput SLO on TTFT; 0: none"),
    "slo_tpot_ms": (Number(float), "Goodput SLO on TPOT; 0: none"),
    "read_timeout": (Seconds(), "Seconds without a byte before a request fails"),
    "request_timeout": (Seconds(), "Seconds a whole request may take"),
}
SERIAL_OPTIONS = {"serial_runs": (Number(int), "Serial runs"), "serial_tokens": (Number(int), "Tokens per serial run")}


def plan_option(key: str, **said: Any):
    """The plan's option for bench.KEY, declared once: plan_options takes every one; a command that sends requests
    of its own (smoke) takes one alone, with its own default and help."""
    kind, what = {**PLAN_OPTIONS, **SERIAL_OPTIONS}[key]
    return click.option("--" + key.replace("_", "-"), **{"type": kind, "help": f"{what} (default: bench.{key}).",
                                                          **said})


def plan_options(serial: bool = False):
    """The measurement plan's options for bench and tune: each left out means the stack's bench section, and each
    given is checked by the same schema field as that key (rig.serving.measure.plan)."""
    return options_of(*(plan_option(key) for key in [*PLAN_OPTIONS, *(SERIAL_OPTIONS if serial else ())]))


# ------------------------------------------------------------------ running and printing

def refuse_unused(mode: str, *used: str) -> None:
    """MODE (a mode option, given) ignores every option but USED (parameter names): one given on the command
    line anyway is refused, naming it, before anything runs."""
    ctx = click.get_current_context()
    unused = [p for p in ctx.command.params if p.name not in (*used, "as_json") and isinstance(p, click.Option)
              and ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE]
    if unused:
        names = ", ".join(p.opts[0] for p in unused)
        raise UsageError(f"{names} {'has' if len(unused) == 1 else 'have'} no effect with {mode}",
                         hint=f"leave {'it' if len(unused) == 1 else 'them'} out")


def judged(ok: bool) -> None:
    """End a command that judged something: OK when it passed, JUDGED_FAIL when not."""
    sys.exit(OK if ok else JUDGED_FAIL)


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


class RigGroup(click.Group):
    r"""Every rig group: an unknown subcommand is answered in rig's voice, the close matches among the ones users
    see as its hint (`no command 'shwo' in \`rig stack\``, hint: did you mean \`rig stack show\`?)."""

    def shown(self, ctx: click.Context) -> list[str]:
        return [name for name in self.list_commands(ctx)
                if (command := self.get_command(ctx, name)) is not None and not command.hidden]

    def resolve_command(self, ctx, args):
        if args and not args[0].startswith("-") and not ctx.resilient_parsing and \
                self.get_command(ctx, args[0]) is None:
            near = difflib.get_close_matches(args[0], self.shown(ctx), n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(f'`{ctx.command_path} {n}`' for n in near)}?" if near else None
            where = f" in `{ctx.command_path}`" if ctx.parent is not None else ""
            raise UsageError(f"no command {args[0]!r}{where}", hint=hint, ctx=ctx)
        return super().resolve_command(ctx, args)


def group(name: str | None = None, **kwargs):
    """click.group with rig's voice for unknown subcommands (RigGroup)."""
    return click.group(name, cls=RigGroup, **kwargs)

