"""Reliability, not speed: how many hostile inputs the tests try (generated and written cases) and how many
hold."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from .common import BIN, REPO, write_section

HOSTILE = ["tests/unit/test_hostile_fuzz.py", "tests/unit/test_confinement.py", "tests/unit/test_cuda_state.py",
           "tests/unit/test_leftovers.py", "tests/unit/test_server.py", "tests/unit/test_links.py",
           "tests/unit/test_special_files.py", "tests/unit/test_generated_text.py", "tests/unit/test_http_client.py",
           # the third round's mechanisms (issue 49): numbers and text, files and processes, ELF, log rules
           "tests/unit/test_numbers_and_text.py", "tests/unit/test_hostile_files.py", "tests/unit/test_elf.py",
           "tests/unit/test_log_doctor.py", "tests/unit/test_one_reader.py"]


def bench_hostile(examples: int) -> None:
    """Reliability, not speed: how many hostile inputs the suite tries and how many hold."""
    import xml.etree.ElementTree as ET

    with tempfile.TemporaryDirectory() as tmp:
        report, junit = Path(tmp) / "fuzz.json", Path(tmp) / "junit.xml"
        env = {**os.environ, "RIG_FUZZ_EXAMPLES": str(examples), "RIG_FUZZ_REPORT": str(report)}
        subprocess.run([str(BIN / "pytest"), "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *HOSTILE],
                       cwd=REPO, env=env, check=False)
        fuzz = json.loads(report.read_text())
        totals = {k: sum(int(s.get(k, 0)) for s in ET.parse(junit).getroot().iter("testsuite"))
                  for k in ("tests", "failures", "errors")}
    fuzz_tests = sum(1 for line in (REPO / HOSTILE[0]).read_text().splitlines() if line.startswith("def test_"))
    explicit = totals["tests"] - fuzz_tests
    held_explicit = explicit - totals["failures"] - totals["errors"]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    write_section("hostile", f"""
## Reliability: hostile input ({when})

Method: `python scripts/bench.py hostile` runs the hostile-input tests once: {fuzz_tests} generated
properties in `tests/unit/test_hostile_fuzz.py` ({examples} examples each, derandomized, so every run tries
the same cases) and the written cases of {', '.join(Path(h).name for h in HOSTILE[1:])}. A case holds when
rig exits 0, or 1 where the command itself judges (a failed smoke check, a bench that stopped and kept
its report), or with exactly one `rig: error:` line and exit 2 (never a traceback, never 70), and an
audit hook saw no write outside the case's scratch directory. Hypothesis stops early on properties
whose space is small, so fewer cases are tried than properties times examples.

| kind | tried | held |
|---|---:|---:|
| generated (stack, lock, patch, state records, URLs, numbers, server answers) | {fuzz['cases']} | {fuzz['held']} |
| written cases (one test each, parametrized) | {explicit} | {held_explicit} |
""")
