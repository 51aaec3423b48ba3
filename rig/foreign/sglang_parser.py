"""sglang's own argument parser, run by rig.serving.server in the venv's Python: one JSON request per line on
standard input, one JSON answer per line. "options" lists the parser's flags, "parse" parses an argv,
"adaptive" loads an adaptive-speculation config with sglang's own loader and, given the argv, runs sglang's own
start-up check of the line against it (`_init_adaptive_speculative_params`: the launch's --speculative-num-steps
must be one of the config's candidate steps). One process serves them all, so sglang is imported once."""
import argparse
import importlib.metadata
import json
import sys

from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]


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
            if "argv" in request:
                launch_check(parser, request["argv"], adaptive)
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


def launch_check(parser: argparse.ArgumentParser, argv: list, adaptive) -> None:
    """Run sglang's start-up check on the parsed ARGV; where the hook needs the whole resolved ServerArgs (it
    cannot run without a GPU), its rule with sglang's own candidate resolver: the steps must be a candidate."""
    args = parser.parse_args(argv)
    hook = start_up_hook()
    if hook is not None:
        try:
            hook(args)
            return
        except ValueError:
            raise
        except Exception:  # the hook reached for what only a resolved ServerArgs has
            pass
    candidates = adaptive.resolve_candidate_steps_from_config(cfg_path=args.speculative_adaptive_config)
    if args.speculative_num_steps is not None and args.speculative_num_steps not in candidates:
        raise ValueError(f"--speculative-num-steps={args.speculative_num_steps} is not in the adaptive config "
                         f"candidate_steps {candidates}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    parser.error = error  # type: ignore[method-assign]  # an error is an answer, not an exit
    for line in sys.stdin:
        print(json.dumps(answer(parser, json.loads(line))), flush=True)
