"""Run by rig.patches in the patched environment's Python: compiles every patched source, then runs each
patch's check on its own. The job comes as JSON on standard input; one JSON line back, check -> error."""
import json
import sys
import traceback


def main(job: dict) -> dict:
    errors = {}
    for path, text in job["sources"].items():
        try:
            compile(text, path, "exec")
        except SyntaxError as exc:
            errors["compile " + path] = f"{exc.msg} (line {exc.lineno})"
    for check in job["checks"]:
        try:
            exec(compile(check["code"], check["id"] + " check", "exec"),
                 {"__name__": "__rig_check__", "PATCHED_FILE": check["file"]})
        except BaseException:
            errors[check["id"]] = traceback.format_exc(limit=-3).strip()
    return errors


if __name__ == "__main__":
    print(json.dumps(main(json.load(sys.stdin))))
