"""Run the engine inside a container through the Docker API (docker SDK)."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

from rig.core import RigError
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
