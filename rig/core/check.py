"""The one report model: a check's verdict, and its text, JSON and JUnit renderings, for doctor, validate
and prove alike."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from rig.core.escape import terminal

MARKS = {"pass": "PASS", "fail": "FAIL", "skip": "skip", "warn": "WARN"}


@dataclass
class Check:
    layer: str
    name: str
    status: str  # pass | fail | warn | skip
    detail: str
    fix: str = ""
    required: bool = True  # a failed check that is not required is reported without failing the run
    question: str = ""  # what the check asks: a CI report's test name says it
    problems: list[str] = field(default_factory=list)  # every problem a failed check found, not only the first


def failed(checks: list[Check]) -> bool:
    return any(c.status == "fail" and c.required for c in checks)


def as_json(checks: list[Check]) -> dict:
    """The checks, the verdict, and the verdict in words (what a role's failed task says)."""
    bad = [c for c in checks if c.status == "fail" and c.required]
    said = "; ".join(f"{c.layer} {c.name}: {'; '.join(c.problems) or c.detail}" + (f" (fix: {c.fix})" if c.fix else "")
                     for c in bad)
    return {"checks": [asdict(c) for c in checks], "ok": not bad,
            "msg": said or f"no required check failed ({len(checks)} checks)"}


def render(checks: list[Check], verdict: str) -> str:
    """One line a check (its problems, when it failed with several), its fix under it, then VERDICT; for a
    terminal."""
    lines = []
    for c in checks:
        said = "; ".join(c.problems) if c.status == "fail" and c.problems else c.detail
        lines.append(f"{MARKS[c.status]:4}  {c.layer:9} {c.name:26} {said}")
        if c.status in ("fail", "warn") and c.fix:
            lines.append(f"{'':16}{'':26} fix: {c.fix}")
    lines.append(verdict)
    return terminal("\n".join(lines))  # a problem may quote input: a path, a log line, a server's answer


def _xml(text: str) -> str:
    """TEXT as XML 1.0 can hold it: control characters (a stack path may carry any) written as \\xNN."""
    return re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]",
                  lambda m: m.group().encode("unicode_escape", "backslashreplace").decode(), text)


def junit(checks: list[Check], suite_name: str) -> str:
    """One JUnit test case per check, so CI systems list them; a failure carries every problem."""
    import xml.etree.ElementTree as ET

    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name=_xml(suite_name), tests=str(len(checks)),
                          failures=str(sum(c.status == "fail" for c in checks)),
                          skipped=str(sum(c.status == "skip" for c in checks)), errors="0")
    for check in checks:
        case = ET.SubElement(suite, "testcase", classname=f"rig.{check.layer}",
                             name=_xml(f"{check.name}: {check.question}" if check.question else check.name))
        if check.status == "fail":
            problems = check.problems or [check.detail]
            failure = ET.SubElement(case, "failure", message=_xml(problems[0][:500]))
            failure.text = _xml("\n".join(problems + ([f"fix: {check.fix}"] if check.fix else [])))
        elif check.status == "skip":
            ET.SubElement(case, "skipped", message=_xml(check.detail))
        else:
            ET.SubElement(case, "system-out").text = _xml(check.detail)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
