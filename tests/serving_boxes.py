"""Boxes that serve: systemd boxes with the SGLang stand-in (tests/sglang_api_server.py) as the venv's sglang,
for the tests of server.yml, prove.yml and upgrade.yml, and a load that keeps requests in flight on them."""
from __future__ import annotations

import contextlib
import json
import os
import re
import threading

import yaml
from harness.boxes import box_exec
from harness.commands import run
from harness.paths import REPO
from sglang_api_server import RATE as STANDIN_RATE

UNIT = "/etc/systemd/system/sglang-server.service"
SITE = "/opt/rig/venv/lib/python3.11/site-packages"
HEALTH = ("python3 -c \"import urllib.request, urllib.error\ntry: print(urllib.request.urlopen("
          "'http://127.0.0.1:30000/health', timeout=5).status)\nexcept urllib.error.HTTPError as e: print(e.code)\n"
          "except OSError: print('down')\"")
def serving_box(start_box, standin_site: str, faults: list[str] | None = None):
    """A systemd box with the stand-in as the venv's sglang and a model directory."""
    box = start_box(systemd=True)
    box.sh("python3 -m venv --without-pip /opt/rig/venv && mkdir -p /models/target /models/draft && "
           "echo '{}' > /models/target/config.json && echo '{}' > /models/draft/config.json")
    for src in (f"{standin_site}/.", f"{REPO}/tests/data/sglang_standin/sglang",
                f"{REPO}/tests/data/sglang_standin/sglang-0.5.23+standin.dist-info", f"{REPO}/tests/sglang_api_server.py"):
        assert run(["docker", "cp", src, f"{box.name}:{SITE}/"]).returncode == 0
    if faults:
        box.sh(f"echo '{json.dumps({'args': faults})}' > /etc/sglang-standin.json")
    return box


def stack_file(tmp_path, name: str, steps: int):
    stack = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    stack["server"].update(model="/models/target", draft_model="/models/draft", speculative_num_steps=steps)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(stack))
    return str(path)


def main_pid(box) -> str:
    return box.sh("systemctl show -p MainPID --value sglang-server").stdout.strip()



def numerics_models(box) -> str:
    """What rig testmodel --kind numerics leaves that the stand-in reads: its record (the rule) and configs.
    The weights need torch, which these boxes lack; the stand-in serves the rule from the record."""
    from rig.serving import numerics, testmodel

    root = "/var/lib/rig/prove-models"
    spec = {"kind": "numerics", "draft": "numerics", "seed": 0, "heads": testmodel.HEADS, "rule": numerics.table()}
    record = json.dumps({"spec": spec})  # the fields rig's own record carries (testmodel.made_by_rig reads them)
    box.sh(f"mkdir -p {root}/target {root}/draft && echo '{{}}' > {root}/target/config.json && "
           f"echo '{{}}' > {root}/draft/config.json && cat > {root}/testmodel.json <<'EOF'\n{record}\nEOF")
    return root


