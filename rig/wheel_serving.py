"""The controller's exported wheelhouse over HTTP, for hosts and image builds to pull.

Hosts pull in parallel instead of the controller pushing gigabytes through each
Ansible connection; pip's --require-hashes checks every byte against the lock,
so plain HTTP carries nothing a host trusts unchecked. A detached server stops
by itself once nobody has asked it anything for a while, so a play that fails
half-way leaves no server behind for long.
"""
from __future__ import annotations

import functools
import http.server
import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from rig import RigError
from rig.fs import atomic_write

PORTS = range(20000, 40000)


class WheelServer:
    """DIRECTORY over HTTP on HOST, at a port derived from SEED (a lock hash), so an image build's cache key
    stays the same from run to run; the next free port when that one is taken."""

    def __init__(self, directory: str | Path, host: str, seed: str):
        handler = functools.partial(_Handler, directory=str(directory))
        base = PORTS.start + int(seed[:8], 16) % len(PORTS)
        for port in range(base, base + 20):
            try:
                self.server = _Server((host, port), handler)
                break
            except OSError:
                continue
        else:
            raise RigError(f"no free port near {base} on {host} to serve the wheelhouse from")
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


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *_):  # pip's requests are many; progress says what happens
        pass

    def handle_one_request(self):
        self.server.last_request = time.monotonic()
        super().handle_one_request()
        self.server.last_request = time.monotonic()  # a 4 GB transfer is not idleness

    def copyfile(self, source, outputfile):
        sent = 0
        while chunk := source.read(1 << 20):
            outputfile.write(chunk)
            sent += len(chunk)
            self.server.last_request = time.monotonic()
        with self.server.lock:
            self.server.bytes_sent += sent


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def serve(directory: str | Path, bind: str, seed: str, idle_exit: float, stats: str | None = None) -> None:
    """Serve DIRECTORY until nobody has asked anything for IDLE_EXIT seconds; STATS gets the bytes sent."""
    with WheelServer(directory, bind, seed) as server:
        print(json.dumps({"port": server.port}), flush=True)
        while server.idle_for() < idle_exit:
            time.sleep(0.5)
        if stats:
            atomic_write(stats, json.dumps({"bytes_sent": server.bytes_sent}) + "\n")


def detach(directory: str | Path, bind: str, seed: str, idle_exit: float, stats: str | None = None) -> dict:
    """Start `serve` in a process of its own session (it outlives the play's task) and return once it listens."""
    if not any(Path(directory).glob("*requirements.txt")):
        raise RigError(f"{directory} is not an exported wheelhouse (no requirements file); "
                       "run `rig wheelhouse export` or `rig wheels export` first")
    argv = [sys.executable, "-m", "rig", "wheelhouse", "serve", str(directory), "--bind", bind, "--seed", seed,
            "--idle-exit", str(idle_exit), "--foreground"] + (["--stats", stats] if stats else [])
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout and proc.stderr  # pipes
    line = proc.stdout.readline()
    if not line:
        raise RigError(f"the wheelhouse server did not start: {proc.stderr.read().strip()[-500:]}")
    proc.stdout.close()
    proc.stderr.close()
    return {"changed": False, "pid": proc.pid, "port": json.loads(line)["port"], "dir": str(directory),
            "msg": f"serving {directory} on {bind}:{json.loads(line)['port']} until idle for {idle_exit:g} s"}


def route(host: str, port: int, docker: bool = False) -> dict:
    """The URL at which HOST reaches this machine's PORT: the bridge gateway for a container on this
    Docker engine, else the local address the kernel picks to reach HOST."""
    if docker:
        from rig.container import client

        networks = client().containers.get(host).attrs["NetworkSettings"]["Networks"]
        address = next((n.get("Gateway") for n in networks.values() if n.get("Gateway")), None)
        if not address:
            raise RigError(f"container {host} has no network with a gateway: it cannot reach this machine")
    else:
        try:
            target = socket.getaddrinfo(host, None, proto=socket.IPPROTO_UDP)[0]
        except socket.gaierror as exc:
            raise RigError(f"cannot resolve {host}: {exc}") from exc
        with socket.socket(target[0], socket.SOCK_DGRAM) as probe:
            probe.connect((target[4][0], 9))  # no packet is sent: the kernel only picks the route
            address = probe.getsockname()[0]
    ipaddress.ip_address(address)  # an address, not a name
    return {"changed": False, "url": f"http://{_url_host(address)}:{port}/"}
