"""rig image build / verify: the default stack's image, built here from its lock with a real Docker engine."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from harness.commands import rig, run
from harness.images import in_image, prune
from harness.paths import CACHE, DEFAULT_LOCK, REPO
from packaging.utils import canonicalize_name

from rig.python.lock import read
from rig.python.venv_archive.manifest import FIXED_MTIME, kept_dir

pytestmark = pytest.mark.box

TOKEN = "tok-5bd1c0ffee-never-in-an-image"


def build(*args: str, env: dict | None = None) -> dict:
    done = rig("image", "build", "--json", *args, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(done.stdout)


def installed(tag: str) -> dict:
    """What the image holds: its SBOM's packages (name, version, wheel sha256 or None) and the applied patches."""
    sbom = json.loads(in_image(tag, "cat /opt/rig/sbom.cdx.json"))
    packages = sorted((c["name"], c["version"], (c.get("hashes") or [{}])[0].get("content"))
                      for c in sbom["components"])
    status = json.loads(in_image(tag, "python3 /opt/rig/rig.pyz patch status --json --venv /opt/rig/venv "
                                    "--patches /opt/rig/patches"))
    return {"packages": packages, "applied": sorted(r["id"] for r in status["patches"] if r["status"] == "applied")}


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def first(base_image, ca) -> dict:
    """The default stack's image, built once, as a site with its own CA and a token-bearing index URL builds
    it: every test reads this one image (a second 11.7 GB build would sit on the suite's longest path)."""
    os.environ.setdefault("RIG_BASE_IMAGE", base_image)
    env = {**os.environ, "SGLANG_API_KEY": TOKEN, "RIG_TORCH_CU130_INDEX": f"https://ci:{TOKEN}@index.invalid/"}
    # the site test, before this one on its worker, leaves the lock's venv archive in the controller's cache
    kept = list(kept_dir(CACHE, read(DEFAULT_LOCK)["lock_hash"], "/opt/rig/venv").glob("*.manifest.json"))
    result = build("--ca-cert", str(ca[1]), env=env)
    yield {**result, "content": installed(result["tag"]), "kept": kept}
    run(["docker", "rmi", "-f", result["tag"]])
    prune(DEFAULT_LOCK)


