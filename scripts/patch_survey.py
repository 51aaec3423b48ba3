"""Which patch each released version needs: status of every patch on real wheels.

    python scripts/patch_survey.py sglang==0.5.9 sglang==0.5.23 flashinfer-python==0.6.3 ...

Downloads each wheel (no dependencies) into $RIG_CACHE/survey, unpacks only the
files the patches touch, and prints a Markdown table for rig/patches/set/README.md.
Status is read from the files alone, so no environment is installed.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rig.patches.env import Env  # noqa: E402
from rig.patches.patchset import load  # noqa: E402
from rig.patches.report import status  # noqa: E402

CACHE = Path(os.environ.get("RIG_CACHE", Path.home() / ".cache" / "rig")) / "survey"


def wheel(requirement: str) -> Path:
    name, version = requirement.split("==")
    stem = name.replace("-", "_")
    found = sorted(CACHE.glob(f"{stem}-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64", "--platform", "any",
                        "-d", str(CACHE), requirement], check=True)
        found = sorted(CACHE.glob(f"{stem}-{version}-*.whl"))
    return found[0]


def main(requirements: list[str]) -> None:
    patches = load()
    for package in dict.fromkeys(r.split("==")[0] for r in requirements):
        versions = [r.split("==")[1] for r in requirements if r.split("==")[0] == package]
        mine = [p for p in patches if p.package == package]
        states = {}
        for version in versions:
            with tempfile.TemporaryDirectory() as root, zipfile.ZipFile(wheel(f"{package}=={version}")) as archive:
                for patch in mine:
                    if patch.file in archive.namelist():
                        archive.extract(patch.file, root)
                env = Env(python="", prefix=Path(root), packages={package: {"version": version, "root": root}})
                states[version] = {row["id"]: row["status"] for row in status(env, mine)}
        print(f"| {package} patch | " + " | ".join(versions) + " |")
        print("|---|" + "---|" * len(versions))
        for patch in mine:
            cells = [states[v][patch.id].replace("not-applicable", "–") for v in versions]
            print(f"| {patch.id} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
