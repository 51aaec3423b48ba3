"""What every command group shares: defaults, exit statuses, options, parameter types and output."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from rig.core import defaults

DEFAULT_STACK = "stacks/default.yml"
DEFAULT_CACHE = defaults.cache_dir()
DEFAULT_BUNDLE = os.environ.get("RIG_BUNDLE", str(Path(DEFAULT_CACHE) / "engine" / "rig.pyz"))

# exit statuses, named once: every command and the error boundary in rig.cli use these
OK = 0
JUDGED_FAIL = 1  # the command ran and judged: a check failed (doctor, verify, audit, smoke, bench...)
ERROR = 2  # bad input, or a host problem to fix (the one `rig: error:` line)
PARTIAL = 3  # `rig lock` wrote a lock that could not be fully resolved
INTERNAL = 70  # a defect of rig's own (EX_SOFTWARE)
INTERRUPTED = 130  # Ctrl-C
SIGNALLED = 128  # plus the signal's number: SIGTERM or SIGHUP

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")


def venv_option(**settings):
    """--venv, declared once (the command's VENV_PATH); SETTINGS say what it is to that command."""
    return click.option("--venv", "venv_path", **{"help": "The stack's virtualenv.", **settings})


def stack_option(**settings):
    """--stack, declared once (STACK_PATH), the default stack unless SETTINGS say otherwise."""
    return click.option("--stack", "stack_path", **{"default": DEFAULT_STACK, "show_default": True, **settings})


def cache_option(**settings):
    """--cache, declared once: the controller's cache (wheels, CUDA wheels, tools, the engine bundle)."""
    return click.option("--cache", **{"default": DEFAULT_CACHE, "show_default": True,
                                      "help": "The controller's cache.", **settings})
check_option = click.option("--check", is_flag=True, help="Dry run: say what would change, change nothing.")
prefix_option = click.option("--prefix", default="/usr/local", show_default=True,
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
        from urllib.parse import urlsplit

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


class Seconds(click.ParamType):
    """A wait: finite, above 0 and at most a week (nan or inf would wait forever)."""
    name = "seconds"

    def convert(self, value, param, ctx):
        from rig.core import RigError, numbers

        try:
            seconds = numbers.parse(str(value), "seconds")
        except RigError:
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not 0 < seconds <= 7 * 86400:
            self.fail(f"{value!r}: give seconds above 0 and at most a week (604800)", param, ctx)
        return seconds


junit_option = click.option("--junit", type=click.Path(dir_okay=False),
                            help="Also write the checks as a JUnit XML file (CI systems list each one).")


def write_junit(path: str | None, checks: list, suite: str) -> None:
    """The checks (rig.core.check.Check) as JUnit XML at PATH, when one was given."""
    if path:
        from rig.core import check
        from rig.core.fs import atomic_write

        atomic_write(path, check.junit(checks, suite))


def to_file_or_stdout(text: str, out: str | None) -> None:
    if out:
        from rig.core.fs import atomic_write

        atomic_write(out, text)
    else:
        click.echo(text, nl=False)


def emit(result: dict, as_json: bool) -> None:
    """RESULT on stdout: as JSON, or its message with whatever input put in it (a log line's terminal
    escapes) made visible."""
    from rig.core.documents import dump_json
    from rig.core.escape import terminal

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


def plan_options(serial: bool = False):
    """The measurement plan's options, declared once for bench and tune: each left out means the stack's bench
    section, and each given is checked by the same schema field as that key (rig.serving.measure.plan)."""
    options = [
        click.option("--concurrency", help="Closed-loop levels, comma-separated, e.g. 1,4,16,64 (default: "
                                           "bench.concurrency)."),
        click.option("--max-tokens", type=int, help="Output tokens per request (default: bench.max_tokens)."),
        click.option("--rounds", type=int, help="Rounds per level, servers interleaved (default: bench.rounds)."),
        click.option("--min-requests", type=int, help="Each round sends at least max(this, 2C) requests "
                                                      "(default: bench.min_requests)."),
        click.option("--min-seconds", type=float, help="Each round lasts at least this long (default: "
                                                       "bench.min_seconds)."),
        click.option("--temperature", type=float, help="Sampling temperature of every request; 0 is greedy "
                                                       "(default: bench.temperature)."),
        click.option("--top-p", type=float, help="Sampling top_p of every request (default: bench.top_p)."),
        click.option("--seed", type=int, help="Poisson arrivals and the prompt file's order (default: bench.seed)."),
        click.option("--warmup", type=int, help="Requests sent before a server is measured (default: bench.warmup)."),
        click.option("--slo-ttft-ms", type=float, help="Goodput SLO on TTFT; 0: none (default: bench.slo_ttft_ms)."),
        click.option("--slo-tpot-ms", type=float, help="Goodput SLO on TPOT; 0: none (default: bench.slo_tpot_ms)."),
        click.option("--read-timeout", type=float, help="Seconds without a byte before a request fails (default: "
                                                        "bench.read_timeout)."),
        click.option("--request-timeout", type=float, help="Seconds a whole request may take (default: "
                                                           "bench.request_timeout)."),
    ]
    if serial:
        options += [click.option("--serial-runs", type=int, help="Serial runs (default: bench.serial_runs)."),
                    click.option("--serial-tokens", type=int, help="Tokens per serial run (default: "
                                                                   "bench.serial_tokens).")]

    def declare(command):
        for option in reversed(options):
            command = option(command)
        return command

    return declare
