"""The one report model: a check's verdict, and its text, JSON and JUnit renderings, for doctor, validate
and prove alike."""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from rig.core import RigError, progress
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
    seconds: float | None = None  # how long it ran, where a runner timed it
    data: dict = field(default_factory=dict)  # what it measured, for a report to show


class Skip(Exception):
    """The check cannot run here; the message says why (never a pass)."""


class Runner:
    """Checks run one after another (validate's, prove's steps), each timed: a Skip is a skip with its reason,
    a RigError a failure with its message (its hint the fix), problems the work leaves a failure; an interruption
    or a defect is recorded as failed, never passed, and raised."""

    def __init__(self, layer: str) -> None:
        self.layer = layer
        self.checks: list[Check] = []

    def run(self, name: str, work: Callable[[Check], None], question: str = "") -> Check:
        check = Check(self.layer, name, "pass", "", question=question)
        self.checks.append(check)
        progress(f"{self.layer}: {name}")
        began = time.monotonic()
        try:
            work(check)
        except Skip as exc:
            check.status, check.detail = "skip", str(exc)
        except RigError as exc:  # its hint is the check's fix
            check.status, check.detail, check.problems = "fail", exc.message, [*check.problems, exc.message]
            check.fix = exc.hint or check.fix
        except BaseException as exc:  # interrupted or broken: never recorded as passed
            check.status, check.detail = "fail", f"stopped: {type(exc).__name__}: {exc}"
            raise
        finally:
            check.seconds = round(time.monotonic() - began, 1)
        if check.problems:
            check.status = "fail"
        said = check.detail.splitlines()[0] if check.detail else ""
        progress(f"{self.layer}: {name}: {MARKS[check.status]} {said}".rstrip())
        return check

    def skip(self, name: str, why: str) -> Check:
        """NAME not run, for WHY."""
        self.checks.append(Check(self.layer, name, "skip", why, seconds=0.0))
        progress(f"{self.layer}: {name}: skipped ({why})")
        return self.checks[-1]

    @property
    def ok(self) -> bool:
        return not failed(self.checks)


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
        if check.seconds is not None:
            case.set("time", f"{check.seconds:g}")
        if check.status == "fail":
            problems = check.problems or [check.detail]
            failure = ET.SubElement(case, "failure", message=_xml(problems[0][:500]))
            failure.text = _xml("\n".join(problems + ([f"fix: {check.fix}"] if check.fix else [])))
        elif check.status == "skip":
            ET.SubElement(case, "skipped", message=_xml(check.detail))
        else:
            ET.SubElement(case, "system-out").text = _xml(check.detail)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
