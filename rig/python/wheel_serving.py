"""The controller's exported wheelhouse over HTTP, for hosts to pull.

Hosts pull in parallel instead of the controller pushing gigabytes through each
Ansible connection; --require-hashes checks every byte against the lock, so plain
HTTP carries nothing a host trusts unchecked. Only the directory's own top-level
files and its listing (what pip's and uv's --find-links read) are served. A
detached server stops by itself once nobody has asked it anything for a while,
so a play that fails half-way leaves no server behind for long.
"""
from __future__ import annotations

import functools
import http.server
import ipaddress
import os
import re
import selectors
import socket
import sys
import threading
import time
from pathlib import Path

from rig.core import RigError
from rig.core.documents import dump_json, parse_json
from rig.core.fs import atomic_write, open_plain
from rig.core.proc import DEVNULL, PIPE, spawn

START_TIMEOUT = 30


class WheelServer:
    """DIRECTORY over HTTP on HOST, at a free port the kernel picks (hosts are told the URL)."""

    def __init__(self, directory: str | Path, host: str):
        handler = functools.partial(_Handler, directory=str(directory))
        server_class = _Server6 if ":" in host else _Server
        try:
            self.server = server_class((host, 0), handler)
        except OSError as exc:
            raise RigError(f"cannot serve the wheelhouse on {host}: {exc.strerror or exc}") from exc
        self.port = self.server.server_address[1]
        self.url = f"http://{_url_host(host)}:{self.port}/"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.server.shutdown()
        self.server.server_close()

    def idle_for(self) -> float:
        return time.monotonic() - self.server.last_request

    @property
    def bytes_sent(self) -> int:
        return self.server.bytes_sent


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.last_request = time.monotonic()
        self.bytes_sent = 0
        self.lock = threading.Lock()


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(http.server.SimpleHTTPRequestHandler):
    timeout = 60  # a client that stalls does not hold a thread for good

    def log_message(self, *_):  # pip's requests are many; progress says what happens
        pass

    def handle_one_request(self):
        self.server.last_request = time.monotonic()
        super().handle_one_request()
        self.server.last_request = time.monotonic()  # a 4 GB transfer is not idleness

    def send_head(self):
        """The listing of the top directory, or one regular file directly in it; nothing else."""
        name = self.path.split("?", 1)[0].split("#", 1)[0]
        root = Path(self.directory).resolve()
        if name != "/":
            target = Path(self.translate_path(name))
            if target.parent.resolve() != root or not target.resolve().is_relative_to(root) or not target.is_file():
                self.send_error(404)
                return None
            start = _range_start(self.headers.get("Range"))
            if start is not None:
                return self._rest_of(target, start)
        return super().send_head()

    def _rest_of(self, target: Path, start: int):
        """The file from byte START on (206), so that a download cut short resumes instead of starting over; 416
        where START is at or past its end."""
        try:  # never a FIFO swapped in since send_head looked: it would hold this thread for good
            source = os.fdopen(open_plain(target, os.O_RDONLY, "the served file"), "rb")
        except RigError:
            self.send_error(404)
            return None
        try:  # copyfile reads it, then the base class closes it
            size = os.fstat(source.fileno()).st_size
            if start >= size:
                source.close()
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            source.seek(start)
            self.send_response(206)
            self.send_header("Content-Type", self.guess_type(str(target)))
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.send_header("Content-Length", str(size - start))
            self.end_headers()
            return source
        except BaseException:
            source.close()
            raise

    def copyfile(self, source, outputfile):
        while chunk := source.read(1 << 20):
            # counted before it leaves: a client that has every byte never reads a smaller count
            with self.server.lock:
                self.server.bytes_sent += len(chunk)
            outputfile.write(chunk)
            self.server.last_request = time.monotonic()


