"""The stack's venv: locked wheels, fetched once, installed offline and hash-checked."""
from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap

import pytest
import yaml
from harness.commands import rig, run
from harness.paths import BIN, CACHE, REPO
from harness.plays import Play, play

from rig.python.lock import read
from rig.python.venv_archive.manifest import kept_dir
from rig.python.wheelhouse import cached_path, wanted

pytestmark = pytest.mark.box

DEFAULT_LOCK = REPO / "stacks" / "sm120-sglang-0.5.23.lock"
INTERNAL = "rig-test-internal"  # a Docker network with no route out: boxes reach this machine only
# the wheels' path, where a test is about it: with the archive on, a later play would unpack what the first packed
WHEELS_ONLY = {"python_stack_archive": False}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """A small real stack (two pure-Python wheels and pip), locked against the index, with its own cache."""
    root = tmp_path_factory.mktemp("tiny")
    stack = root / "tiny.yml"
    stack.write_text(yaml.safe_dump({"name": "tiny", "python": "3.11", "cuda": {"version": "13.0.2"},
                                     "extra_packages": ["click==8.1.7", "packaging==24.1"]}))
    done = rig("lock", "--stack", str(stack))
    assert done.returncode == 0, done.stderr
    return {"stack": stack, "lock": stack.with_suffix(".lock"), "cache": root / "cache"}


def fetch_report(output: str) -> dict:
    """The wheelhouse fetch task's result, the engine's fields on it (a playbook run with -v prints it as YAML)."""
    match = re.search(r"TASK \[python_stack : Download the lock's wheels once[^\n]*\n[^\n]* => \n((?:    .*\n)+)", output)
    assert match, output[-4000:]
    return yaml.safe_load(textwrap.dedent(match.group(1)))


def test_three_boxes_download_every_wheel_once(start_box, tiny, monkeypatch):
    monkeypatch.setenv("RIG_CACHE", str(tiny["cache"]))
    boxes = [start_box() for _ in range(3)]
    first = play(boxes, "python.yml", "-v", python_stack_lock=str(tiny["lock"]), **WHEELS_ONLY).expect_ok()
    lock = read(tiny["lock"])
    sizes = sum(cached_path(tiny["cache"], w).stat().st_size for w in wanted(lock))
    report = fetch_report(first.output)
    assert report["fetched"] == len(lock["wheels"]) + 1 and report["bytes_downloaded"] == sizes  # and uv's wheel
    assert first.output.count("TASK [python_stack : Download the lock's wheels once") == 1
    assert first.output.count("TASK [python_stack : Serve the wheels over HTTP") == 1  # one server, three pulls
    for box in boxes:
        assert box.sh("/opt/rig/venv/bin/python -c 'import click; print(click.__version__)'").stdout.strip() == "8.1.7"
        assert box.sh("find / -xdev -name '*.whl' -o -name 'wheelhouse-*' -o -name '.rig-install-*'",
                      check=False).stdout == ""
        installer = "cat /opt/rig/venv/lib/python3.11/site-packages/click-8.1.7.dist-info/INSTALLER"
        assert box.sh(installer).stdout.strip() == "uv"  # the role's default installer, from the wheelhouse
    # a converged host first and a fresh one after it: the controller still serves the one that needs it
    fourth = start_box()
    again = play([boxes[0], fourth], "python.yml", "-v", python_stack_lock=str(tiny["lock"]), **WHEELS_ONLY).expect_ok()
    assert fetch_report(again.output)["bytes_downloaded"] == 0
    assert fourth.sh("/opt/rig/venv/bin/python -c 'import click; print(click.__version__)'").stdout.strip() == "8.1.7"


CLICK = "/opt/rig/venv/bin/python -c 'import click; print(click.__version__)'"
UNPACK = "Unpack the archive into the venv, pulled and checked while it streams"
WHEELS = "Install the lock into the venv, pulling its wheels"


