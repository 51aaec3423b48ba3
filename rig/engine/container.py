"""rig's engine in a container, through the Docker API (docker SDK): in a running one, with the bundle copied
in (`rig doctor --container`, the tests' boxes), or in a throwaway one of an image that carries its own
(`rig image verify`). Either way the engine's JSON report is read the same way."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

from rig.core import RigError
from rig.core.documents import parse_json
from rig.engine.bundle import build

INSIDE = "/tmp/rig-engine"


def client():
    """The Docker engine, or an error that says how to start one."""
    import docker
    from docker.errors import DockerException

    try:
        engine = docker.from_env()
        engine.ping()
        return engine
    except DockerException as exc:
        raise RigError(f"cannot reach the Docker engine: {exc}. scripts/ensure-docker.sh starts one") from exc


def run_engine(container_name: str, args: list[str], bundle: str | Path) -> tuple[int, str, str]:
    """Copy the engine bundle into the container, run `rig ARGS` there, remove it."""
    from docker.errors import NotFound

    try:
        container = client().containers.get(container_name)
    except NotFound as exc:
        raise RigError(f"no container named {container_name!r}; `docker ps` lists the running ones") from exc
    if container.status != "running":
        raise RigError(f"container {container_name!r} is {container.status}, not running")
    path = Path(build(bundle)["path"])
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as tar:
        tar.add(path, arcname="rig.pyz")
    container.exec_run(["mkdir", "-p", INSIDE])
    container.put_archive(INSIDE, payload.getvalue())
    try:
        code, output = container.exec_run(["python3", f"{INSIDE}/rig.pyz", *args], demux=True)
    finally:
        container.exec_run(["rm", "-rf", INSIDE])
    stdout, stderr = output
    return code, (stdout or b"").decode(), (stderr or b"").decode()


def run_image_engine(tag: str, engine: str, args: list[str]) -> tuple[int, str, str]:
    """`rig ARGS` by the ENGINE an image carries, in a throwaway container of TAG as the image's own user."""
    container = client().containers.run(tag, [engine, *args], entrypoint="python3", detach=True)
    try:
        code = container.wait()["StatusCode"]
        return code, container.logs(stdout=True, stderr=False).decode(), container.logs(stdout=False, stderr=True).decode()
    finally:
        container.remove(force=True)


def report(done: tuple[int, str, str], what: str) -> dict:
    """The JSON report the engine printed, whatever its exit status (a failed check exits 1 and still reports);
    none at all is a RigError naming WHAT, with the end of what it printed."""
    code, out, err = done
    try:
        found = parse_json(out, f"{what}'s report")
    except RigError as exc:
        raise RigError(f"{what} exited {code} with no report: {(out + err)[-1500:]}") from exc
    if not isinstance(found, dict):
        raise RigError(f"{what} exited {code} with a report that is not an object: {out[:200]!r}")
    return found