# One streamed request inside a box (argv: tokens, the server's URL, seconds to wait for health), its outcome as
# one JSON line: refused (no answer, or 503 while draining, for that long), or accepted and then how many tokens
# came and why it ended (cut: the stream broke off). As a load balancer does, it sends only to a server whose
# health answers 200: a draining server finishes what it has. The wait for health is in the process: a Python
# start per request, not one every half second while a box drains and restarts.
WAIT = 5
URL = "http://127.0.0.1:30000"
ONE_REQUEST = """import http.client, json, sys, time, urllib.request
n, url, wait, hold = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4:] == ["hold"]
deadline = time.monotonic() + wait
while True:
    try:
        urllib.request.urlopen(url + "/health", timeout=max(0.1, min(5, deadline - time.monotonic())))
        break
    except OSError as exc:
        if time.monotonic() >= deadline:
            sys.exit(print(json.dumps({"accepted": False, "why": str(exc)})))
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": n}, "stream": True,
                  "rig_test": {"hold_until_drain": hold}}).encode()
req = urllib.request.Request(url + "/generate", body, {"Content-Type": "application/json"})
try:
    answer = urllib.request.urlopen(req, timeout=1800 if hold else 30)  # held: silent until the next drain
except OSError as exc:
    sys.exit(print(json.dumps({"accepted": False, "why": str(exc)})))
last, cut = None, None
try:  # each chunk repeats the whole output so far (as SGLang streams it): only the last one is read
    for line in answer:
        if line.startswith(b"data: {") and line.endswith(b"\\n"):  # whole lines: a cut can end in half of one
            last = line
except (OSError, http.client.HTTPException) as exc:  # a stream that broke off (IncompleteRead among them)
    cut = repr(exc)
meta = json.loads(last[6:]).get("meta_info", {}) if last else {}  # an error chunk has none: a short count
print(json.dumps({"accepted": True, "tokens": meta.get("completion_tokens", 0), "cut": cut}))
"""


class Load:
    """STREAMS streamed requests of TOKENS tokens kept in flight on each box until the block ends, every outcome
    kept by box. Each request runs inside its box (docker exec), so a box's reboot ends requests, not the load.

    A box's streams start spread over one request's time, and its first stream's requests are held by the stand-in
    until the server drains ("hold_until_drain"): however slow the machine, a drain finds one in flight (requests
    of one length, with a docker exec and a Python start between them, could all be between requests then)."""

    def __init__(self, boxes, tokens: int, streams: int = 2):
        self.boxes, self.tokens, self.streams = boxes, tokens, streams
        self.outcomes: dict[str, list[dict]] = {box.name: [] for box in boxes}
        self.stop = threading.Event()
        spread = tokens / STANDIN_RATE / streams
        self.threads = [threading.Thread(target=self._keep, args=(box, k * spread, k == 0), daemon=True)
                        for box in boxes for k in range(streams)]

    def _keep(self, box, after: float, hold: bool) -> None:
        self.stop.wait(after)
        while not self.stop.is_set():
            done = box_exec(box.name, ["python3", "-c", ONE_REQUEST, str(self.tokens), URL, str(WAIT),
                                       "hold" if hold else "go"])
            lines = done.stdout.strip().splitlines()
            outcome = json.loads(lines[-1]) if done.returncode == 0 and lines else {"accepted": False, "why": "no box"}
            self.outcomes[box.name].append(outcome)
            if not outcome["accepted"]:
                self.stop.wait(0.5)

    def __enter__(self) -> "Load":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.stop.set()
        for k, thread in enumerate(self.threads):
            if k % self.streams:  # a held request waits for the next drain: its thread is left to it (a daemon)
                thread.join(timeout=120)

    def cut_short(self, box) -> list[dict]:
        """The requests BOX accepted and did not finish whole."""
        return [o for o in self.outcomes[box.name] if o["accepted"] and (o["cut"] or o["tokens"] != self.tokens)]


def drains(box) -> list[int]:
    """The requests in flight at each drain of BOX's server, from its log (as SGLang logs them)."""
    log = box.sh("cat /var/log/rig/sglang-server.log", check=False).stdout
    return [int(n) for n in re.findall(r"Gracefully exiting\.\.\. Remaining number of requests (\d+)", log)]


