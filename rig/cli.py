"""The rig command line: every step is a subcommand; --json for machines,
--check for a dry run wherever something would change.

Heavy controller-only libraries (yaml, docker) are imported inside commands so
that the engine bundle runs on targets with python3 alone.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import click

from rig import RigError, __version__
from rig.fs import output_dir
from rig.installer import INSTALLERS
from rig.testmodel import DRAFTS as _TESTMODEL_DRAFTS

DEFAULT_STACK = "stacks/default.yml"
DEFAULT_CACHE = os.environ.get("RIG_CACHE", str(Path.home() / ".cache" / "rig"))
DEFAULT_BUNDLE = os.environ.get("RIG_BUNDLE", str(Path(DEFAULT_CACHE) / "engine" / "rig.pyz"))

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
check_option = click.option("--check", is_flag=True, help="Dry run: say what would change, change nothing.")
prefix_option = click.option("--prefix", default="/usr/local", show_default=True,
                             help="Where the cuda-X.Y trees live.")


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
        import math

        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or not 0 < seconds <= 7 * 86400:
            self.fail(f"{value!r}: give seconds above 0 and at most a week (604800)", param, ctx)
        return seconds


def to_file_or_stdout(text: str, out: str | None) -> None:
    if out:
        from rig.fs import atomic_write

        atomic_write(out, text)
    else:
        click.echo(text, nl=False)


def emit(result: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        click.echo(result.get("msg") or "\n".join(f"{k}: {v}" for k, v in result.items()))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rig")
@click.option("--debug", is_flag=True, help="On failure, print the traceback too (anywhere on the line; or RIG_DEBUG=1).")
def cli(debug: bool) -> None:
    """Provision, build and prove an SGLang + EAGLE-3 stack on CUDA 13.

    Versions come from a stack file (stacks/NAME.yml). Ansible roles and the
    Dockerfile call these same subcommands. Every failure is one `rig: error:`
    line and exit 2 (bad input, or a host problem to fix).
    """


# ------------------------------------------------------------------ stack

@cli.group()
def stack() -> None:
    """Read and validate stack files."""


@stack.command("show")
@click.argument("path", default=DEFAULT_STACK)
@json_option
def stack_show(path: str, as_json: bool) -> None:
    """Validate a stack file and print it with defaults filled in."""
    from rig.stack import load

    data = load(path)
    click.echo(json.dumps(data, indent=2) if as_json else _yaml_dump(data))


@stack.command("vars")
@click.argument("path", default=DEFAULT_STACK)
@click.option("--out", type=click.Path(dir_okay=False), help="Write to this file instead of stdout.")
def stack_vars(path: str, out: str | None) -> None:
    """Print the Ansible role variables a stack implies (JSON)."""
    from rig.stack import ansible_vars, load

    to_file_or_stdout(json.dumps(ansible_vars(load(path), path), indent=2) + "\n", out)


def _yaml_dump(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False).rstrip()


# ------------------------------------------------------------------ lock

@cli.command("lock")
@click.argument("stack_path", metavar="STACK", default=DEFAULT_STACK)
@click.option("--check", is_flag=True, help="Fail if STACK.lock is missing or stale; write nothing.")
@json_option
def lock_cmd(stack_path, check, as_json) -> None:
    """Resolve a stack into STACK.lock: every wheel with version, file and sha256.

    A stack whose hosts have other Pythons lists them under `pythons`; each gets a
    lock of its own, STACK.pyXY.lock, and hosts install the one of their python3.
    """
    from rig import lock as locking
    from rig.stack import load

    stack = load(stack_path)
    if check:
        done, problems = locking.stale(stack, stack_path)
        locking.refuse(problems)
        emit({"changed": False, "lock": str(locking.lock_path(stack_path)), "lock_hash": done[0]["lock_hash"],
              "locks": len(done), "msg": f"{len(done)} lock(s) of {stack_path} up to date"}, as_json)
        return
    summaries = []
    for python, variant, path in locking.variants(stack, stack_path):
        click.echo(f"rig: resolving {stack['name']} for Python {python}", err=True)
        result = locking.build_lock(variant, stack_path)
        old = path.read_text() if path.exists() else None
        locking.write(result, path)
        summary = {"changed": old != path.read_text(), "lock": str(path), "lock_hash": result["lock_hash"],
                   "python": python, "complete": result["complete"], "wheels": len(result["wheels"]),
                   "unresolved": [u["reason"] for u in result["unresolved"]]}
        summary["msg"] = (f"locked {len(result['wheels'])} wheels into {path}" if result["complete"] else
                          f"PARTIAL lock written to {path}: " + "; ".join(summary["unresolved"]))
        summaries.append(summary)
    first = summaries[0]
    emit({**first, "locks": summaries, "changed": any(x["changed"] for x in summaries),
          "complete": all(x["complete"] for x in summaries), "msg": "\n".join(x["msg"] for x in summaries)}, as_json)
    if not all(x["complete"] for x in summaries):
        sys.exit(3)


# ------------------------------------------------------------------ wheelhouse

@cli.group()
def wheelhouse() -> None:
    """The controller's hash-keyed cache of locked wheels."""


@wheelhouse.command("fetch")
@click.argument("lock_path", metavar="LOCK")
@click.option("--cache", default=DEFAULT_CACHE, show_default=True, help="Controller-side cache.")
@json_option
def wheelhouse_fetch(lock_path, cache, as_json) -> None:
    """Download every wheel of LOCK once, verifying each sha256; refetch altered ones."""
    from rig import lock as locking
    from rig.wheelhouse import fetch

    emit(fetch(locking.read(lock_path), cache), as_json)


@wheelhouse.command("export")
@click.argument("lock_path", metavar="LOCK")
@click.argument("dest")
@click.option("--cache", default=DEFAULT_CACHE, show_default=True, help="Controller-side cache.")
@json_option
def wheelhouse_export(lock_path, dest, cache, as_json) -> None:
    """Lay LOCK's wheels out in DEST with a hash-pinned requirements.txt."""
    from rig import lock as locking
    from rig.wheelhouse import export

    emit(export(locking.read(lock_path), cache, dest), as_json)


