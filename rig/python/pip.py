"""The one place rig drives pip: resolving for a target and downloading wheels.

pip resolves for another interpreter and platform with --python-version and
--platform, but takes platform tags literally, so a target's glibc is spelled
out as every manylinux tag it can run.
"""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from rig.core import RigError
from rig.core.documents import load_json
from rig.core.proc import Completed, run

DEFAULT_GLIBC = "2.35"  # Ubuntu 22.04; Debian 12 has 2.36


def platform_tags(arch: str = "x86_64", glibc: str = DEFAULT_GLIBC) -> list[str]:
    """Every platform tag a Linux ARCH machine with GLIBC runs, newest first."""
    minor = int(glibc.split(".")[1])
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{arch}" for m, name in legacy.items() if m <= minor]
    return tags


def target_args(python: str | None, arch: str = "x86_64", glibc: str = DEFAULT_GLIBC) -> list[str]:
    """Binary wheels only, for PYTHON (None: any) on ARCH with GLIBC."""
    args = ["--only-binary=:all:"]
    if python:
        args += ["--python-version", python, "--implementation", "cp"]
    for tag in platform_tags(arch, glibc):
        args += ["--platform", tag]
    return args


def index_args(index_url: str = "", extra_index_urls: tuple[str, ...] = ()) -> list[str]:
    """An empty index_url keeps pip's configured default index."""
    args = ["--index-url", index_url] if index_url else []
    for url in extra_index_urls:
        args += ["--extra-index-url", url]
    return args


def run_pip(args: list[str], what: str) -> Completed:
    done = run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], f"pip could not {what}", ok=None,
               timeout=3600)  # an index that stops answering mid-download
    if done.returncode != 0:
        raise PipError(what, done.stderr)
    return done


class PipError(RigError):
    def __init__(self, what: str, stderr: str):
        self.stderr = stderr  # whole, for callers that classify the failure
        errors = [line for line in stderr.splitlines() if not line.startswith("WARNING")]
        super().__init__(f"pip could not {what}:\n" + "\n".join(errors[-15:]))


def resolve(requirements: list[str], target: list[str], index: list[str], no_deps: bool = False) -> list[dict]:
    """pip's installation report for REQUIREMENTS on the target: the `install` items."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        args = ["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
                "--target", str(Path(tmp) / "target"), *target, *index]
        if no_deps:
            args.append("--no-deps")
        run_pip(args + requirements, f"resolve {' '.join(requirements)}")
        return load_json(report, "pip's report")["install"]


def download(requirements: list[str], dest: Path, target: list[str], index: list[str],
             no_deps: bool = True) -> None:
    args = ["download", "--quiet", "--dest", str(dest), *target, *index]
    if no_deps:
        args.append("--no-deps")
    run_pip(args + requirements, f"download {' '.join(requirements)}")


# A hash-pinned requirement, as pip's --require-hashes reads it: written and read here alone.
_PINNED = re.compile(r"([A-Za-z0-9_.\-]+)==(\S+)\s+--hash=sha256:([0-9a-f]{64})")


def pinned(name: str, version: str, sha256: str) -> str:
    return f"{name}=={version} --hash=sha256:{sha256}"


def read_pinned(text: str, what: str = "the requirements file") -> list[tuple[str, str, str]]:
    """(name, version, sha256) of each line; blanks and comments are skipped, anything else is refused."""
    pins = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _PINNED.fullmatch(line.strip())
        if match is None:
            raise RigError(f"{what}, line {number}: {line.strip()[:120]!r} is not NAME==VERSION "
                           "--hash=sha256:HEX; export it again with rig")
        pins.append((match[1], match[2], match[3]))
    return pins
