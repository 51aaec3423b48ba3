"""`rig smoke`: prove a running server answers and speculates."""
from __future__ import annotations

import click

from rig.cli.common import (
    RenamedOption,
    api_key_env_option,
    emit,
    json_option,
    judged,
    log_option,
    plan_option,
    refuse_unused,
    start_timeout_option,
    url_option,
)
from rig.cli.types import Number
from rig.serving import smoke as smoking


@click.command()
@url_option()
@start_timeout_option(cls=RenamedOption, old="--timeout", removed_in="0.2.0", default=900, show_default=True,
                      help="Seconds to wait for the server to start: /health_generate answering 200 (a big model "
                           "loads in about 10 minutes).")
@plan_option("max_tokens", default=64, show_default=True, help="Tokens per test completion.")
@log_option(help="The server's log file: its tail is shown when the server fails.")
@click.option("--speculation/--no-speculation", default=None,
              help="Require (or not) speculative decoding; default: as /server_info says the server runs.")
@click.option("--health-only", is_flag=True, help="Only wait for /health_generate (a service's start gate).")
@click.option("--pid", type=Number(int, 1),
              help="The server's process (systemd: $MAINPID): stop waiting once it has exited.")
@plan_option("request_timeout", default=300, show_default=True, help="Seconds to wait for one test completion.")
@api_key_env_option
@json_option
def smoke(url, start_timeout, max_tokens, log_path, speculation, health_only, pid, request_timeout, api_key_env,
          as_json) -> None:
    """Wait for the server, send a few prompts, check the completions and the accept length.

    Each completion must be non-empty with completion_tokens matching its
    output_ids. When speculation is configured, the accept length comes from
    meta_info (spec_accept_length, or completion_tokens / spec_verify_ct), else
    from /server_info; no speculative request at all is a failure. Exit 1 on a
    failed check, 2 when the server does not come up or answer.
    """
    if health_only:
        refuse_unused("--health-only", "url", "start_timeout", "log_path", "pid", "api_key_env", "health_only")
        waited = smoking.wait_healthy(url, start_timeout, log_path, api_key_env, pid=pid)
        emit({"ok": True, "url": url, "health_wait_s": round(waited, 1), "msg": f"{url} healthy after {waited:.0f} s"},
             as_json)
        return
    result = smoking.run(url, start_timeout, max_tokens, log_path, speculation, api_key_env, pid, request_timeout)
    emit(result, as_json)
    judged(result["ok"])