@wheelhouse.command("serve")
@click.argument("directory")
@click.option("--bind", default="0.0.0.0", show_default=True, help="The address to listen on.")
@click.option("--seed", default="0" * 8, help="Hex digits the port is derived from (a lock hash).")
@click.option("--idle-exit", type=Seconds(), default=600.0, show_default=True,
              help="Stop once nobody has asked anything for this long.")
@click.option("--stats", help="Write the bytes sent to this JSON file when it stops.")
@click.option("--foreground", is_flag=True, help="Serve in this process (prints the port) instead of detaching.")
@json_option
def wheelhouse_serve(directory, bind, seed, idle_exit, stats, foreground, as_json) -> None:
    """Serve an exported wheelhouse over HTTP for hosts to pull (pip checks every hash); detaches, and stops
    by itself once idle."""
    from rig import wheel_serving

    if not re.fullmatch(r"[0-9a-fA-F]{8,}", seed):
        raise click.BadParameter(f"{seed!r} is not hex digits", param_hint="--seed")
    if foreground:
        wheel_serving.serve(directory, bind, seed, idle_exit, stats)
        return
    emit(wheel_serving.detach(directory, bind, seed, idle_exit, stats), as_json)


@wheelhouse.command("route")
@click.argument("host")
@click.option("--port", type=click.IntRange(1, 65535), required=True, help="The port `rig wheelhouse serve` took.")
@click.option("--docker/--no-docker", default=False, help="HOST is a container on this machine's Docker engine.")
@json_option
def wheelhouse_route(host, port, docker, as_json) -> None:
    """The URL at which HOST reaches this machine's PORT (the address the kernel would answer it from)."""
    from rig.wheel_serving import route

    emit(route(host, port, docker), as_json)


# ------------------------------------------------------------------ venv

@cli.group()
def venv() -> None:
    """The stack's virtualenv on a target, installed offline from a wheelhouse."""


@venv.command("install")
@click.option("--venv", "venv_path", default="/opt/rig/venv", show_default=True)
@click.option("--lock", "lock_file", help="The stack's lock: with --find-links, pull everything from that URL, "
              "pip's wheel and requirements checked against the lock (hosts of a fleet).")
@click.option("--lock-hash", help="lock_hash of the lock being installed (without --lock).")
@click.option("--python-version", help="The lock's Python, checked against this host (without --lock).")
@click.option("--wheelhouse", "house", help="An exported wheelhouse dir (rig wheelhouse export).")
@click.option("--find-links", help="Take the wheels from this URL; the wheelhouse dir then needs only its "
              "requirements file and pip wheel (image builds), or none with --lock.")
@click.option("--installer", type=click.Choice(INSTALLERS), default="pip", show_default=True,
              help="uv (rig's pinned wheel, from the wheelhouse; about twice as fast) or pip (the lock's own).")
@check_option
@json_option
def venv_install(venv_path, lock_file, lock_hash, python_version, house, find_links, installer, check,
                 as_json) -> None:
    """Install a lock's wheels with --no-index --require-hashes; a no-op when current."""
    from rig import lock as locking
    from rig.venv import install

    lock = locking.read(lock_file) if lock_file else None
    if lock is not None:
        lock_hash, python_version = lock["lock_hash"], lock["python"]
    elif not (lock_hash and python_version):
        raise click.UsageError("give --lock, or --lock-hash and --python-version")
    emit(install(venv_path, lock_hash, python_version, house, check, find_links, lock, installer), as_json)


@venv.command("verify")
@click.option("--venv", "venv_path", default="/opt/rig/venv", show_default=True)
@json_option
def venv_verify(venv_path, as_json) -> None:
    """Check every locked package is installed at its locked version."""
    from rig.venv import verify

    result = verify(venv_path)
    emit({**result, "msg": f"{venv_path}: {result['packages']} packages as locked" if result["ok"]
          else f"{venv_path}: differs from its lock: {result['mismatched']}"}, as_json)
    sys.exit(0 if result["ok"] else 1)


# ------------------------------------------------------------------ env

@cli.group("env")
def env_group() -> None:
    """The CUDA 13 environment every process of the stack's venv starts with (a sitecustomize)."""


def _env_source(func):
    func = click.option("--env-json", help="The environment as `rig env show --json` prints it "
                        "(roles pass this; default: from --stack).")(func)
    func = click.option("--stack", "stack_path", default=DEFAULT_STACK, show_default=True,
                        help="Render the stack's environment section, CUDA version and archs.")(func)
    return prefix_option(func)


def _environment(stack_path: str, env_json: str | None, prefix: str) -> tuple[dict, str]:
    """(environment, stack name) from a stack file, or from the JSON a role passes."""
    if env_json:
        from rig.documents import parse_json
        from rig.schema import Field, distribution

        spec = Field(dict, fields={"pinned": Field(dict, required=True, values=Field()),
                                   "defaults": Field(dict, required=True, values=Field()),
                                   "stack": Field(required=True, check=distribution)})
        try:
            data = parse_json(env_json, "--env-json", spec)
        except RigError as exc:
            raise RigError(f"--env-json is not what `rig env show --json` prints: {exc}") from exc
        return {"pinned": data["pinned"], "defaults": data["defaults"]}, data["stack"]
    from rig.runtime_env import environment
    from rig.stack import load

    stack = load(stack_path)
    return environment(stack, prefix), stack["name"]


@env_group.command("show")
@_env_source
@json_option
def env_show(stack_path, env_json, prefix, as_json) -> None:
    """Print the sitecustomize module a stack renders (or its variables as JSON)."""
    from rig.runtime_env import render

    env, name = _environment(stack_path, env_json, prefix)
    click.echo(json.dumps({**env, "stack": name}, sort_keys=True) if as_json else render(env, name))


@env_group.command("install")
@click.option("--venv", "venv_path", required=True, help="The stack's venv (never the system Python).")
@_env_source
@check_option
@json_option
def env_install(venv_path, stack_path, env_json, prefix, check, as_json) -> None:
    """Write the environment module and the .pth that loads it into the venv; a no-op when current.

    Any sitecustomize already there keeps running, after rig's module.
    """
    from rig.runtime_env import install

    env, name = _environment(stack_path, env_json, prefix)
    emit(install(venv_path, env, name, check), as_json)


@env_group.command("remove")
@click.option("--venv", "venv_path", required=True)
@check_option
@json_option
def env_remove(venv_path, check, as_json) -> None:
    """Take rig's environment module out of the venv."""
    from rig.runtime_env import remove

    emit(remove(venv_path, check), as_json)