def test_the_first_host_packs_the_venv_and_later_ones_unpack_it_checked(start_box, tiny, tmp_path, monkeypatch):
    """The venv archive (python_stack_archive): the first host installs the lock from its wheels and packs its
    venv, the controller keeps it; three fresh hosts at once then each pull it, check it and rename it into
    place, installing no wheel; an archive altered on the controller is refused, said, and the wheels go in."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("RIG_CACHE", str(cache))
    first = start_box()
    packed = play([first], "python.yml", python_stack_lock=str(tiny["lock"])).expect_ok()
    assert any(WHEELS in t for t in packed.changed_tasks(first.name)), packed.changed_tasks()
    manifests = list((cache / "venv-archive").glob("*/*.manifest.json"))
    assert len(manifests) == 1, manifests
    archive = manifests[0].with_name(manifests[0].name.replace(".manifest.json", ".tar.zst"))
    assert archive.stat().st_size > 0 and not first.exists("/var/cache/rig/venv-archive")

    boxes = [start_box() for _ in range(3)]
    pulled = play(boxes, "python.yml", python_stack_lock=str(tiny["lock"])).expect_ok()
    for box in boxes:
        changed = pulled.changed_tasks(box.name)
        assert any(UNPACK in t for t in changed) and not any(WHEELS in t for t in changed), pulled.output[-6000:]
        assert box.sh(CLICK).stdout.strip() == "8.1.7"
        assert run(["docker", "cp", str(manifests[0]), f"{box.name}:/tmp/venv.manifest.json"]).returncode == 0
        code, out, err = box.engine("venv", "verify", "--json", "--venv", "/opt/rig/venv",
                                    "--manifest", "/tmp/venv.manifest.json")
        assert code == 0 and json.loads(out)["ok"], out + err
        assert box.sh("find / -xdev -name '.venv.rig-*' -o -name '*.tar.zst*'", check=False).stdout == ""
    assert play(boxes[:1], "python.yml", python_stack_lock=str(tiny["lock"])).expect_ok().recap("changed") == 0

    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    last = start_box()
    refused = play([last], "python.yml", python_stack_lock=str(tiny["lock"])).expect_ok()
    assert "is not the archive its manifest describes" in refused.output, refused.output[-4000:]
    assert any(WHEELS in t for t in refused.changed_tasks(last.name)), refused.changed_tasks()
    assert last.sh(CLICK).stdout.strip() == "8.1.7"


def mirror_url(box, directory):
    """Serve DIRECTORY as a site mirror would (a separate server); yields the URL BOX reaches it at."""
    server = subprocess.Popen([str(BIN / "rig"), "wheelhouse", "serve", str(directory), "--foreground",
                               "--idle-exit", "300"], stdout=subprocess.PIPE, text=True)
    try:
        port = json.loads(server.stdout.readline())["port"]
        yield json.loads(rig("wheelhouse", "route", box.name, "--docker", "--port", str(port), "--json").stdout)["url"]
    finally:
        server.terminate()
        server.wait()


def test_hosts_pull_from_a_site_mirror_and_the_controller_downloads_nothing(start_box, tiny, tmp_path, monkeypatch):
    assert rig("wheelhouse", "fetch", str(tiny["lock"]), "--cache", str(tiny["cache"])).returncode == 0
    assert rig("wheelhouse", "export", str(tiny["lock"]), str(tmp_path / "mirror"), "--cache", str(tiny["cache"])
               ).returncode == 0
    empty = tmp_path / "controller-cache"
    monkeypatch.setenv("RIG_CACHE", str(empty))
    box, other = start_box(), start_box()
    for url in mirror_url(box, tmp_path / "mirror"):
        play([box], "python.yml", python_stack_lock=str(tiny["lock"]), python_stack_wheel_url=url, **WHEELS_ONLY).expect_ok()
    assert box.sh("/opt/rig/venv/bin/python -c 'import packaging; print(packaging.__version__)'").stdout.strip() == "24.1"
    assert not (empty / "wheels").exists()
    # a mirror serving other bytes: the installer's own wheel is checked against rig's pin before anything runs
    liar = tmp_path / "liar"
    liar.mkdir()
    for wheel in (tmp_path / "mirror").iterdir():
        (liar / wheel.name).write_bytes(b"not uv" if wheel.name.startswith("uv-") else wheel.read_bytes())
    for url in mirror_url(other, liar):
        refused = play([other], "python.yml", python_stack_lock=str(tiny["lock"]), python_stack_wheel_url=url, **WHEELS_ONLY)
    assert not refused.ok and "sha256 differs" in refused.output and not other.exists("/opt/rig/venv")


def test_a_wheel_altered_in_the_cache_is_never_installed(box, tiny, monkeypatch):
    monkeypatch.setenv("RIG_CACHE", str(tiny["cache"]))
    assert rig("wheelhouse", "fetch", str(tiny["lock"]), "--cache", str(tiny["cache"])).returncode == 0
    wheel = next(w for w in read(tiny["lock"])["wheels"] if w["name"] == "click")
    with open(cached_path(tiny["cache"], wheel), "ab") as handle:
        handle.write(b"tampered")
    done = box.play("python.yml", "-v", python_stack_lock=str(tiny["lock"]), **WHEELS_ONLY).expect_ok()
    assert fetch_report(done.output)["refetched"] == [wheel["filename"]]
    code, out, _ = box.engine("venv", "verify", "--json", "--venv", "/opt/rig/venv")
    assert code == 0 and json.loads(out)["ok"] and json.loads(out)["packages"] == 3


def test_an_altered_wheel_in_the_copied_wheelhouse_is_refused_at_install(box, tiny, tmp_path):
    rig("wheelhouse", "fetch", str(tiny["lock"]), "--cache", str(tiny["cache"]))
    house = tmp_path / "house"
    assert rig("wheelhouse", "export", str(tiny["lock"]), str(house), "--cache", str(tiny["cache"])).returncode == 0
    click_wheel = next(house.glob("click-*.whl"))
    os.unlink(click_wheel)  # a hard link into the cache: replace, never write through it
    click_wheel.write_bytes(b"PK\x05\x06" + b"\0" * 18)
    subprocess.run(["docker", "cp", str(house), f"{box.name}:/tmp/house"], check=True)
    code, _, err = box.engine("venv", "install", "--venv", "/opt/rig/venv", "--lock-hash",
                              read(tiny["lock"])["lock_hash"], "--python-version", "3.11", "--wheelhouse", "/tmp/house")
    assert code == 2 and "could not install the wheels" in err and "hash" in err.lower()
    assert not box.exists("/opt/rig/venv/.rig-stack.json")


def test_a_lock_for_another_python_stops_naming_both(box, tmp_path):
    stack = tmp_path / "py312.yml"
    stack.write_text(yaml.safe_dump({"name": "py312", "python": "3.12", "cuda": {"version": "13.0.2"},
                                     "extra_packages": ["click==8.1.7"]}))
    assert rig("lock", "--stack", str(stack)).returncode == 0
    bad = box.play("python.yml", python_stack_lock=str(stack.with_suffix(".lock")))
    assert not bad.ok
    assert "this host's python3 is 3.11, the stack's lock is for Python 3.12" in bad.output


def assert_doctor_read_what_it_passed(doctor: dict) -> None:
    """The default stack's doctor in a provisioned box: the kernel packages' SASS archs read for both of the
    stack's archs, the agreement checks read cudart, and no PASS says it could not look."""
    named = {c["name"]: c for c in doctor["checks"]}
    kernels = named["audit-sglang-kernel"]
    assert kernels["status"] == "pass", kernels
    assert "12.0a: cubin sm_120a" in kernels["detail"] and "9.0a: cubin sm_90a" in kernels["detail"], kernels
    toolkit = named["cuda-13.0-agreement"]
    assert toolkit["status"] == "pass" and re.search(r"\bcudart 13\b", toolkit["detail"]), toolkit
    agreement = named["cuda-agreement"]
    assert agreement["status"] == "pass" and agreement["detail"].startswith("torch's CUDA 13.0"), agreement
    looked_away = [f"{c['name']}: {c['detail']}" for c in doctor["checks"] if c["status"] == "pass" and
                   re.search(r"not read|unknown|skipped", c["detail"], re.I)]
    assert looked_away == []


