"""The SGLang server's command line, rendered from the stack for the installed sglang.

The stack says what it wants (a CUDA-graph batch, fusion, a draft model); rig
picks the spelling the venv's sglang knows, then parses the argv with that
version's own parser (`ServerArgs.add_cli_args` on an argparse parser, as
`prepare_server_args` builds it; constructing ServerArgs runs device checks and
needs a GPU). The API key is passed as a ${NAME} reference that the shell or
systemd expands, so its value is never in the argv rig prints or logs.
"""
from __future__ import annotations

import atexit
import shlex
from pathlib import Path

from rig.core import RigError, progress
from rig.core.dialogue import Dialogue
from rig.core.documents import read_text
from rig.core.escape import unit_exec, unit_path, unit_text
from rig.core.proc import script, venv_python
from rig.core.schema import Field
from rig.serving import adaptive
from rig.serving.launch import config_checked
from rig.stack.derive import with_server

# What the stack asks for -> the spellings sglang releases use, preferred first.
SPELLINGS = {
    "tp": ("--tp-size", "--tp"),
    # 0.5.9 has --cuda-graph-max-bs; 0.5.23 splits it and rejects the old name as ambiguous
    "cuda_graph_max_bs": ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"),
}


_TEXT = Field((str, type(None)), multiline=True)  # a note or an error: sglang's own words, as they come
_SAID = {"version": Field(str, required=True), "error": _TEXT, "note": _TEXT}
# the shape of each kind of answer: anything else (`{}`, a banner, another script's JSON) is a wrong answer
ANSWERS = {"options": Field(dict, fields={**_SAID, "options": Field(list, required=True, item=Field(str))}),
           "parse": Field(dict, fields=_SAID), "adaptive": Field(dict, fields=_SAID)}
# seconds for one answer; the first includes importing sglang and torch (12.5 CPU-seconds for 0.5.23)
PARSER_DEADLINE = 300.0


class _Parser(Dialogue):
    """The venv's sglang argument parser, in a child process of the venv's Python."""

    def __init__(self, python: Path):
        self.python = python
        super().__init__([str(python), "-c", script("sglang_bare", "sglang_parser")], "sglang's argument parser",
                         str(python), f"see whether `{python} -c 'import sglang.srt.server_args'` finishes, or "
                         "install the venv again (rig venv install)",
                         PARSER_DEADLINE)

    def ask(self, request: dict, spec: Field | None = None) -> dict:
        return super().ask(request, spec or ANSWERS[request["mode"]])


# Each venv's parser, started at a process's first render there and kept until it exits: sglang, torch with it,
# loads once (12.5 CPU-seconds for 0.5.23, docs/BENCHMARKS.md) however many lines tune and prove render. One
# that ended (it died, or refused to load) is started afresh at the next render.
_PARSERS: dict[Path, _Parser] = {}


def _parser(python: Path) -> _Parser:
    parser = _PARSERS.get(python)
    if parser is not None and parser.proc.poll() is not None:
        del _PARSERS[python]
        parser.close()
        parser = None
    if parser is None:
        parser = _PARSERS[python] = _Parser(python)
    return parser


@atexit.register
def close_parsers() -> None:
    """Stop every parser this process started (at its exit; a long-lived caller may free them sooner)."""
    while _PARSERS:
        _PARSERS.popitem()[1].close()


TESTMODEL = "testmodel"


def models(server: dict) -> tuple[str, str]:
    """(target, draft) paths; `testmodel` names the generated pair under server.testmodel_dir."""
    if not server["model"]:
        raise RigError("the stack has no server.model: set it to the model's local path or id, "
                       "or to 'testmodel' to prove the box with a generated one (rig testmodel)")
    if server["draft_model"] == TESTMODEL and server["model"] != TESTMODEL:
        raise RigError("server.draft_model 'testmodel' drafts for the generated target only: "
                       "set server.model to 'testmodel' too, or give the draft's path")
    if server["model"] != TESTMODEL:
        return server["model"], server["draft_model"]
    root = server["testmodel_dir"]
    return f"{root}/target", f"{root}/draft" if server["draft_model"] in (TESTMODEL, "") else server["draft_model"]


