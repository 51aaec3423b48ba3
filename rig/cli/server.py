"""The `rig server` group: the SGLang server's command line."""
from __future__ import annotations

import os

import click

from rig.cli.common import emit, group, json_option, log_option, need_stack, stack_option, start_timeout_option, venv_option
from rig.cli.types import FILE, HostPath, Number
from rig.core import RigError
from rig.core.documents import dump_json, parse_json, read_text
from rig.patches.env import STATE as PATCH_RECORD
from rig.python.runtime_env import start_digest
from rig.serving import adaptive
from rig.serving.server import health_gate, render, shell_line
from rig.stack.spec import load, validate


@group()
def server() -> None:
    """The SGLang server: its command line from the stack."""


@server.command("args")
@stack_option(required=False, help="The stack (unless --stack-json is given).")
@click.option("--stack-json", metavar="JSON", help="The stack as JSON instead of a file (roles pass the validated "
              "stack).")
@venv_option(help="The venv whose sglang parses the flags.")
@click.option("--baseline", is_flag=True, help="Drop speculation, keep everything else (the benchmark's baseline).")
@click.option("--api-key/--no-api-key", default=None,
              help="Add --api-key ${NAME} (default: when server.api_key_env is set here).")
@click.option("--gate-engine", type=HostPath(),
              help="The engine bundle on the server's host: add the unit's health gate (JSON).")
@click.option("--gate-python", type=HostPath(program=True), default="/usr/bin/python3", show_default=True,
              help="The Python on the server's host that runs it (a path, or a name on its PATH).")
@log_option(type=HostPath(), default="/var/log/rig/sglang-server.log", show_default=True, metavar="PATH",
            help="The server's log, on its host.")
@start_timeout_option(type=Number(int, 61, 7 * 86400),
                      help="Seconds systemd waits for the health gate (default: the stack's server.start_timeout).")
@click.option("--adaptive-config-text", metavar="JSON",
              help="What server.speculative_adaptive_config will hold where the server runs (the sglang_server role "
                   "renders the line before it copies the file there): checked from a scratch copy, the line naming "
                   "the stack's path.")
@json_option
def server_args(stack_path, stack_json, venv_path, baseline, api_key, gate_engine, gate_python, log_path,
                start_timeout, adaptive_config_text, as_json) -> None:
    """Print the server command line the stack asks for, in the installed sglang's spelling.

    The flags are parsed by that sglang version's own argument parser; a flag it
    does not know is an error naming the flag and the version. When the variable
    named by server.api_key_env is set, --api-key refers to it as ${NAME}: its
    value is never printed.
    """
    if stack_json:
        try:
            stack = validate(parse_json(stack_json, "--stack-json"), "--stack-json")
        except RigError as exc:
            raise RigError(f"--stack-json is not JSON of a stack: {exc}") from exc
    else:
        stack = load(need_stack(stack_path))
    if api_key is None:
        api_key = bool(os.environ.get(stack["server"]["api_key_env"]))
    if adaptive_config_text is not None and not stack["server"]["speculative_adaptive_config"]:
        raise click.UsageError("--adaptive-config-text: the stack names no server.speculative_adaptive_config")
    result = render(stack, venv_path or stack["venv"], baseline, api_key, adaptive_config_text)
    if gate_engine:
        timeout = start_timeout or stack["server"]["start_timeout"]
        # a unit names what the venv's Python takes from rig at start: a new lock, environment or patch set
        # (the patch record) restarts it
        result.update(health_gate(stack, gate_engine, gate_python, log_path, timeout),
                      start_digest=start_digest(venv_path or stack["venv"], records=(PATCH_RECORD,)))
    click.echo(dump_json(result, "the server's command line", indent=2) if as_json
               else shell_line(result["argv"], result["api_key_env"]))


@server.command("adaptive")
@click.argument("path", type=FILE)
@click.option("--steps", type=Number(int, 1, 32),
              help="The line's --speculative-num-steps (server.speculative_num_steps): SGLang starts only at one of "
                   "the config's candidates.")
@json_option
def server_adaptive(path, steps, as_json) -> None:
    """Check an adaptive speculation config as the sglang_server role ships it (server.speculative_adaptive_config).

    It must be a regular file (a link is refused), UTF-8 JSON that SGLang's loader takes, by rig's reading of that
    loader (rig server args asks the venv's sglang too). --json gives its text, which the role copies to the host.
    """
    what = "adaptive speculation config"
    text = read_text(path, what, follow=False)
    slots = adaptive.parse(text, path)
    if steps is not None and (problem := adaptive.launch_problem(slots, steps)):
        raise RigError(f"sglang refuses to start the stack's line with {path}: {problem}")
    shown = "; ".join(f"{size}: {candidates}" for size, candidates in slots.items())
    emit({"path": path, "text": text, "slots": {str(size): candidates for size, candidates in slots.items()},
          "msg": f"{path}: an {what}, candidate steps by batch size {shown}"}, as_json)