# ------------------------------------------------------------------ server

@cli.group()
def server() -> None:
    """The SGLang server: its command line from the stack."""


@server.command("args")
@click.option("--stack", "stack_path", default=DEFAULT_STACK, show_default=True)
@click.option("--stack-json", help="The stack as JSON instead of a file (roles pass the validated stack).")
@click.option("--venv", "venv_path", help="The venv whose sglang parses the flags (default: the stack's).")
@click.option("--baseline", is_flag=True, help="Drop speculation, keep everything else (the benchmark's baseline).")
@click.option("--api-key/--no-api-key", default=None,
              help="Add --api-key ${NAME} (default: when server.api_key_env is set here).")
@click.option("--gate-engine", help="The engine on the server's host: add the unit's health gate (JSON).")
@click.option("--gate-python", default="/usr/bin/python3", show_default=True, help="The Python that runs it.")
@click.option("--log", default="/var/log/rig/sglang-server.log", show_default=True, help="The server's log.")
@click.option("--start-timeout", type=click.IntRange(61, 7 * 86400 + 30), default=1200, show_default=True,
              help="Seconds systemd waits for the health gate.")
@json_option
def server_args(stack_path, stack_json, venv_path, baseline, api_key, gate_engine, gate_python, log, start_timeout,
                as_json) -> None:
    """Print the server command line the stack asks for, in the installed sglang's spelling.

    The flags are parsed by that sglang version's own argument parser; a flag it
    does not know is an error naming the flag and the version. When the variable
    named by server.api_key_env is set, --api-key refers to it as ${NAME}: its
    value is never printed.
    """
    from rig.server import health_gate, render, shell_line
    from rig.stack import load, validate

    if stack_json:
        from rig.documents import parse_json

        try:
            stack = validate(parse_json(stack_json, "--stack-json"), "--stack-json")
        except RigError as exc:
            raise RigError(f"--stack-json is not JSON of a stack: {exc}") from exc
    else:
        stack = load(stack_path)
    if api_key is None:
        api_key = bool(os.environ.get(stack["server"]["api_key_env"]))
    result = render(stack, venv_path or stack["venv"], baseline, api_key)
    if gate_engine:
        result.update(health_gate(stack, gate_engine, gate_python, log, start_timeout))
    click.echo(json.dumps(result, indent=2) if as_json else shell_line(result["argv"], result["api_key_env"]))


# ------------------------------------------------------------------ smoke, bench

api_key_env_option = click.option("--api-key-env", default="SGLANG_API_KEY", show_default=True,
                                  help="Environment variable holding the server's API key (sent, never printed).")


@cli.command()
@click.option("--url", type=Url(), default="http://127.0.0.1:30000", show_default=True, help="The SGLang server.")
@click.option("--timeout", type=Seconds(), default=900, show_default=True,
              help="Seconds to wait for /health_generate (a big model loads in about 10 minutes).")
@click.option("--max-tokens", type=int, default=64, show_default=True, help="Tokens per test completion.")
@click.option("--log", "log_path", help="The server's log file: its tail is shown when the server fails.")
@click.option("--speculation/--no-speculation", default=None,
              help="Require (or not) speculative decoding; default: as /server_info says the server runs.")
@click.option("--health-only", is_flag=True, help="Only wait for /health_generate (a service's start gate).")
@click.option("--pid", type=int, help="The server's process (systemd: $MAINPID): stop waiting once it has exited.")
@click.option("--request-timeout", type=Seconds(), default=300, show_default=True,
              help="Seconds to wait for one test completion.")
@api_key_env_option
@json_option
def smoke(url, timeout, max_tokens, log_path, speculation, health_only, pid, request_timeout, api_key_env,
          as_json) -> None:
    """Wait for the server, send a few prompts, check the completions and the accept length.

    Each completion must be non-empty with completion_tokens matching its
    output_ids. When speculation is configured, the accept length comes from
    meta_info (spec_accept_length, or completion_tokens / spec_verify_ct), else
    from /server_info; no speculative request at all is a failure. Exit 1 on a
    failed check, 2 when the server does not come up or answer.
    """
    from rig import smoke as smoking

    if health_only:
        waited = smoking.wait_healthy(url, timeout, log_path, api_key_env, pid=pid)
        emit({"ok": True, "url": url, "health_wait_s": round(waited, 1), "msg": f"{url} healthy after {waited:.0f} s"},
             as_json)
        return
    result = smoking.run(url, timeout, max_tokens, log_path, speculation, api_key_env, pid, request_timeout)
    emit(result, as_json)
    sys.exit(0 if result["ok"] else 1)


@cli.command()
@click.option("--url", type=Url(), required=True, help="The server under test (EAGLE-3).")
@click.option("--baseline-url", type=Url(), help="A server without speculation, measured with the same plan.")
@click.option("--baseline-results", type=click.Path(exists=True, dir_okay=False),
              help="results.json of an earlier run against the baseline (when both cannot run at once).")
@click.option("--stack", "stack_path", default=DEFAULT_STACK, show_default=True, help="Plan defaults: its bench section.")
@click.option("--concurrency", help="Comma-separated levels, e.g. 1,2,5,10 (default: the stack's).")
@click.option("--max-tokens", type=int, help="Output tokens per sweep request (default: the stack's).")
@click.option("--serial-runs", type=int, help="Serial runs (default: the stack's).")
@click.option("--serial-tokens", type=int, help="Tokens per serial run (default: the stack's).")
@click.option("--rounds", type=int, help="Rounds per level, the two servers interleaved (default: the stack's).")
@click.option("--min-requests", type=int, default=30, show_default=True, help="Requests per level: max(this, 2C).")
@click.option("--read-timeout", type=Seconds(), default=300, show_default=True,
              help="Seconds without a byte before a request counts as failed.")
@click.option("--out", "out_dir", default="bench-results", show_default=True,
              help="Where results.json, report.md and the plots go.")