def wants(stack: dict, baseline: bool) -> list[tuple[str, str | None]]:
    """(what, value) pairs in argv order; a None value is a bare switch."""
    server = stack["server"]
    target, draft = models(server)
    pairs: list[tuple[str, str | None]] = [("--model-path", target)]
    if not baseline:
        if not draft:
            raise RigError("the stack has no server.draft_model for EAGLE-3: set it, or use --baseline")
        pairs += [("--speculative-algorithm", "EAGLE3"),
                  ("--speculative-draft-model-path", draft),
                  ("--speculative-num-steps", str(server["speculative_num_steps"])),
                  ("--speculative-eagle-topk", str(server["speculative_eagle_topk"])),
                  ("--speculative-num-draft-tokens", str(server["speculative_num_draft_tokens"]))]
    if not baseline and server["speculative_adaptive_config"]:
        if reason := adaptive.unsupported_reason(server):
            raise RigError(f"SGLang refuses adaptive speculation (server.speculative_adaptive_config) here: {reason}; "
                           "set server.speculative_eagle_topk to 1 and drop that flag, or serve fixed speculation")
        pairs += [("--speculative-adaptive", None),
                  ("--speculative-adaptive-config", server["speculative_adaptive_config"])]
    pairs.append(("tp", str(server["tp"])))
    if server["cuda_graph_max_bs"]:
        pairs.append(("cuda_graph_max_bs", str(server["cuda_graph_max_bs"])))
    if server["max_running_requests"]:
        pairs.append(("--max-running-requests", str(server["max_running_requests"])))
    if server["attention_backends"]:
        pairs.append(("--attention-backend", server["attention_backends"][0]))
    if server["mem_fraction_static"]:
        pairs.append(("--mem-fraction-static", str(server["mem_fraction_static"])))
    if server["flashinfer_allreduce_fusion"]:
        pairs.append(("--enable-flashinfer-allreduce-fusion", None))
    if server["torch_symm_mem"]:
        pairs.append(("--enable-torch-symm-mem", None))
    pairs += [("--host", server["host"]), ("--port", str(server["port"]))]
    return pairs


def render(stack: dict, venv: str | Path, baseline: bool = False, api_key: bool = False,
           config_text: str | None = None) -> dict:
    """The argv for `python -m sglang.launch_server`, spelled and checked for the venv's sglang. CONFIG_TEXT: what
    the adaptive config the line names (server.speculative_adaptive_config) will hold where the server runs,
    checked from a scratch copy, so that a role renders the line before it puts the file there."""
    pairs = wants(stack, baseline)  # the stack's own mistakes first, before sglang loads
    python = venv_python(venv)  # the one check that VENV is one, and the one hint to make it
    config = stack["server"]["speculative_adaptive_config"]
    if config_text is None or baseline or not config:
        return _render(stack, pairs, _parser(python), python, baseline, api_key)
    with config_checked(config_text, Path(config)) as (copy, as_run):
        checked = with_server(stack, speculative_adaptive_config=str(copy))
        try:
            line = _render(checked, wants(checked, baseline), _parser(python), python, baseline, api_key)
        except RigError as exc:  # said of the file the line names, not of the scratch copy
            raise RigError(str(exc).replace(str(copy), config)) from exc
    argv = as_run({"server": line["argv"]})["server"]
    return {**line, "argv": argv, "exec_start": _exec_start(argv, line["api_key_env"])}


def _exec_start(argv: list[str], api_key_env: str | None) -> str:
    """ARGV as the unit's ExecStart, the key's ${NAME} left for systemd to expand."""
    return unit_exec(argv, "the server's command line", {"${%s}" % api_key_env} if api_key_env else set())


