"""The wheelhouse server: what it serves, what it refuses, and that a detached one stops once idle."""
from __future__ import annotations

import os
import time
import urllib.error
import urllib.request

import pytest

from rig.core import RigError
from rig.python.wheel_serving import WheelServer, bridge_gateway, detach


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


@pytest.fixture
def house(tmp_path):
    root = tmp_path / "house"
    (root / "sub").mkdir(parents=True)
    (root / "a-1.0-py3-none-any.whl").write_bytes(b"wheel bytes")
    (root / "requirements.txt").write_text("a==1.0 --hash=sha256:" + "0" * 64 + "\n")
    (root / "sub" / "inner.whl").write_bytes(b"not top level")
    (tmp_path / "secret").write_text("outside")
    (root / "escape.whl").symlink_to(tmp_path / "secret")
    return root


def test_serves_the_listing_and_top_level_files_and_counts_bytes(house):
    with WheelServer(house, "127.0.0.1") as server:
        status, listing = get(server.url)
        assert status == 200 and b"a-1.0-py3-none-any.whl" in listing
        assert get(server.url + "a-1.0-py3-none-any.whl") == (200, b"wheel bytes")
        assert server.bytes_sent == len(listing) + len(b"wheel bytes")


@pytest.mark.parametrize("path", ["sub/inner.whl", "sub/", "escape.whl", "..%2Fsecret", "../secret", "missing.whl"])
def test_nothing_beyond_the_directorys_own_files_is_served(house, path):
    with WheelServer(house, "127.0.0.1") as server:
        assert get(server.url + path)[0] == 404


def test_two_servers_get_ports_of_their_own_and_a_bad_address_is_named(house):
    with WheelServer(house, "127.0.0.1") as first, WheelServer(house, "127.0.0.1") as second:
        assert first.port != second.port and get(second.url)[0] == 200
    with pytest.raises(RigError, match="cannot serve the wheelhouse on 192.0.2.1"):
        WheelServer(house, "192.0.2.1")


def test_a_detached_server_answers_then_stops_by_itself_once_idle(house):
    started = detach(house, "127.0.0.1", idle_exit=1.5)
    assert get(f"http://127.0.0.1:{started['port']}/requirements.txt")[0] == 200
    deadline = time.monotonic() + 20
    while os.path.exists(f"/proc/{started['pid']}") and time.monotonic() < deadline:
        try:
            os.waitpid(started["pid"], os.WNOHANG)  # reap it: the test is its parent
        except ChildProcessError:
            break
        time.sleep(0.2)
    assert not os.path.exists(f"/proc/{started['pid']}")


def test_a_directory_that_is_no_wheelhouse_is_refused(tmp_path):
    with pytest.raises(RigError, match="not an exported wheelhouse"):
        detach(tmp_path, "127.0.0.1", idle_exit=1)


def test_the_gateway_is_the_configured_one_or_the_subnets_first_host():
    assert bridge_gateway({"Subnet": "172.17.0.0/16", "Gateway": "172.17.0.254"}) == "172.17.0.254"
    # a fresh dockerd that chose the address itself reports only the subnet
    assert bridge_gateway({"Subnet": "172.17.0.0/16"}) == "172.17.0.1"
    assert bridge_gateway({"Subnet": "10.9.8.0/24"}) == "10.9.8.1"