@api_key_env_option
@json_option
def bench(url, baseline_url, baseline_results, stack_path, concurrency, max_tokens, serial_runs, serial_tokens,
          rounds, min_requests, read_timeout, out_dir, api_key_env, as_json) -> None:
    """Benchmark EAGLE-3 against a baseline: serial runs, then a concurrency sweep.

    Reports total and per-request tokens/s, TTFT, TPOT and latency at
    p50/p90/p99 and the accept length per level, and, with a baseline, the
    highest concurrency at which EAGLE-3 still wins. Each level runs in
    rounds with the two servers interleaved; a level is won or lost only when
    every round agrees, else it is "within noise". A plan that cannot fit the
    server's context length is refused before anything is measured. Refused
    and failed requests are recorded with their reason, not retried; when a
    server stops answering, what was measured is still written. Exit 1 when
    any request failed or a run stopped early.
    """
    from rig import serve_bench
    from rig.stack import load

    if baseline_url and baseline_results:
        raise RigError("give --baseline-url or --baseline-results, not both")
    output_dir(out_dir, "--out")
    wanted = load(stack_path)["bench"]
    try:
        levels = [int(c) for c in concurrency.split(",")] if concurrency is not None else wanted["concurrency"]
    except ValueError as exc:
        raise RigError(f"--concurrency {concurrency!r}: give comma-separated whole numbers, e.g. 1,2,5") from exc

    def given(value, key):  # an option given as 0 is a bad value, not "use the stack's"
        return wanted[key] if value is None else value

    plan = serve_bench.Plan(concurrency=levels, max_tokens=given(max_tokens, "max_tokens"),
                            serial_runs=given(serial_runs, "serial_runs"),
                            serial_tokens=given(serial_tokens, "serial_tokens"), rounds=given(rounds, "rounds"),
                            min_requests=min_requests, read_timeout=read_timeout)
    result = serve_bench.run(url, plan, baseline_url, baseline_results, api_key_env)
    files = serve_bench.write(result, out_dir)["files"]
    failed = sum(lv["failed"] for run in result["runs"] for lv in run["levels"]) + \
        sum(len(run["serial"]["tok_s"]) < run["serial"]["runs"] for run in result["runs"] if run["serial"])
    stopped = [f"{run['label']}: {run['stopped']}" for run in result["runs"] if run["stopped"]]
    cross = result["crossover"]
    msg = "\n".join([f"wrote {', '.join(files)}",
                     *(f"STOPPED {s}" for s in stopped),
                     *([f"{failed} request(s) failed; the report lists why"] if failed else []),
                     *([cross["recommendation"]] if cross else [])])
    emit({"ok": not (failed or stopped), "files": files, "crossover": cross, "failed": failed, "stopped": stopped,
          "msg": msg}, as_json)
    sys.exit(1 if failed or stopped else 0)


@cli.command()
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Where DIR/target and DIR/draft go (replaced only when their content changes).")
@click.option("--venv", "venv_path", default="/opt/rig/venv", show_default=True,
              help="The stack's venv: its torch, safetensors and tokenizers write the model.")
@click.option("--python", "python", help="Use this interpreter instead of the venv's.")
@click.option("--tp", type=int, default=1, show_default=True, help="GPUs the server will split it over (1, 2, 4, 8...).")
@click.option("--draft", type=click.Choice(_TESTMODEL_DRAFTS), default="agree", show_default=True,
              help="agree: the target accepts every proposal; random: it accepts none.")
@click.option("--context", type=int, default=8192, show_default=True, help="The model's context length in tokens.")
@check_option
@json_option
def testmodel(out_dir, venv_path, python, tp, draft, context, check, as_json) -> None:
    """Write a tiny Llama target and its EAGLE-3 draft, to prove a box's serving path.

    The target always generates the same token; the `agree` draft always
    proposes it, so the accept length is the most the server's settings allow
    (speculative steps + 1), and the `random` draft never does (1.0). Heads
    divide by 8, so TP 1, 2, 4 and 8 split it. Offline, in seconds, with the
    venv's own torch. Point the stack at it with `server.model: testmodel`.
    """
    from rig.testmodel import build

    emit(build(out_dir, python or Path(venv_path) / "bin" / "python", tp, draft, context, check=check), as_json)


@cli.command()
@click.option("--venv", "venv_path", default="/opt/rig/venv", show_default=True,
              help="The stack's venv: its torch and NCCL run the all-reduce.")
@click.option("--python", "python", help="Use this interpreter instead of the venv's.")
@click.option("--gpus", type=int, help="GPUs to all-reduce across (default: every GPU nvidia-smi lists).")
@click.option("--out", "out_dir", default="probe-results", show_default=True,
              help="Where probe.json, probe.md and probe.png go.")
@json_option
def probe(venv_path, python, gpus, out_dir, as_json) -> None:
    """Measure the GPUs' all-reduce (8 KB to 256 MB) and say what it means for the stack.

    One process per GPU through torch.distributed and NCCL in the stack's venv:
    latency of small messages, bus bandwidth (nccl-tests' busbw) of large ones,
    the link class they imply (NVLink or PCIe) and advice for the stack.
    """
    from rig import gpu_health
    from rig import probe as probing

    output_dir(out_dir, "--out")
    count = gpus or len(gpu_health.gpus(gpu_health.collect()))
    if not count:
        raise RigError("nvidia-smi lists no GPUs here: nothing to probe (install the driver, or give --gpus)")
    result = probing.analyse(probing.measure(Path(python or Path(venv_path) / "bin" / "python"), count))
    files = probing.write(result, out_dir)
    emit({**result, "files": files, "msg": f"{result['world_size']} GPU(s), {result['link_class']}: peak busbw "
          f"{result['peak_busbw_gbps']:.1f} GB/s, small-message latency {result['small_message_latency_us'] or 0:.1f} us"
          f"; wrote {', '.join(files)}\n" + "\n".join(f"advice: {a}" for a in result["advice"])}, as_json)
    sys.exit(0 if result["correct"] else 1)


@cli.group()
def machine() -> None:
    """Facts about the machine under the stack (roles read them before a driver exists)."""


@machine.command("facts")
@click.option("--pci-root", default="/sys/bus/pci/devices", show_default=True, help="sysfs PCI devices.")
@click.option("--module-version-path", default="/sys/module/nvidia/version", show_default=True,
              help="Where the loaded nvidia kernel module tells its version.")
@json_option
def machine_facts(pci_root, module_version_path, as_json) -> None:
    """NVIDIA GPUs and NVSwitches on the PCI bus, and the loaded driver module's version."""
    from rig import gpu_health

    emit({**gpu_health.pci_devices(pci_root), "module_version": gpu_health.module_version(module_version_path)},
         as_json)