def _render(stack: dict, pairs: list, parser: _Parser, python: Path, baseline: bool, api_key: bool) -> dict:
    known = parser.ask({"mode": "options"})
    # the version goes into the unit's comment: one line, whatever the venv's sglang says
    version = unit_text(str(known["version"]), f"the version {python}'s sglang reports")
    options = set(known["options"])
    argv = []
    for what, value in pairs:
        spellings = SPELLINGS.get(what, (what,))
        flag = next((s for s in spellings if s in options), None)
        if flag is None:
            raise RigError(f"sglang {version} has no {' or '.join(spellings)} (asked for by the stack's server "
                           f"section); change the stack or its sglang version")
        argv += [flag] + ([] if value is None else [value])
    key_env = stack["server"]["api_key_env"]
    if api_key:
        argv += ["--api-key", "${%s}" % key_env]
    argv += stack["server"]["extra_args"]
    parsed_argv = [("redacted" if t == "${%s}" % key_env else t) for t in argv]
    parsed = parser.ask({"mode": "parse", "argv": parsed_argv})
    if "error" in parsed:
        raise RigError(f"sglang {version} rejects the server command line: {parsed['error']}")
    config = stack["server"]["speculative_adaptive_config"]
    if config and not baseline:
        _adaptive_loads(stack, config, parser, version, parsed_argv)
    # argparse takes unique prefixes; a release that adds a flag can make one ambiguous (as 0.5.23 did)
    for flag in (t.split("=", 1)[0] for t in argv if t.startswith("--")):
        if flag not in options:
            raise RigError(f"sglang {version} takes {flag} only as an abbreviation of a longer flag; "
                           "spell the flag out in server.extra_args")
    full = [str(python), "-m", "sglang.launch_server", *argv]
    return {"sglang": version, "baseline": baseline, "python": str(python), "argv": full,
            "exec_start": _exec_start(full, key_env if api_key else None), "api_key_env": key_env if api_key else None}


def _adaptive_loads(stack: dict, config: str, parser: _Parser, version: str, parsed_argv: list[str]) -> None:
    """The adaptive speculation CONFIG as the line would start with it: rig's own reading first (a regular file, its
    shape, the launch's steps among its candidates), then sglang's loader."""
    slots = adaptive.parse(read_text(config, "adaptive speculation config"), config)
    if problem := adaptive.launch_problem(slots, stack["server"]["speculative_num_steps"]):
        raise RigError(f"sglang refuses to start this line with {config}: {problem}")
    loaded = parser.ask({"mode": "adaptive", "path": config, "argv": parsed_argv})
    if "error" in loaded:
        raise RigError(f"sglang {version} refuses the adaptive speculation config {config}: {loaded['error']}")
    if "note" in loaded:
        progress(f"sglang {version}: {loaded['note']}")


def health_url(stack: dict) -> str:
    """Where the server answers on its own host: a wildcard bind is reached on loopback."""
    host = stack["server"]["host"]
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else f"[{host}]" if ":" in host else host
    return f"http://{host}:{stack['server']['port']}"


def health_gate(stack: dict, engine: str, python: str, log: str, start_timeout: int) -> dict:
    """The unit's start gate and log, serialized like ExecStart: systemd calls the service started only
    once `rig smoke --health-only` has seen /health_generate answer (or the server exit)."""
    unit_path(engine, "--gate-engine")
    standard_output = "append:" + unit_path(log, "--log")
    if start_timeout <= 60:
        raise RigError(f"--start-timeout {start_timeout}: give more than 60 s (the gate waits 30 s less)")
    argv = [python, engine, "smoke", "--health-only", "--url", health_url(stack), "--pid", "$MAINPID",
            "--start-timeout", str(start_timeout - 30), "--log", log, "--api-key-env", stack["server"]["api_key_env"]]
    return {"exec_start_post": unit_exec(argv, "--gate-python", {"$MAINPID"}), "standard_output": standard_output,
            "timeout_start_sec": start_timeout, "health_url": health_url(stack)}


def shell_line(argv: list[str], api_key_env: str | None) -> str:
    """The argv as a shell command, one flag per line; the key stays a variable the shell expands."""
    secret = "${%s}" % api_key_env if api_key_env else None
    words = [f'"{t}"' if t == secret else shlex.quote(t) for t in argv]
    lines, current = [], words[:3]
    for word in words[3:]:
        if word.startswith("--"):
            lines.append(" ".join(current))
            current = [word]
        else:
            current.append(word)
    return " \\\n    ".join(lines + [" ".join(current)])