def test_the_default_stack_image_builds_and_verifies(first):
    lock = read(DEFAULT_LOCK)
    assert first["tag"] == f"rig/sm120-sglang-0.5.23:{lock['lock_hash'][:12]}"
    assert first["toolkit"] == "wheels" and first["compiled"] == []  # rig's toolkit; no source builds
    # the venv a host installed and compiled, not the wheels again, where the controller keeps its archive: its
    # files keep the archive's fixed time
    mtime = in_image(first["tag"], "stat -c %Y /opt/rig/venv/lib/python3.11/site-packages/torch/__init__.py").strip()
    if first["kept"]:
        assert first["venv_from"] == f"the controller's archive {first['kept'][0].with_suffix('').with_suffix('.tar.zst')}"
        assert mtime == str(FIXED_MTIME)
    else:
        assert first["venv_from"].startswith("the lock's wheels") and mtime != str(FIXED_MTIME), first["venv_from"]
    # its dry run, against the image just built from this lock: nothing to do, and nothing done
    again = json.loads(rig("image", "build", "--check", "--json").stdout)
    assert again["changed"] is False and again["tag"] == first["tag"] and "already built" in again["msg"]
    done = rig("image", "verify", first["tag"], "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    report = json.loads(done.stdout)
    checks = {c["name"]: c["status"] for c in report["doctor"]["checks"]}
    for name in ("cuda-13.0", "libnvrtc.so.13", "compile-sm_120a", "venv", "sitecustomize", "triton-ptxas"):
        assert checks[name] == "pass", report["doctor"]
    attrs = json.loads(run(["docker", "image", "inspect", first["tag"]]).stdout)[0]["Config"]
    versions = {w["name"]: w["version"] for w in lock["wheels"]}
    assert attrs["Labels"]["dev.rig.lock-hash"] == lock["lock_hash"]
    assert attrs["Labels"]["dev.rig.sglang"] == versions["sglang"] == "0.5.23"
    assert attrs["Labels"]["dev.rig.torch"] == versions["torch"]
    assert attrs["Labels"]["dev.rig.patches"].split(",") == first["content"]["applied"] == first["patches"]
    assert attrs["User"] == "sglang" and in_image(first["tag"], "id -u").strip() != "0"
    assert "smoke --health-only" in " ".join(attrs["Healthcheck"]["Test"])
    # exactly the lock's distributions, each at its locked version and so with its wheel's sha256 (the SBOM
    # names a hash only where the installed version is the lock's): any build of this lock holds the same
    held = {(canonicalize_name(n), v, h) for n, v, h in first["content"]["packages"]}
    assert held == {(canonicalize_name(w["name"]), w["version"], w["sha256"]) for w in lock["wheels"]}


def test_the_scan_finds_a_key_a_later_layer_deleted_and_a_needle_in_a_link(base_image, ca, tmp_path):
    key, _ = ca
    shutil.copyfile(key, tmp_path / "planted")
    (tmp_path / "Dockerfile").write_text(f"FROM {base_image}\nCOPY planted /planted\nRUN rm /planted && "
                                         "ln -s /nowhere-tok-5bd1c0ffee /pointer\n")
    tag = "rig-test/planted:1"
    assert run(["docker", "build", "-q", "-t", tag, str(tmp_path)]).returncode == 0
    try:
        found = scan_filesystem(tag, [pem_body(key).encode(), b"nowhere-tok-5bd1c0ffee"], tmp_path)
    finally:
        run(["docker", "rmi", "-f", tag])
    assert [f.rsplit("/", 1)[-1] for f in found[:-1]] == ["planted"], found
    assert found[-1] == "a path or link: b'nowhere-tok-5bd1c0ffee'"


def test_no_ca_private_material_tokens_or_secrets_in_history_or_filesystem(first, ca, tmp_path):
    key, cert = ca
    refused = rig("image", "build", "--ca-cert", str(key))
    assert refused.returncode == 2 and "not a PEM certificate (or holds a private key)" in refused.stderr
    # the first build had the CA and the token in its environment: the token, and stretches of the key's and
    # the certificate's base64 (a generic "PRIVATE KEY" marker would match the test keys and PEM parsers that
    # libraries in the venv ship), must be nowhere in its history, its config or its files
    needles = [TOKEN.encode(), *(pem_body(path).encode() for path in (key, cert))]
    history = run(["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", first["tag"]]).stdout
    assert history and not [n for n in needles if n.decode() in history]
    assert not [n for n in needles if n.decode() in run(["docker", "image", "inspect", first["tag"]]).stdout]
    found = scan_filesystem(first["tag"], needles, tmp_path)
    assert found == [], f"found in the image's files: {found}"


def pem_body(path) -> str:
    """A whole line from the middle of PATH's base64: found in a copy of the file as it is (a stretch across a
    line break would not be), and past the header bytes every key of its kind shares."""
    body = path.read_text().splitlines()[1:-1]
    return body[len(body) // 2]


def make_ca(tmp_path):
    """A throwaway CA: its key (which must never reach an image) and its certificate."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rig test CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now)
                   .not_valid_after(now + datetime.timedelta(days=2))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(private, hashes.SHA256()))
    key, cert = tmp_path / "ca.key", tmp_path / "ca.crt"
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return key, cert


def scan_filesystem(tag: str, needles: list[bytes], tmp_path) -> list[str]:
    """Every file of every layer of TAG (overlay2's layer directories: also what a later layer deleted), and every
    path and link target, searched for each needle; what holds one."""
    driver = json.loads(run(["docker", "image", "inspect", "--format", "{{json .GraphDriver}}", tag]).stdout) or {}
    data = driver.get("Data") or {}
    layers = [layer for layer in [data.get("UpperDir"), *data.get("LowerDir", "").split(":")] if layer]
    assert driver.get("Name") == "overlay2" and all(os.access(layer, os.R_OK) for layer in layers), \
        f"the scan reads the image's overlay2 layer directories: a local engine with overlay2, as root " \
        f"(scripts/ensure-docker.sh starts one); this engine gave {driver}"
    patterns = tmp_path / "needles"
    patterns.write_bytes(b"\n".join(needles) + b"\n")
    # one pass over the bytes for every needle; devices (overlay2's whiteouts), FIFOs and sockets skipped
    grep = run(["grep", "-rlFZ", "-D", "skip", "-f", str(patterns), *layers], text=False,
               env={**os.environ, "LC_ALL": "C"})
    assert grep.returncode in (0, 1), grep.stderr  # 1: no file matched; 2: a layer could not be read
    names = run(["find", *layers, "-printf", "%p\\0%l\\0"], check=True, text=False).stdout
    return [path.decode(errors="replace") for path in grep.stdout.split(b"\0") if path] + \
        [f"a path or link: {n!r}" for n in needles if n in names]


def test_a_patch_only_change_rebuilds_only_the_last_layers(first, tmp_path):
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "rig" / "patches" / "set", patches)
    (patches / "sglang-fusion-preflight-unicast.yml").unlink()
    result = build("--patches", str(patches))
    steps = {s["step"]: s["cached"] for s in result["steps"]}
    heavy = [k for k in steps if any(f"{what} install" in k for what in ("cuda", "venv", "env")) or "venv add" in k]
    assert len(heavy) == 4 and all(steps[k] for k in heavy), steps
    # measured against the first image, not against the engine's cache (which may hold this same build from an
    # earlier run): every layer is the first image's except the last two, COPY patches/ and patch apply
    before, after = (json.loads(run(["docker", "image", "inspect", image]).stdout)[0]["RootFS"]["Layers"]
                     for image in (first["id"], result["id"]))
    assert len(after) == len(before) and after[:-2] == before[:-2]
    assert after[-2] != before[-2] and after[-1] != before[-1]
    assert "sglang-fusion-preflight-unicast" not in result["patches"] and len(result["patches"]) == 3
    verified = json.loads(rig("image", "verify", result["tag"], "--json").stdout)
    assert verified["ok"] and "sglang-fusion-preflight-unicast" not in {
        r["id"] for r in verified["patches"] if r["status"] == "applied"}