# playbooks/upgrade.yml's boxes (test_upgrade, test_upgrade_stack): the stand-in NVIDIA repository's two drivers
OLD, NEW = "580.159.04-1", "580.200.00-1"
DRIVER = "nvidia-driver-580-open"
FABRIC = "nvidia-fabricmanager-580"
CDI = "/etc/cdi/nvidia.yaml"
UPGRADE_SETTINGS = {
    "nvidia_driver_repo_url": "file:///srv/nvidia/repo", "nvidia_driver_keyring_url": "file:///srv/nvidia/key.gpg",
    "nvidia_driver_pci_root": "/srv/fake/pci",  # a GPU and an NVSwitch: the fabric manager goes with the driver
    "nvidia_driver_module_version_path": "/srv/fake/module-version",
    "nvidia_driver_allow_reboot": True,
    # a container shares its host's boot_id and has no logind for shutdown(8): systemd reboots it, and PID 1's
    # start time tells one boot from the next
    "nvidia_driver_reboot_command": "systemctl reboot",
    "nvidia_driver_boot_time_command": "cut -d' ' -f22 /proc/1/stat", "nvidia_driver_reboot_timeout": 300,
    # and answers docker exec as soon as PID 1 runs, before the boot's units (the stand-in module's among them):
    # back once systemd has no boot job left, as a host is once sshd answers
    "nvidia_driver_reboot_test_command": "systemctl is-system-running | grep -qxE 'running|degraded'",
    "nvidia_container_toolkit_mode": "cdi", "nvidia_container_toolkit_manage_services": False,
    "sglang_server_require_gpu": False, "sglang_server_start_timeout": 120,
    "rig_upgrade_doctor": False,  # the machine layer reads nvidia-smi, which no box has
    # the driver's tests (their stack is not locked); the last test takes the toolkit and the venv through
    "rig_upgrade_toolkit": False, "rig_upgrade_stack": False,
    # the boxes' stand-in venv has no torch to write test models with: the numerics model is written beside it
    # (rig_prove_models), the agreeing one for acceptance nowhere
    "rig_prove_skip": ["doctor", "testmodel", "acceptance"],
}


def versions(box) -> dict:
    """Each driver package's installed version and dpkg selection. Every package dpkg knows is listed (a query
    by name exits 1 for one it does not, as a box that could not run the command does): a box that did not
    answer fails here, with its reason."""
    out = box.sh("dpkg-query -W -f='${Package} ${Version} ${db:Status-Want}\\n'").stdout
    wanted = (DRIVER, FABRIC, "nvidia-container-toolkit")
    rows = (line.split() for line in out.splitlines())
    return {row[0]: tuple(row[1:]) for row in rows if row and row[0] in wanted}


@contextlib.contextmanager
def driver_fleet(systemd_image, standin_site, tmp_path, count: int, loop: bool = False):
    """COUNT boxes serving the stand-in on driver OLD, its module loaded, a CDI spec of OLD's libraries: the
    signed stand-in NVIDIA repository in both versions (tests/nvidia_repo.py), bare-metal.yml and server.yml
    run; (boxes, the upgrade settings with the stack and the numerics models). LOOP: the boxes can loop-mount (a
    venv image)."""
    from harness.boxes import new_box, remove_boxes
    from harness.plays import play

    started: list = []

    def start(systemd: bool):
        started.append(new_box(systemd_image, systemd=systemd, loop=loop))
        return started[-1]

    try:
        boxes = [serving_box(start, standin_site) for _ in range(count)]
        os.environ["MOLECULE_EPHEMERAL_DIRECTORY"] = str(tmp_path)  # where the prepare play builds the repository
        try:
            play(boxes, "../tests/molecule/prepare-nvidia-repo.yml").expect_ok()
        finally:
            del os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]
        models = [numerics_models(box) for box in boxes][0]  # the same path on each
        settings = {**UPGRADE_SETTINGS, "rig_stack": stack_file(tmp_path, "stack.yml", 2), "rig_prove_models": models}
        play(boxes, "bare-metal.yml", nvidia_driver_version=OLD, **settings).expect_ok()
        play(boxes, "server.yml", rig_rollout_batch=count, **settings).expect_ok()  # a first start: nothing to roll
        for box in boxes:
            assert versions(box)[DRIVER] == (OLD, "hold") and box.sh(HEALTH).stdout.strip() == "200"
            assert "libcuda.so.580.159.04" in box.sh(f"cat {CDI}").stdout
        yield boxes, settings
    finally:
        remove_boxes(started)
