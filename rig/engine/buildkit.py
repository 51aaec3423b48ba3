"""Image builds through BuildKit: the Docker CLI's `docker build` with DOCKER_BUILDKIT=1.

docker-py drives only the legacy builder (no cache, secret or bind mounts, every stage on the way to a
target run), so rig runs the CLI. `docker build` speaks BuildKit in two shapes: a 20.10-era client (Debian's
docker.io) by itself, and a newer one through its buildx plugin; with neither, BuildKit is refused at once,
which is how rig tells. The build's plain progress is read for its steps and whether each came from the
cache; nothing is read from its human prose beyond the vertex lines.
"""
from __future__ import annotations

import collections
import functools
import os
import re
import shutil
from pathlib import Path

from rig.core import RigError, progress
from rig.core.proc import DEVNULL, PIPE, STDOUT, run, spawn

DEFAULT_HOST = "unix:///var/run/docker.sock"  # docker-py's engine when DOCKER_HOST is not set


def environment() -> dict:
    """The CLI's environment: BuildKit on, the engine docker-py talks to (the CLI would follow its current
    context instead) and that engine's own builder (a buildx builder of another driver would keep the image
    out of the engine where rig reads it back)."""
    return {**os.environ, "DOCKER_BUILDKIT": "1", "DOCKER_HOST": os.environ.get("DOCKER_HOST") or DEFAULT_HOST,
            "BUILDX_BUILDER": "default"}


# `#7 [stack 3/6] RUN ...`, `#7 CACHED`, `#7 DONE 1.2s`, `#7 ERROR: ...`: BuildKit's plain progress
VERTEX = re.compile(r"#(\d+) \[([^\]]+)\] (.+)")
STATUS = re.compile(r"#(\d+) (CACHED|DONE|ERROR)\b")
TAIL = 40


@functools.cache
def cli() -> str:
    """The first `docker` on PATH whose `docker build` speaks BuildKit."""
    seen = set()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = shutil.which("docker", path=directory) if directory else None
        if not candidate or os.path.realpath(candidate) in seen:
            continue
        seen.add(os.path.realpath(candidate))
        answer = run([candidate, "build", "--help"], "the Docker client's BuildKit build", ok=None,
                     env=environment(), timeout=60)
        if answer.returncode == 0:
            return candidate
    raise RigError("no Docker client on PATH builds with BuildKit (Docker 23 and later need the buildx plugin "
                   "for it): run scripts/ensure-docker.sh, which installs Debian's docker.io, or install buildx")


class Steps:
    """The build's steps in the order BuildKit starts them, fed one progress line at a time: each Dockerfile
    instruction ([internal] vertices left out; BuildKit names a vertex again each time its output resumes)
    and whether it came from the cache."""

    def __init__(self) -> None:
        self.steps: dict[str, dict] = {}

    def feed(self, line: str) -> str | None:
        """Take LINE; the step it starts, if it starts one."""
        if vertex := VERTEX.match(line):
            number, where, what = vertex.groups()
            if where != "internal" and number not in self.steps:
                self.steps[number] = {"step": f"[{where}] {what.strip()}", "cached": False}
                return self.steps[number]["step"]
        elif (status := STATUS.match(line)) and status.group(1) in self.steps and status.group(2) == "CACHED":
            self.steps[status.group(1)]["cached"] = True
        return None


def steps_of(lines: list[str]) -> list[dict]:
    """The steps of a whole progress output (Steps)."""
    steps = Steps()
    for line in lines:
        steps.feed(line)
    return list(steps.steps.values())


def build(context: Path, target: str, *, tag: str | None = None, output: Path | None = None,
          args: dict | None = None, labels: dict | None = None, secrets: dict | None = None,
          no_cache: bool = False) -> list[dict]:
    """Build CONTEXT's Dockerfile up to TARGET, into the image TAG or, with OUTPUT, into that directory
    (the target's files only, no image); SECRETS (id: file) are mounted where a step asks for them and never
    written to a layer. Each step is relayed as progress; the steps come back."""
    for path in (output, *(secrets or {}).values()):
        if path is not None and {",", '"'} & set(str(path)):  # the CLI splits these values on commas
            raise RigError(f"{path}: a path with a comma or a quote cannot be handed to `docker build`; "
                           "use another directory (TMPDIR, --cache)")
    argv = [cli(), "build", "--progress=plain", "--target", target, *(["--no-cache"] if no_cache else [])]
    argv += ["--tag", tag] if tag else ["--output", f"type=local,dest={output}"]
    for flag, values in (("--build-arg", args), ("--label", labels)):
        argv += [part for key, value in (values or {}).items() for part in (flag, f"{key}={value}")]
    argv += [part for key, path in (secrets or {}).items() for part in ("--secret", f"id={key},src={path}")]
    child = spawn([*argv, "--", str(Path(context).resolve())], "the image build", stdin=DEVNULL,
                  stdout=PIPE, stderr=STDOUT, text=True, env=environment())
    assert child.stdout  # a pipe
    tail: collections.deque[str] = collections.deque(maxlen=TAIL)
    steps = Steps()
    with child:
        for line in child.stdout:
            tail.append(line.rstrip("\n"))
            if started := steps.feed(line):
                progress(started[:160])
    if child.returncode != 0:
        raise RigError(f"the image build (target {target}) failed:\n" + "\n".join(tail))
    return list(steps.steps.values())