def test_site_yml_with_the_default_stack_provisions_a_box_with_no_internet(start_box, tmp_path, monkeypatch):
    """End to end: CUDA, ldconfig and the locked venv, all from the controller's caches. The box is on an
    internal Docker network: it reaches the controller (whose wheelhouse it pulls from) and nothing else."""
    assert run(["docker", "network", "inspect", INTERNAL]).returncode == 0 or \
        run(["docker", "network", "create", "--internal", INTERNAL]).returncode == 0
    box = start_box(network=INTERNAL)
    assert box.sh("python3 -c 'import urllib.request as u; u.urlopen(\"http://1.1.1.1\", timeout=3)'",
                  check=False).returncode != 0  # truly no internet
    # the role's own path: the venv from the lock's archive where the controller keeps one (a host installed and
    # packed it, an earlier run's or this one's), else from the wheels, packed then; the default image's test, next
    # on this worker, builds from that archive (one install of the default stack per run, or none on a warm cache)
    dry = box.play("site.yml", "--check", "--diff").expect_ok()
    assert "would install lock" in dry.output and not box.exists("/opt/rig/venv")
    assert "/opt/rig/venv is not installed yet; the patches are planned once it is" in dry.output
    site = box.play("site.yml").expect_ok()
    took = [t for t in site.changed_tasks(box.name) if UNPACK in t or WHEELS in t]
    assert len(took) == 1, site.changed_tasks()
    kept = kept_dir(CACHE, read(DEFAULT_LOCK)["lock_hash"], "/opt/rig/venv")
    assert len(list(kept.glob("*.manifest.json"))) == len(list(kept.glob("*.tar.zst"))) == 1, took
    lock = {w["name"]: w["version"] for w in read(DEFAULT_LOCK)["wheels"]}
    versions = box.sh("/opt/rig/venv/bin/python -c 'import torch, sglang, importlib.metadata as m;"
                      " print(torch.__version__, m.version(\"torch\"), m.version(\"sglang\"),"
                      " m.version(\"sglang-kernel\"), m.version(\"flashinfer-python\"))'").stdout.split()
    assert versions[1:] == [lock["torch"], lock["sglang"], lock["sglang-kernel"], lock["flashinfer-python"]]
    assert versions[0] == lock["torch"] + "+cu130"  # the import itself says: a CUDA 13.0 build
    code, out, _ = box.engine("venv", "verify", "--json", "--venv", "/opt/rig/venv")  # no stack file in the box
    assert code == 0 and json.loads(out)["packages"] == len(lock)
    # doctor reads the kernel packages' archs itself: no cuobjdump anywhere in the box, so none on its PATH
    box.sh("find / -xdev -name cuobjdump \\( -type f -o -type l \\) -exec rm -f {} +")
    assert box.sh("command -v cuobjdump; find / -xdev -name cuobjdump", check=False).stdout == ""
    doctor = json.loads(rig("doctor", "--container", box.name, "--json").stdout)
    assert doctor["ok"] and {"layer": "python", "name": "venv", "status": "pass"}.items() <= \
        next(c for c in doctor["checks"] if c["layer"] == "python").items()
    assert_doctor_read_what_it_passed(doctor)
    patched = json.loads(box.engine("patch", "status", "--json", "--venv", "/opt/rig/venv")[1])["patches"]
    assert {r["id"]: r["status"] for r in patched if r["status"] in ("applied", "upstream")} == {
        "sglang-symm-mem-max-sizes-sm120": "applied", "sglang-symm-mem-multimem-sm120": "applied",
        "sglang-fusion-backend-sm120": "applied", "sglang-fusion-preflight-unicast": "applied",
        "sglang-kimi-k25-eagle3-delegation": "upstream", "flashinfer-trtllm-comm-sm120": "upstream"}
    # the stack's environment: a fresh venv interpreter has it, the system's python3 does not
    env_of = "-c 'import os; print(os.environ.get(\"CUDA_HOME\"), os.environ.get(\"NCCL_P2P_LEVEL\"))'"
    assert box.sh(f"env -i /opt/rig/venv/bin/python {env_of}").stdout.split() == ["/usr/local/cuda-13.0", "SYS"]
    assert box.sh(f"env -i /usr/bin/python3 {env_of}").stdout.split() == ["None", "None"]
    named = {c["name"]: c for c in doctor["checks"]}
    assert named["sitecustomize"]["status"] == named["triton-ptxas"]["status"] == "pass"
    assert "CUDA 13.0 ptxas" in named["triton-ptxas"]["detail"]
    again = box.play("site.yml").expect_ok()
    assert again.recap("changed") == 0
    check_server_role(box, tmp_path)
    # the role reverts, then --check --diff shows what it would patch and changes nothing
    lock_var = {"python_stack_lock": str(DEFAULT_LOCK)}
    assert box.play("patches.yml", **lock_var, sglang_patches_state="absent").expect_ok().recap("changed") == 1
    diff = box.play("patches.yml", "--check", "--diff", **lock_var).expect_ok()
    assert "+        12: [4, 6, 8],  # rig: SM120" in diff.output and diff.recap("changed") == 1
    unpatched = json.loads(box.engine("patch", "status", "--json", "--venv", "/opt/rig/venv")[1])["patches"]
    assert not [r for r in unpatched if r["status"] == "applied"]
    # wheel_build: this box (torch 2.14.1, CUDA 13) compiles the test extension; a second box
    # with no CUDA only installs what came back. A fresh controller cache, so the build happens.
    monkeypatch.setenv("RIG_CACHE", str(tmp_path / "cache"))
    other = start_box()
    tiny = REPO / "roles" / "python_stack" / "molecule" / "default" / "tiny.yml"
    inventory = tmp_path / "builders.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "community.docker.docker_api", "ansible_python_interpreter": "/usr/bin/python3",
                 "python_stack_serve_idle": 120},  # as every box inventory here: the server stops soon after
        "children": {"gpu_hosts": {"hosts": {box.name: None, other.name: None}},
                     "builders": {"hosts": {box.name: None}}}}}))
    wheels = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "playbooks" / "wheels.yml"), "-e",
              json.dumps({"rig_stack": str(tiny), "wheel_build_source": str(REPO / "tests" / "data" / "rig_scale_ext")})]
    built = Play.run(wheels).expect_ok()
    assert [t for t in built.changed_tasks(box.name) if "Build the wheel against" in t], built.changed_tasks()
    kept = list((tmp_path / "cache" / "built").glob("*/rig_scale_ext-0.1.0-*.whl"))
    assert len(kept) == 1
    audit = json.loads(kept[0].with_name(kept[0].name + ".audit.json").read_text())
    assert audit["ok"] and audit["archs"] == {"12.0a": "cubin sm_120a"} and audit["torch"] == lock["torch"]
    assert other.sh("/opt/rig/venv/bin/python -c 'import importlib.metadata as m; print(m.version(\"rig-scale-ext\"))'"
                    ).stdout.strip() == "0.1.0"
    assert not other.exists("/usr/local/cuda-13.0") and not box.exists("/var/cache/rig/wheel-build")
    assert Play.run(wheels).expect_ok().recap("changed") == 0