# ------------------------------------------------------------------ sbom, image

@cli.command()
@click.option("--venv", "venv_path", required=True)
@click.option("--requirements", required=True, multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="The hash-pinned requirements the venv was installed from (the wheels' sha256); "
                   "repeat it for the wheels rig built.")
@click.option("--name", default="", help="What the SBOM describes (default: the venv's name).")
@click.option("--out", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
def sbom(venv_path, requirements, name, out) -> None:
    """A CycloneDX 1.5 SBOM of the venv: every distribution, with its locked wheel's sha256."""
    from rig.sbom import cyclonedx

    to_file_or_stdout(json.dumps(cyclonedx(venv_path, list(requirements), name), indent=1, sort_keys=True) + "\n", out)


@cli.group()
def image() -> None:
    """The stack's serving image, built from its lock (Docker)."""


@image.command("build")
@click.option("--stack", "stack_path", default=DEFAULT_STACK, show_default=True, help="Its lock must be complete.")
@click.option("--base", default=lambda: os.environ.get("RIG_BASE_IMAGE", ""),
              help="The base image: NVIDIA's CUDA 13 image by digest where a registry answers, else rig's "
                   "bootstrapped base (scripts/base-image.sh prints it; default $RIG_BASE_IMAGE).")
@click.option("--patches", "patch_dir", help="Build with this patch set instead of the repo's.")
@click.option("--ca-cert", "ca_certs", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="An extra CA certificate for the builder stage only (its apt and git); repeat.")
@click.option("--no-cache", is_flag=True, help="Rebuild every layer.")
@click.option("--cache", default=DEFAULT_CACHE, show_default=True,
              help="Controller cache (wheels, CUDA wheels, built wheels).")
@json_option
def image_build(stack_path, base, patch_dir, ca_certs, no_cache, cache, as_json) -> None:
    """Build the stack's image, tagged rig/NAME:LOCKHASH, with OCI labels and an SBOM inside.

    Stages: the CUDA toolkit from NVIDIA's wheels and its ldconfig file (a base
    that brings its own CUDA tree keeps it); the stack (the locked wheels, served
    from the controller's wheelhouse and hash-checked); a builder that compiles
    the lock's source builds missing from CACHE/built, whose audited wheels come
    back to that cache; and the runtime (the built wheels, the stack's
    environment, a CycloneDX SBOM, the patch set last). The server runs as the
    non-root user sglang; the HEALTHCHECK waits for /health_generate.
    """
    from rig.image import build

    if not base:
        raise RigError("no base image: give --base (e.g. the output of scripts/base-image.sh) or set RIG_BASE_IMAGE")
    emit(build(stack_path, cache, base, patch_dir, ca_certs, no_cache), as_json)


@image.command("verify")
@click.argument("tag")
@json_option
def image_verify(tag, as_json) -> None:
    """Run rig doctor and rig patch status inside the image; exit 1 on a failed check."""
    from rig.image import verify

    result = verify(tag)
    emit(result, as_json)
    sys.exit(0 if result["ok"] else 1)


# ------------------------------------------------------------------ cuda

@cli.group()
def cuda() -> None:
    """Install CUDA toolkits side by side and manage the /usr/local/cuda link."""


@cuda.command("fetch")
@click.option("--version", "version", required=True, help="Toolkit release, e.g. 13.0.2.")
@click.option("--component", "components", multiple=True, help="cuda-toolkit extra; repeat. Default: all rig needs.")
@click.option("--method", type=click.Choice(["wheels", "runfile"]), default="wheels", show_default=True)
@click.option("--url", type=Url(("https", "http", "file")), default="", help="Runfile URL (runfile method).")
@click.option("--sha256", default="", help="Expected runfile sha256 (runfile method).")
@click.option("--platform", default="x86_64", show_default=True, help="Target machine (uname -m).")
@click.option("--cache", default=DEFAULT_CACHE, show_default=True, help="Controller-side download cache.")
@json_option
def cuda_fetch(version, components, method, url, sha256, platform, cache, as_json) -> None:
    """Download a toolkit's artifacts once into the controller cache (verified)."""
    from rig import cuda as engine

    if method == "runfile":
        result = engine.fetch_runfile(url, sha256, cache)
    else:
        result = engine.fetch_wheels(version, list(components or engine.COMPONENTS), cache, platform)
    emit(result, as_json)


@cuda.command("install")
@click.option("--version", "version", required=True, help="Toolkit release, e.g. 13.0.2.")
@click.option("--method", type=click.Choice(["wheels", "runfile"]), default="wheels", show_default=True)
@click.option("--component", "components", multiple=True, help="cuda-toolkit extra; repeat. Default: all rig needs.")
@click.option("--source", help="The fetched wheel dir (wheels) or runfile (runfile).")
@click.option("--sha256", default="", help="Expected runfile sha256 (runfile method).")
@prefix_option
@check_option
@json_option
def cuda_install(version, method, components, source, sha256, prefix, check, as_json) -> None:
    """Install a toolkit into PREFIX/cuda-X.Y, staged and renamed into place."""
    from rig import cuda as engine

    if not check and not source:
        raise RigError("--source is required: the fetched wheel dir or runfile")
    emit(engine.install(version, prefix, method, list(components or engine.COMPONENTS),
                        source, sha256, check), as_json)


@cuda.command("default")
@click.option("--version", "version", required=True, help="Toolkit release or series, e.g. 13.0.")
@prefix_option
@click.option("--state-dir", default="/var/lib/rig", show_default=True, help="Where rollback state is kept.")
@check_option
@click.option("--installing", is_flag=True,
              help="With --check: this run installs the toolkit first, so it need not exist yet.")
@json_option
def cuda_default(version, prefix, state_dir, check, installing, as_json) -> None:
    """Point PREFIX/cuda at cuda-X.Y atomically, remembering the old target."""
    from rig import cuda as engine

    emit(engine.set_default(version, prefix, state_dir, check, installing), as_json)


@cuda.command("rollback")
@prefix_option
@click.option("--state-dir", default="/var/lib/rig", show_default=True, help="Where rollback state is kept.")
@check_option
@json_option
def cuda_rollback(prefix, state_dir, check, as_json) -> None:
    """Restore PREFIX/cuda to the target it had before `rig cuda default`."""
    from rig import cuda as engine

    emit(engine.rollback_default(prefix, state_dir, check), as_json)


@cuda.command("list")
@prefix_option
@json_option
def cuda_list(prefix, as_json) -> None:
    """List the toolkits under PREFIX and the version each nvcc reports."""
    from rig import cuda as engine

    found = engine.toolkits(prefix)
    if as_json:
        click.echo(json.dumps(found, indent=2))
    for t in [] if as_json else found:
        click.echo(f"{t['tree']}  nvcc {t['nvcc'] or '-'}  {'rig' if t['installed_by_rig'] else 'other'}")


# ------------------------------------------------------------------ ldconfig

@cli.command("ldconfig-conf")
@click.option("--version", "version", required=True, help="Toolkit release, e.g. 13.0.2.")
@prefix_option
@click.option("--conf-dir", default="/etc/ld.so.conf.d", show_default=True)
@click.option("--root", default="/", show_default=True,
              help="Where the tree is seen now (an image's staging dir); paths are written as seen from /.")
@click.option("--write-under", type=click.Path(file_okay=False),
              help="Write the file under this dir (ROOT/etc/ld.so.conf.d/...) instead of printing it.")
@json_option
def ldconfig_conf(version, prefix, conf_dir, root, write_under, as_json) -> None:
    """Print the ld.so.conf.d file (path, content) that covers a toolkit's libraries."""
    from rig.fs import atomic_write, confined
    from rig.ldconfig import conf_for

    result = conf_for(version, prefix, conf_dir, root)
    if write_under:
        atomic_write(confined(write_under, result["path"].lstrip("/"), "--write-under"), result["content"])
    if as_json:
        emit(result, True)
    else:
        click.echo(f"# {result['path']}\n{result['content']}", nl=False)


# ------------------------------------------------------------------ doctor

@cli.command()
@click.option("--stack", "stack_path", help="Take the CUDA version and archs from this stack file.")
@click.option("--cuda", "cuda_version", help="CUDA release to expect (default: the stack's).")
@click.option("--arch", "archs", multiple=True, help="Target arch, e.g. 12.0a; repeat (default: the stack's).")
@click.option("--venv", "venv_path", help="Check this stack venv against its lock (default: the stack's, "
              "when it pins packages).")
@prefix_option
@click.option("--container", help="Run the checks inside this running container instead of here.")
@click.option("--expect-gpus", type=click.IntRange(1), help="GPUs this box must have (default, where a driver is: "
              "the stack's server.tp).")
@click.option("--log", "log_path", type=click.Path(dir_okay=False),
              help="Instead: read a server or build log and name each known failure, its cause and fix.")
@json_option
def doctor(stack_path, cuda_version, archs, venv_path, prefix, container, expect_gpus, log_path, as_json) -> None:
    """Check the machine, driver, GPUs, toolkits, ldconfig, an NVRTC compile and the venv, layer by layer.

    The machine layer: the loaded kernel module against the userspace driver
    (reboot required?), persistence, the fabric manager where NVSwitch is, the
    GPU count, one compute capability, PCIe links at their maximum, ECC errors
    and row remaps, the container runtime and the GPUs' topology. Each failed
    check names its fix. With --log, the log's known failures instead (rules in
    rig/log_rules.yml); exit 1 when one is found.
    """
    from rig import doctor as checks

    if log_path:
        from rig.log_doctor import diagnose

        found = diagnose(log_path)
        emit(found, as_json)
        sys.exit(1 if found["findings"] else 0)

    default_gpus = pcie_only = None
    if not cuda_version or not archs or stack_path:
        from rig.stack import load, pins_packages

        data = load(stack_path or DEFAULT_STACK)
        cuda_version = cuda_version or data["cuda"]["version"]
        archs = archs or data["archs"]
        venv_path = venv_path or (data["venv"] if pins_packages(data) else None)
        default_gpus, pcie_only = data["server"]["tp"], data["environment"]["nccl_pcie_only"]
    if container:
        from rig.container import run_engine

        args = ["doctor", "--json", "--cuda", cuda_version, "--prefix", prefix]
        args += [f"--arch={a}" for a in archs] + (["--venv", venv_path] if venv_path else [])
        args += ["--expect-gpus", str(expect_gpus)] if expect_gpus else []
        code, out, err = run_engine(container, args, DEFAULT_BUNDLE)
        try:
            report = json.loads(out)
        except ValueError as exc:
            raise RigError(f"doctor in {container} printed no report ({code}): {out}{err}") from exc
        result = [checks.Check(**c) for c in report["checks"]]
    else:
        result = checks.run(cuda_version, list(archs), prefix, venv_path, expect_gpus, default_gpus, pcie_only)
    click.echo(json.dumps(checks.as_json(result), indent=2) if as_json else checks.render(result))
    sys.exit(1 if checks.failed(result) else 0)


# ------------------------------------------------------------------ patch

@cli.group()
def patch() -> None:
    """SM120 / EAGLE-3 source patches on an installed environment.

    Each patch in patches/ knows the package versions that need it and those whose
    upstream has it; status says applied, needed, upstream, not-applicable or
    drifted (the code it anchors on has changed). apply keeps the originals in the
    environment, and revert restores them byte for byte.
    """


def _patch_target(func):
    func = click.option("--patches", "patch_dir", help="Directory of patch files (default: rig's patches/).")(func)
    func = click.option("--stack", "stack_path",
                        help="Use this stack's venv when neither --venv nor --python is given.")(func)
    func = click.option("--python", "python", help="The environment's Python interpreter.")(func)
    func = click.option("--venv", "venv_path", help="The environment: a virtualenv directory.")(func)
    return json_option(func)


def _patch_env(venv_path, python, stack_path, patch_dir):
    from rig import patches

    if venv_path and python:
        raise RigError("give --venv or --python, not both")
    if not (venv_path or python):
        if not stack_path:
            raise RigError("name the environment: --venv DIR, --python PATH or --stack FILE (its venv)")
        from rig.stack import load

        venv_path = load(stack_path)["venv"]
    if venv_path:
        python = str(Path(venv_path) / "bin" / "python")
        if not Path(python).exists():
            raise RigError(f"{venv_path} is not a virtualenv (no bin/python); install the stack first")
    found = patches.load(patch_dir)
    return patches.probe(python, [p.package for p in found]), found


@patch.command("status")
@_patch_target
def patch_status(venv_path, python, stack_path, patch_dir, as_json) -> None:
    """Say, for every patch, whether this environment needs it."""
    from rig import patches

    env, found = _patch_env(venv_path, python, stack_path, patch_dir)
    rows = patches.status(env, found)
    emit({"changed": False, "patches": rows, "msg": patches.table(rows)}, as_json)


@patch.command("apply")
@_patch_target
@check_option
@click.option("--force", is_flag=True, help="Act on package versions no patch knows, skipping drifted patches.")
def patch_apply(venv_path, python, stack_path, patch_dir, as_json, check, force) -> None:
    """Apply every needed patch; a no-op when all are applied or upstream."""
    from rig import patches

    env, found = _patch_env(venv_path, python, stack_path, patch_dir)
    result = patches.apply(env, found, check=check, force=force)
    if check and not as_json and result["diff"]:
        click.echo(result["diff"], nl=False)
    emit(result, as_json)


@patch.command("revert")
@_patch_target
@check_option
@click.option("--force", is_flag=True, help="Restore the originals even over files changed since.")
def patch_revert(venv_path, python, stack_path, patch_dir, as_json, check, force) -> None:
    """Put back every file rig patched in this environment, byte for byte."""
    from rig import patches

    env, _ = _patch_env(venv_path, python, stack_path, patch_dir)
    emit(patches.revert(env, check=check, force=force), as_json)


# ------------------------------------------------------------------ audit

@cli.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--stack", "stack_path", default=DEFAULT_STACK, show_default=True,
              help="The CUDA major and target archs to hold the files to.")
