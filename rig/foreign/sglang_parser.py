"""sglang's own argument parser, run by rig.serving.server in the venv's Python: one JSON request per line on
standard input, one JSON answer per line. "options" lists the parser's flags, "parse" parses an argv,
"adaptive" loads an adaptive-speculation config with sglang's own loader. One process serves them all, so
sglang is imported once."""
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    parser.error = error  # type: ignore[method-assign]  # an error is an answer, not an exit
    for line in sys.stdin:
        print(json.dumps(answer(parser, json.loads(line))), flush=True)