def check_server_role(box, tmp_path) -> None:
    """sglang_server on a converged box: no GPU stops it; install-only writes the unit, idempotently."""
    stack = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    stack["server"].update(model="/models/target", draft_model="/models/eagle3", cuda_graph_max_bs=250)
    served = tmp_path / "served.yml"
    served.write_text(yaml.safe_dump(stack))
    refused = box.play("server.yml", rig_stack=str(served))
    assert not refused.ok and "has no NVIDIA GPU" in refused.output and "nothing was installed" in refused.output
    assert box.sh("getent passwd sglang", check=False).returncode != 0
    install = {"rig_stack": str(served), "sglang_server_require_gpu": False, "sglang_server_start": False}
    unit_path = "/etc/systemd/system/sglang-server.service"
    dry = box.play("server.yml", "--check", "--diff", **install).expect_ok()
    assert "--cuda-graph-max-bs-decode 250" in dry.output and not box.exists(unit_path)
    box.play("server.yml", **install).expect_ok()
    unit = box.sh(f"cat {unit_path}").stdout
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_start.startswith("ExecStart=/opt/rig/venv/bin/python -m sglang.launch_server --model-path /models/target")
    for part in ("--speculative-algorithm EAGLE3", "--speculative-draft-model-path /models/eagle3",
                 "--cuda-graph-max-bs-decode 250", "--enable-flashinfer-allreduce-fusion", "--enable-torch-symm-mem",
                 "--tp-size 8", "--host 127.0.0.1"):
        assert part in exec_start
    for line in ("User=sglang", "TimeoutStartSec=1200", "Restart=on-failure"):
        assert line in unit.splitlines()
    assert "smoke --health-only --url http://127.0.0.1:30000" in unit
    account = box.sh("getent passwd sglang").stdout.strip().split(":")
    assert int(account[2]) < 1000 and account[6] == "/usr/sbin/nologin"
    # a key and the baseline in one play (each play renders with the box's sglang: 12.5 CPU-seconds)
    keyed = box.play("server.yml", **install, sglang_server_api_key="sk-test-5150", sglang_server_baseline=True
                     ).expect_ok()
    assert "sk-test-5150" not in keyed.output
    assert box.sh("stat -c '%a %U' /etc/rig/sglang-server.env").stdout.split() == ["600", "root"]
    unit = box.sh(f"cat {unit_path}").stdout
    assert "--api-key ${SGLANG_API_KEY}" in unit and "sk-test-5150" not in unit
    assert "--speculative" not in unit
    gate = next(line for line in unit.splitlines() if line.startswith("ExecStartPost="))
    assert "--pid $MAINPID" in gate  # the health gate stops waiting once the server has exited
    # server.model testmodel: the role writes the test model with the venv's torch, once
    stack["server"].update(model="testmodel", draft_model="testmodel")
    served.write_text(yaml.safe_dump(stack))
    box.play("server.yml", **install).expect_ok()
    unit = box.sh(f"cat {unit_path}").stdout
    assert "--model-path /var/lib/rig/testmodel/target" in unit
    assert "--speculative-draft-model-path /var/lib/rig/testmodel/draft" in unit
    made = json.loads(box.sh("cat /var/lib/rig/testmodel/testmodel.json").stdout)
    assert made["heads"] == 8 and made["spec"]["draft"] == "agree"  # tp 8 splits its heads
    assert box.sh("stat -c '%a' /var/lib/rig/testmodel/target/model.safetensors").stdout.strip() == "644"
    # install-only is idempotent, the unit and the test model alike (one repeat run: each renders for 12.5 s)
    assert box.play("server.yml", **install).expect_ok().recap("changed") == 0
