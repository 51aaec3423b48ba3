"""`rig doctor --log FILE`: name each known failure in a server or build log, with its cause and fix.

The rules are data (rig/log_rules.yml, shipped in the engine bundle); a log is input like any
other, so it is read as bytes, decoded leniently, and only its last MAX_BYTES are scanned.

Every rule runs in time linear in the line: a rule is one or more pieces found in order, each searched
from where the previous one ended, and a piece may not hold an unbounded wildcard (`.*`, `.+`) or a
repeated group, which backtrack over the rest of the line from every place the piece could start (one
2 MiB line took `NCCL error.*unhandled system error` over 20 s).
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
BACKTRACKS = re.compile(r"(?<!\\)\.[*+{]|\)[*+{]")  # a wildcard repeated, or a group repeated


def _linear(piece: str) -> str | None:
    return f"{piece!r} can backtrack over the rest of a line: split it at the wildcard into a list of pieces " \
        "found in order" if BACKTRACKS.search(piece) else None


RULE_SPEC = Field(list, item=Field(dict, fields={
    "id": Field(required=True), "pattern": Field((str, list), required=True, item=Field(check=_linear),
                                                 check=lambda p: _linear(p) if isinstance(p, str) else
                                                 None if p else "give at least one piece"),
    "cause": Field(required=True), "fix": Field(required=True)}))


@functools.cache
def rules() -> list[dict]:
    text = (importlib.resources.files("rig") / "log_rules.yml").read_text()  # a zipapp too
    found = validate(parse_yaml(text, "log_rules.yml"), RULE_SPEC, "log_rules.yml")
    return [{**rule, "pieces": [re.compile(p) for p in ([rule["pattern"]] if isinstance(rule["pattern"], str)
                                                         else rule["pattern"])]} for rule in found]


def matches(rule: dict, line: str) -> bool:
    """Whether LINE holds RULE's pieces in order, each searched from where the previous one ended."""
    at = 0
    for piece in rule["pieces"]:
        found = piece.search(line, at)
        if not found:
            return False
        at = found.end()
    return True


def known_failures(text: str) -> list[dict]:
    """Each rule's first match in TEXT: its line (counted from TEXT's start), the line's text, cause and fix."""
    findings, seen = [], set()
    for number, line in enumerate(text.splitlines(), 1):
        for rule in rules():
            if rule["id"] not in seen and matches(rule, line):
                seen.add(rule["id"])
                findings.append({"rule": rule["id"], "line": number, "text": line.strip()[:300],
                                 "cause": rule["cause"], "fix": rule["fix"]})
    return findings


def diagnose(path: str | Path) -> dict:
    path = Path(path)
    try:
        data, size = read_tail(path, "log", MAX_BYTES)
        text = data.decode("utf-8", errors="replace")
    except RigError:  # read_tail's own answers (MissingFile is an OSError too)
        raise
    except OSError as exc:
        raise RigError(f"cannot read log {path}: {exc.strerror or exc}") from exc
    findings = known_failures(text)
    lines = [f"{path}: {len(findings)} known failure(s)" + ("" if findings else " (no rule matched)")]
    for f in findings:
        lines += [f"  line {f['line']}: {f['text']}", f"    cause: {f['cause']}", f"    fix:   {f['fix']}"]
    return {"log": str(path), "findings": findings, "scanned_bytes": min(size, MAX_BYTES), "msg": "\n".join(lines)}