def _range_start(header: str | None) -> int | None:
    """N of `Range: bytes=N-`, the one form a resumed download asks; any other range is answered with the whole
    file (200), as HTTP allows a server that does not serve it."""
    said = re.fullmatch(r"bytes=([0-9]{1,19})-", (header or "").strip())
    return int(said[1]) if said else None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def serve(directory: str | Path, bind: str, idle_exit: float, stats: str | None = None) -> None:
    """Serve DIRECTORY until nobody has asked anything for IDLE_EXIT seconds; STATS gets the bytes sent."""
    with WheelServer(directory, bind) as server:
        print(dump_json({"port": server.port}, "the server's port"), flush=True)
        while server.idle_for() < idle_exit:
            time.sleep(0.5)
        if stats:
            atomic_write(stats, dump_json({"bytes_sent": server.bytes_sent}, str(stats)) + "\n")


def detach(directory: str | Path, bind: str, idle_exit: float, stats: str | None = None) -> dict:
    """Start `serve` in a process of its own session (it outlives the play's task) and return once it listens;
    its messages go to DIRECTORY/../NAME.serve.log."""
    directory = Path(directory)
    if not any(directory.glob("*requirements.txt")) and not any(directory.glob("*.manifest.json")):
        raise RigError(f"{directory} is not an exported wheelhouse (no requirements file) nor a venv archive's (no "
                       "manifest); run `rig wheelhouse export`, `rig wheels export` or `rig venv pack` first")
    argv = [sys.executable, "-m", "rig", "wheelhouse", "serve", str(directory), "--bind", bind,
            "--idle-exit", str(idle_exit), "--foreground"] + (["--stats", stats] if stats else [])
    log = directory.parent / f"{directory.name}.serve.log"
    with os.fdopen(open_plain(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, "the wheel server's log",
                              follow=False), "ab") as errors:
        proc = spawn(argv, "the wheelhouse server", stdin=DEVNULL, stdout=PIPE, stderr=errors,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout  # a pipe
    try:
        with selectors.DefaultSelector() as wait:
            wait.register(proc.stdout, selectors.EVENT_READ)
            line = proc.stdout.readline() if wait.select(START_TIMEOUT) else b""
        port = parse_json(line.decode(errors="replace"), "the wheelhouse server's first line")["port"]
    except (RigError, KeyError, TypeError):
        proc.kill()
        raise RigError(f"the wheelhouse server did not start within {START_TIMEOUT} s; see {log}") from None
    finally:
        proc.stdout.close()
    return {"changed": False, "pid": proc.pid, "port": port, "dir": str(directory),
            "msg": f"serving {directory} on {bind}:{port} until idle for {idle_exit:g} s"}


def bridge_gateway(ipam: dict) -> str:
    """The host's address on a Docker network. Docker leaves Gateway out of the config when it
    chose the address itself: then it is the subnet's first host."""
    return ipam.get("Gateway") or str(next(ipaddress.ip_network(ipam["Subnet"]).hosts()))


def route(host: str, port: int, docker: bool = False) -> dict:
    """The URL at which HOST reaches this machine's PORT: this machine's address on the container's network
    for a container on this Docker engine, else the local address the kernel picks to reach HOST (IPv4 first,
    as the server listens on 0.0.0.0 by default)."""
    if docker:
        import docker as docker_sdk

        from rig.engine.container import client

        engine = client()
        try:
            networks = engine.containers.get(host).attrs["NetworkSettings"]["Networks"]
        except docker_sdk.errors.NotFound:
            raise RigError(f"no container named {host} on this Docker engine") from None
        configs = [cfg for name in networks for cfg in engine.networks.get(name).attrs["IPAM"]["Config"] or []]
        if not configs:
            raise RigError(f"container {host} has no network with an address: it cannot reach this machine")
        address = bridge_gateway(configs[0])
    else:
        answers = []
        for family in (socket.AF_INET, socket.AF_INET6):
            try:
                answers += socket.getaddrinfo(host, None, family, socket.SOCK_DGRAM)
            except socket.gaierror:
                continue
        if not answers:
            raise RigError(f"cannot resolve {host!r} to an address")
        with socket.socket(answers[0][0], socket.SOCK_DGRAM) as probe:
            probe.connect((answers[0][4][0], 9))  # no packet is sent: the kernel only picks the route
            address = probe.getsockname()[0]
    ipaddress.ip_address(address)  # an address, not a name
    return {"changed": False, "url": f"http://{_url_host(address)}:{port}/"}
