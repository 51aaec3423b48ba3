"""`rig doctor --log FILE`: name each known failure in a server or build log, with its cause and fix.

The rules are data (rig/log_rules.yml, shipped in the engine bundle); a log is input like any
other, so it is read as bytes, decoded leniently, and only its last MAX_BYTES are scanned.
"""
from __future__ import annotations

import functools
import importlib.resources
import re
from pathlib import Path

from rig.core import RigError
from rig.core.documents import parse_yaml
from rig.core.fs import read_tail
from rig.core.schema import Field, validate

MAX_BYTES = 64 << 20   # a day of a busy server's log; failures that matter are near the end
RULE_SPEC = Field(list, item=Field(dict, fields={
    "id": Field(required=True), "pattern": Field(required=True), "cause": Field(required=True),
    "fix": Field(required=True)}))


@functools.cache
def rules() -> list[dict]:
    text = (importlib.resources.files("rig") / "log_rules.yml").read_text()  # a zipapp too
    found = validate(parse_yaml(text, "log_rules.yml"), RULE_SPEC, "log_rules.yml")
    return [{**rule, "regex": re.compile(rule["pattern"])} for rule in found]


def diagnose(path: str | Path) -> dict:
    path = Path(path)
    try:
        data, size = read_tail(path, "log", MAX_BYTES)
        text = data.decode("utf-8", errors="replace")
    except RigError:  # read_tail's own answers (MissingFile is an OSError too)
        raise
    except OSError as exc:
        raise RigError(f"cannot read log {path}: {exc.strerror or exc}") from exc
    findings, seen = [], set()
    for number, line in enumerate(text.splitlines(), 1):  # counted from the scan's start when truncated
        for rule in rules():
            if rule["id"] not in seen and rule["regex"].search(line):
                seen.add(rule["id"])
                findings.append({"rule": rule["id"], "line": number, "text": line.strip()[:300],
                                 "cause": rule["cause"], "fix": rule["fix"]})
    lines = [f"{path}: {len(findings)} known failure(s)" + ("" if findings else " (no rule matched)")]
    for f in findings:
        lines += [f"  line {f['line']}: {f['text']}", f"    cause: {f['cause']}", f"    fix:   {f['fix']}"]
    return {"log": str(path), "findings": findings, "scanned_bytes": min(size, MAX_BYTES), "msg": "\n".join(lines)}
