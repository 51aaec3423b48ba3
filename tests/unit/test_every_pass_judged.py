"""Every PASS is earned: a check that could not look says WARN (or skip) with why. Doctor's venv told apart as
installed by rig, adopted (not installed by rig, matching the lock's pins) or differing; cudart's release read
from its soname; and a sweep over doctor's and the audit's checks on constructed inputs (toolkit trees in each
layout, venvs with real dist-info metadata, objects with and without device code rig can read) that holds no
check to PASS with "not read", "unknown" or "skipped" in its detail."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from harness.elf import PTX, entry, fatbin, with_section
from harness.toolkits import toolkit

from rig.core.check import Check
from rig.cuda import agreement
from rig.kernels.audit import as_check, audit_path
from rig.machine import doctor
from rig.python.venv import MARKER

LOCK = {"lock_hash": "cd" * 32, "wheels": [
    {"name": "torch", "version": "2.14.1", "sha256": "01" * 32, "filename": "torch-2.14.1-cp311-none-any.whl"},
    {"name": "sglang", "version": "0.5.23", "sha256": "02" * 32, "filename": "sglang-0.5.23-py3-none-any.whl"},
    {"name": "nvidia-cuda-runtime", "version": "13.0.96", "sha256": "03" * 32,
     "filename": "nvidia_cuda_runtime-13.0.96-py3-none-any.whl"}]}


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("venvs") / "base"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv


def venv_holding(bare: Path, where: Path, dists: dict[str, str]) -> Path:
    """A venv whose site-packages holds DISTS (name -> version) as real dist-info directories, which the venv's
    own Python reads through importlib.metadata; no wheel is installed."""
    import shutil

    venv = where / "venv"
    shutil.copytree(bare, venv, symlinks=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    for name, version in dists.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return venv


def test_a_venv_rig_did_not_install_is_adopted_when_it_matches_the_lock_and_fails_naming_each_difference(
        bare_venv, tmp_path):
    pins = {w["name"]: w["version"] for w in LOCK["wheels"]}
    adopted = venv_holding(bare_venv, tmp_path / "adopted", {**pins, "machine-extra": "1.0"})
    check = doctor._venv(str(adopted), LOCK)
    assert check.status == "warn" and "adopted" in check.detail and "3 distributions match lock cdcdcdcdcdcd" \
        in check.detail
    # as over an NGC-style container's own torch: another torch, and sglang not there at all
    differing = venv_holding(bare_venv, tmp_path / "ngc", {"torch": "2.9.0a0+nv25.10", "nvidia-cuda-runtime": "13.0.96"})
    check = doctor._venv(str(differing), LOCK)
    assert check.status == "fail"
    assert check.problems == [f"{differing}: sglang: wanted 0.5.23, found not installed",
                              f"{differing}: torch: wanted 2.14.1, found 2.9.0a0+nv25.10"]
    assert "(not installed by rig) differs from lock cdcdcdcdcdcd" in check.detail
    # installed by rig: its marker is what it is held to, and the same venv passes
    (adopted / MARKER).write_text(json.dumps({"lock_hash": "cd" * 32, "packages": [f"{n}=={v}" for n, v in
                                                                                   pins.items()]}))
    assert doctor._venv(str(adopted), LOCK).status == "pass"
    assert doctor._venv(str(adopted)).status == "pass"
    # no marker and no lock: nothing to hold it to, so not judged, and never a pass
    nothing = doctor._venv(str(differing))
    assert nothing.status == "warn" and "not judged" in nothing.detail
    assert doctor._venv(str(tmp_path / "missing"), LOCK).status == "fail"


@pytest.mark.parametrize("files, said", [
    (["libcudart.so.13"], "13"),                         # NVIDIA's wheels: the soname alone
    (["libcudart.so.13.0.96", "libcudart.so.13"], "13.0"),  # the runfile's: the full release says more
    (["libcudart.so.12"], "12"),
    ([], None),
])
def test_cudart_says_its_release_by_its_file_and_soname(tmp_path, files, said):
    tree = toolkit(tmp_path, "13.0", 13000, None)
    for name in files:
        (tree / "lib64" / name).write_bytes(b"\x7fELF")
    assert agreement.runtime_release(tree) == said
    check = doctor._toolkit_agreement(tree)
    assert check.status == {"13": "pass", "13.0": "pass", "12": "fail", None: "warn"}[said]
    if said is None:
        assert "cudart not read: lib64 holds no libcudart.so.* file" in check.detail
    if said == "12":
        assert "cudart 12" in check.detail


def judged_checks(tmp_path: Path, bare_venv: Path) -> list[Check]:
    """What doctor and the audit say about constructed inputs that reach every branch of theirs that could
    fail to look."""
    checks: list[Check] = []
    for name, nvcc, headers, cudart in (("wheels", "13.0", 13000, None), ("runfile", "13.0", 13000, "13.0.96"),
                                        ("bare", None, None, None), ("no-cudart", "13.0", 13000, None)):
        tree = toolkit(tmp_path / name, nvcc, headers, cudart)
        if name == "wheels":
            (tree / "lib64" / "libcudart.so.13").write_bytes(b"\x7fELF")
        checks += doctor.run("13.0", ["12.0a"], prefix=str(tree.parent))
    pins = {w["name"]: w["version"] for w in LOCK["wheels"]}
    for name, dists in (("adopted", pins), ("no-runtime", {"torch": "2.14.1", "sglang": "0.5.23"})):
        venv = venv_holding(bare_venv, tmp_path / name, dists)
        checks.append(doctor._venv(str(venv), LOCK))
        good = toolkit(tmp_path / f"{name}-home", "13.0", 13000, "13.0.96")
        for environ in ({"CUDA_HOME": str(good)}, {}):
            checks.append(doctor._agreement(str(venv), {"environ": environ}))
    host = Path(__import__("_ctypes").__file__).read_bytes()
    for name, body in (("sass", fatbin(entry(2, 120, b"(\xb5/\xfd", 0x108011))), ("ptx", fatbin(entry(1, 90, PTX))),
                       ("lto", fatbin(entry(4, 120, b"ir"))), ("host", None)):
        (tmp_path / "objects" / name).mkdir(parents=True)
        (tmp_path / "objects" / name / "ops.so").write_bytes(with_section(host, b".nv_fatbin", body) if body else host)
        report = audit_path(str(tmp_path / "objects" / name), {}, {"cuda_major": 13, "archs": ["12.0a"],
                                                                    "torch": None, "extra_dirs": [],
                                                                    "resolve": False})
        checks.append(as_check(report))
    return checks


UNJUDGED = re.compile(r"not read|unknown|skipped", re.I)


def test_no_check_passes_on_what_it_could_not_read(tmp_path, bare_venv):
    checks = judged_checks(tmp_path, bare_venv)
    passed = [f"{c.layer} {c.name}: {c.detail}" for c in checks if c.status == "pass" and UNJUDGED.search(c.detail)]
    assert passed == []
    # the sweep reaches the branches that could not look, and they say so
    said = [c.detail for c in checks if c.status == "warn"]
    assert any("cudart not read" in d for d in said) and any("torch's CUDA not read" in d for d in said)
    assert any("adopted" in d for d in said) and any("no SASS or PTX entry rig reads" in d for d in said)
    assert any(c.status == "pass" and c.name.endswith("-agreement") and "cudart 13" in c.detail for c in checks)
