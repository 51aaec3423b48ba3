"""Parts of `rig image build` that need no Docker engine: the address the build reaches
the wheelhouse on, the tag and the labels."""
from conftest import DEFAULT_LOCK, REPO

from rig.image import labels, tag_for
from rig.python.lock import read
from rig.python.wheel_serving import bridge_gateway
from rig.stack.spec import load


def test_the_gateway_is_the_configured_one_or_the_subnets_first_host():
    assert bridge_gateway({"Subnet": "172.17.0.0/16", "Gateway": "172.17.0.254"}) == "172.17.0.254"
    # a fresh dockerd that chose the address itself reports only the subnet
    assert bridge_gateway({"Subnet": "172.17.0.0/16"}) == "172.17.0.1"
    assert bridge_gateway({"Subnet": "10.9.8.0/24"}) == "10.9.8.1"


def test_the_tag_and_labels_come_from_the_lock():
    stack, lock = load(str(REPO / "stacks" / "default.yml")), read(DEFAULT_LOCK)
    assert tag_for(stack, lock) == f"rig/{stack['name']}:{lock['lock_hash'][:12]}"
    meta = labels(stack, lock, ["a", "b"])
    assert meta["dev.rig.lock-hash"] == lock["lock_hash"]
    assert meta["dev.rig.patches"] == "a,b"
    assert meta["dev.rig.sglang"] == stack["sglang"]["version"]