@click.option("--venv", "venv_path", help="Take torch from this venv, and audit PATHS that are its installed "
              "distributions (e.g. sglang-kernel).")
@click.option("--torch", "torch_path", help="Take torch from this torch wheel or torch/lib directory instead.")
@click.option("--cache", default=DEFAULT_CACHE, show_default=True, help="Where cuobjdump is kept.")
@json_option
def audit(paths, stack_path, venv_path, torch_path, cache, as_json) -> None:
    """Audit wheels, installed packages or shared objects before anything loads them.

    For every shared object: the CUDA sonames it needs against the stack's CUDA
    major (and whether this host resolves them), the torch symbols it expects
    against those the given torch exports (demangled when missing), the torch its
    metadata pins, its cubin and PTX archs against the stack's archs (a target
    with neither is "no kernel image" before it happens), and the C++ string ABI.
    With --venv, every needed soname must also resolve where it will load (the
    venv's torch and NVIDIA libraries, RUNPATH, this host's loader cache).
    Exit 1 when any artifact fails.
    """
    from rig import audit as audits
    from rig.stack import load
    from rig.tools import fetch_tool

    stack = load(stack_path)
    torch, installed = None, None
    extra_dirs: list[Path] = []
    if venv_path:
        torch, extra_dirs, installed = audits.venv_context(Path(venv_path), list(paths))
    if torch_path:
        path = Path(torch_path)
        torch = audits.torch_from_wheel(path) if path.suffix == ".whl" else audits.torch_from_dir(path, "unknown")
    common = {"cuda_major": int(stack["cuda"]["version"].split(".")[0]), "archs": stack["archs"], "torch": torch,
              "extra_dirs": extra_dirs, "cuobjdump": fetch_tool("cuobjdump", cache), "resolve": bool(venv_path)}
    reports = [audits.audit_path(p, installed or {}, common) for p in paths]
    click.echo(json.dumps(reports, indent=2) if as_json else audits.render(reports))
    sys.exit(0 if all(r["ok"] for r in reports) else 1)


