"""sglang's own argument parser, run by rig.serving.server in the venv's Python: one JSON request per line on
standard input, one JSON answer per line on the file descriptor named by its first argument (never stdout,
where an import's banner or argparse's help would be taken for an answer). "options" lists the parser's flags,
"parse" parses an argv, "adaptive" loads an adaptive-speculation config with sglang's own loader and, given
the argv, runs sglang's own start-up check of the line against it (`_init_adaptive_speculative_params`: the
launch's --speculative-num-steps must be one of the config's candidate steps). One process serves them all, so
sglang is imported once."""
import argparse
import importlib.metadata
import json
import sys

from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]  # after sglang_bare.py


def error(message: str):
    raise ValueError(message)


def answer(parser: argparse.ArgumentParser, request: dict) -> dict:
    out: dict = {"version": importlib.metadata.version("sglang")}
    if request["mode"] == "options":
        out["options"] = sorted(o for a in parser._actions for o in a.option_strings)
    elif request["mode"] == "adaptive":
        try:
            import sglang.srt.speculative.adaptive_spec_params as adaptive  # type: ignore[import-not-found]

            loader = getattr(adaptive, "_load_adaptive_config", None)
            if loader is None:
                out["note"] = "its adaptive_spec_params has no _load_adaptive_config: only rig read the file"
            else:
                loader(request["path"])
            if "argv" in request and (note := launch_check(parser, request["argv"])):
                out["note"] = note
        except ImportError as exc:
            out["error"] = f"it has no adaptive speculation ({exc}); SGLang 0.5.17 and later have it"
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
    else:
        try:
            parser.parse_args(request["argv"])
        except (ValueError, SystemExit) as exc:
            out["error"] = str(exc)
    return out


def start_up_hook():
    """sglang's own start-up check of an adaptive line: in arg_groups/speculative_hook (0.5.17+) or server_args."""
    import importlib

    for module in ("sglang.srt.arg_groups.speculative_hook", "sglang.srt.server_args"):
        try:
            found = getattr(importlib.import_module(module), "_init_adaptive_speculative_params", None)
        except ImportError:
            continue
        if found is not None:
            return found
    return None


def launch_check(parser: argparse.ArgumentParser, argv: list):
    """Run sglang's own start-up check on the parsed ARGV (its ValueError is the refusal); a note where this
    sglang has no such hook, or its hook needs the resolved ServerArgs a CPU cannot build (rig's own rule, the
    launch steps among the candidates, was checked either way)."""
    hook = start_up_hook()
    if hook is None:
        return "it has no adaptive start-up hook: rig's rule alone checked the line"
    try:
        hook(parser.parse_args(argv))
    except ValueError:
        raise
    except Exception as exc:  # the hook reached for what only a resolved ServerArgs has
        return f"its adaptive start-up hook needs a resolved ServerArgs ({type(exc).__name__}): rig's rule alone checked"
    return None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    parser.error = error  # type: ignore[method-assign]  # an error is an answer, not an exit
    with open(int(sys.argv[1]), "w", closefd=True) as answers:
        for line in sys.stdin:
            request = json.loads(line)
            # the request's number back with its answer: rig takes no answer out of turn
            print(json.dumps({**answer(parser, request), "seq": request.get("seq")}), file=answers, flush=True)