@cli.command("validate")
@click.argument("stack_path", metavar="STACK", default=DEFAULT_STACK)
@click.option("--junit", type=click.Path(dir_okay=False), help="Also write the checks as a JUnit XML file.")
@click.option("--venv", "venv_path", help="A venv of the stack (its image's): its sglang parses the server line.")
@click.option("--cache", default=DEFAULT_CACHE, show_default=True, help="The wheelhouse (missing wheels are fetched).")
@click.option("--patches", "patch_dir", help="Directory of patch files (default: rig's patches/).")
@json_option
def validate_cmd(stack_path, junit, venv_path, cache, patch_dir, as_json) -> None:
    """Gate a stack in CI, with no GPU: every check, every problem, in one run.

    The schema; the locks current and complete; every pin conflict; the locked
    kernel wheels audited against the locked torch, the CUDA major and the archs;
    the patch plan read from the locked sglang and flashinfer wheels; the server
    command line (with --venv); the environment module. Exit 1 when a check fails,
    2 on bad input.
    """
    from rig.fs import atomic_write
    from rig.validate import junit as to_junit
    from rig.validate import run

    result = run(stack_path, cache, venv_path, patch_dir)
    if junit:
        atomic_write(junit, to_junit(result))
    emit(result, as_json)
    sys.exit(0 if result["ok"] else 1)


# ------------------------------------------------------------------ wheels

@cli.group()
def wheels() -> None:
    """Build kernel wheels against the venv's own torch."""


@wheels.command("build")
@click.argument("source", required=False)
@click.option("--from-stack", "from_stack", metavar="KEY",
              help="Build from the stack's own source entry (git+ref or path, subdirectory): kernel, "
                   "flashinfer, sglang, or the package name of one of its extensions.")
@click.option("--venv", "venv_path", required=True, help="The venv whose torch the build links against.")
@click.option("--stack", "stack_path", default=DEFAULT_STACK, show_default=True,
              help="Target archs and CUDA major; its lock's hash keys the built wheel.")
@click.option("--cuda-home", help="The CUDA toolkit with nvcc (default: PREFIX/cuda-X.Y of the stack's CUDA).")
@prefix_option
@click.option("--jobs", type=int, help="Parallel compile jobs (default: cores, capped by memory at 4 GiB a job).")
@click.option("--cache", default=DEFAULT_CACHE, show_default=True, help="Controller cache; wheels go to built/KEY/.")
@click.option("--lock-hash", help="The stack lock's hash (default: read from the stack's lock file).")
@click.option("--cuobjdump", help="cuobjdump to read the wheel's archs with (default: cached, on PATH, or fetched).")
@json_option
def wheels_build(source, from_stack, venv_path, stack_path, cuda_home, prefix, jobs, cache, lock_hash, cuobjdump,
                 as_json) -> None:
    """Build SOURCE (a source dir, an sdist, or git+URL@REF) into an audited wheel.

    No build isolation: the build sees the venv's torch. The stack's archs reach
    every build system (TORCH_CUDA_ARCH_LIST, FLASHINFER_CUDA_ARCH_LIST, CUDAARCHS),
    MAX_JOBS is sized from cores and memory, and ccache is used when on PATH. The
    wheel is kept under CACHE/built/KEY (KEY: the stack lock's hash and the archs)
    only if `rig audit` passes it against that venv.
    """
    from rig import wheels as builds
    from rig.stack import load
    from rig.tools import fetch_tool

    stack = load(stack_path)
    if bool(source) == bool(from_stack):
        raise RigError("give SOURCE or --from-stack PACKAGE (one of them)")
    source = source or builds.stack_source(stack, from_stack, stack_path)
    version = stack["cuda"]["version"]
    lock_hash = lock_hash or _lock_hash(stack_path)
    home = Path(cuda_home) if cuda_home else Path(prefix) / f"cuda-{'.'.join(version.split('.')[:2])}"
    emit(builds.build(source, Path(venv_path), stack["archs"], int(version.split(".")[0]), home, Path(cache),
                      lock_hash, Path(cuobjdump) if cuobjdump else fetch_tool("cuobjdump", cache), jobs), as_json)


def _lock_hash(stack_path: str) -> str:
    from rig.lock import lock_path, read

    lock = lock_path(stack_path)
    return read(lock)["lock_hash"] if lock.exists() else "unlocked"


@wheels.command("plan")
@click.argument("source")
@click.option("--stack", "stack_path", default=DEFAULT_STACK, show_default=True)
@click.option("--cache", default=DEFAULT_CACHE, show_default=True)
@json_option
def wheels_plan(source, stack_path, cache, as_json) -> None:
    """Say whether the controller's wheelhouse already holds SOURCE built for the stack."""
    from rig.stack import load
    from rig.wheels import plan

    emit(plan(source, load(stack_path)["archs"], Path(cache), _lock_hash(stack_path)), as_json)


@wheels.command("export")
@click.argument("key")
@click.argument("dest")
@click.option("--cache", default=DEFAULT_CACHE, show_default=True)
@json_option
def wheels_export(key, dest, cache, as_json) -> None:
    """Lay the wheels kept under CACHE/built/KEY out in DEST with a hash-pinned requirements file."""
    from rig.wheels import export

    emit(export([Path(cache) / "built" / key], Path(dest)), as_json)


@venv.command("add")
@click.option("--venv", "venv_path", default="/opt/rig/venv", show_default=True)
@click.option("--requirements-sha256", required=True, help="sha256 of the export's list (rig wheels export prints it).")
@click.option("--wheelhouse", help="The exported dir holding the wheels (needed only when something changes).")
@click.option("--find-links", help="Take the wheels from this URL; the wheelhouse dir then needs only its "
                                   "requirements file (image builds).")
@check_option
@json_option
def venv_add(venv_path, requirements_sha256, wheelhouse, find_links, check, as_json) -> None:
    """Install rig-built wheels into a stack venv, hash-checked; a no-op when already there."""
    from rig.venv import add

    emit(add(venv_path, wheelhouse, requirements_sha256, check, find_links), as_json)

@cli.command("tool")
@click.argument("name", type=click.Choice(["cuobjdump"]))
@click.option("--cache", default=DEFAULT_CACHE, show_default=True)
def tool(name, cache) -> None:
    """Print the path of an NVIDIA tool rig uses, fetching it from its wheel into the cache if needed."""
    from rig.tools import fetch_tool

    click.echo(fetch_tool(name, cache))

# ------------------------------------------------------------------ bundle

@cli.command()
@click.option("--out", default=DEFAULT_BUNDLE, show_default=True, help="Where to write rig.pyz.")
@json_option
def bundle(out, as_json) -> None:
    """Build the engine zipapp that roles run on targets (needs only python3 there)."""
    from rig.bundle import build

    emit(build(out), as_json)


class Terminated(BaseException):
    """SIGTERM/SIGHUP as an exception, so `finally` blocks remove scratch and subprocess.run kills its child."""


def _terminate(signum, frame) -> None:
    raise Terminated(signum)


def _explain(exc: BaseException) -> str | None:
    """One line for an error that input or the host caused; None for a defect of rig's own."""
    import tarfile
    import zipfile

    if isinstance(exc, RigError):
        return str(exc)
    if isinstance(exc, UnicodeError):
        return f"an input is not UTF-8 text: {exc}"
    if isinstance(exc, OSError):
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        return f"{where or 'system'}: {exc.strerror or exc}"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc}"
    if isinstance(exc, (zipfile.BadZipFile, tarfile.TarError)):
        return f"not a readable archive: {exc}"
    if type(exc).__module__.split(".")[0] in ("yaml", "elftools", "requests", "urllib3", "http", "aiohttp"):
        return f"{type(exc).__name__}: {exc}"
    return None


def main(argv: list[str] | None = None) -> None:
    """The one error boundary: every failure is one `rig: error:` line and exit 2 (bad input or host),
    70 for a defect of rig's own; --debug (or RIG_DEBUG=1) adds the traceback."""
    import signal
    import traceback

    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv or os.environ.get("RIG_DEBUG") == "1"
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminate)
    try:
        cli(args=[a for a in argv if a != "--debug"], prog_name="rig", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("rig: interrupted", err=True)
        sys.exit(130)
    except Terminated as exc:
        click.echo("rig: terminated", err=True)
        sys.exit(128 + exc.args[0])
    except click.exceptions.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        click.echo(f"rig: error: {exc.format_message()}{hint}", err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - this is the boundary
        if debug:
            traceback.print_exc()
        line = _explain(exc)
        if line is None:
            click.echo(f"rig: error: internal error: {type(exc).__name__}: {exc} "
                       "(a defect of rig's: rerun with --debug and report the traceback)", err=True)
            sys.exit(70)
        click.echo(f"rig: error: {line}", err=True)
        sys.exit(2)
