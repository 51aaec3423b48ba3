"""Parts of `rig image build` that need no Docker engine: the tag and the labels, the CA secret, the wheels
taken back from the builder, the venv archive it takes, the BuildKit client rig picks and the steps it reads
from BuildKit's progress."""
from __future__ import annotations

import json
import os
import stat

import pytest
from harness.paths import DEFAULT_LOCK, REPO

from rig.core import RigError
from rig.engine import buildkit
from rig.image import _take_back, ca_bundle, kept_venv, labels, tag_for
from rig.python.lock import read
from rig.python.venv_archive.manifest import FORMAT, archive_name, kept_dir
from rig.stack.spec import load

CERT = "-----BEGIN CERTIFICATE-----\nMIIBcert\n-----END CERTIFICATE-----\n"
# BuildKit's plain progress of a build (docker 20.10), cut down: an internal vertex, a cached step, a step
# that ran and printed, and a vertex named again when its output resumed
PROGRESS = """#1 [internal] load build definition from Dockerfile
#1 DONE 0.0s
#4 [stack 1/5] FROM docker.io/library/rig-base:bookworm
#4 DONE 0.0s
#6 [stack 4/5] RUN python3 /opt/rig/rig.pyz venv install --venv /opt/rig/venv
#6 CACHED
#9 [runtime 7/8] RUN python3 /opt/rig/rig.pyz patch apply --venv /opt/rig/venv
#9 0.512 rig: applying sglang-fusion-preflight-unicast
#10 [runtime 8/8] COPY env.json /opt/rig/env.json
#9 [runtime 7/8] RUN python3 /opt/rig/rig.pyz patch apply --venv /opt/rig/venv
#9 1.020 rig: applied
#9 DONE 1.1s
#10 CACHED
#11 exporting to image
""".splitlines()


def test_the_steps_are_the_dockerfiles_in_start_order_each_cached_or_run():
    assert buildkit.steps_of(PROGRESS) == [
        {"step": "[stack 1/5] FROM docker.io/library/rig-base:bookworm", "cached": False},
        {"step": "[stack 4/5] RUN python3 /opt/rig/rig.pyz venv install --venv /opt/rig/venv", "cached": True},
        {"step": "[runtime 7/8] RUN python3 /opt/rig/rig.pyz patch apply --venv /opt/rig/venv", "cached": False},
        {"step": "[runtime 8/8] COPY env.json /opt/rig/env.json", "cached": True}]


def fake_docker(directory, code: int):
    directory.mkdir()
    docker = directory / "docker"
    docker.write_text(f"#!/bin/sh\necho \"$DOCKER_BUILDKIT $DOCKER_HOST $BUILDX_BUILDER $*\" >> {directory}/calls\n"
                      f"exit {code}\n")
    docker.chmod(0o755)
    return docker


def test_the_client_is_the_first_on_path_whose_build_speaks_buildkit(tmp_path, monkeypatch):
    refusing = fake_docker(tmp_path / "new-without-buildx", 1)  # Docker 23+ with no buildx refuses at once
    speaking = fake_docker(tmp_path / "debian-20.10", 0)
    monkeypatch.setenv("PATH", f"{refusing.parent}{os.pathsep}{speaking.parent}")
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv("BUILDX_BUILDER", "remote-cluster")
    buildkit.cli.cache_clear()
    try:
        assert buildkit.cli() == str(speaking)
        # asked with BuildKit on, of the engine docker-py reads (not the CLI's context) and its own builder
        assert (refusing.parent / "calls").read_text() == "1 unix:///var/run/docker.sock default build --help\n"
        monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
        buildkit.cli.cache_clear()
        buildkit.cli()
        assert (refusing.parent / "calls").read_text().splitlines()[-1] == "1 tcp://127.0.0.1:2375 default build --help"
        monkeypatch.setenv("PATH", str(refusing.parent))
        buildkit.cli.cache_clear()
        with pytest.raises(RigError, match="no Docker client on PATH builds with BuildKit.*ensure-docker.sh"):
            buildkit.cli()
    finally:
        buildkit.cli.cache_clear()


def test_the_ca_secret_holds_only_checked_certificates_readable_by_its_owner(tmp_path):
    cert, key = tmp_path / "ca.crt", tmp_path / "ca.key"
    cert.write_text(CERT)
    key.write_text(CERT + "-----BEGIN PRIVATE KEY-----\nMIIkey\n-----END PRIVATE KEY-----\n")
    assert ca_bundle([], tmp_path / "none.crt") is None and not (tmp_path / "none.crt").exists()
    joined = ca_bundle([str(cert), str(cert)], tmp_path / "secret.crt")
    assert joined.read_text() == CERT + CERT and stat.S_IMODE(joined.stat().st_mode) == 0o600
    with pytest.raises(RigError, match="ca.key is not a PEM certificate"):
        ca_bundle([str(cert), str(key)], tmp_path / "refused.crt")
    assert not (tmp_path / "refused.crt").exists()


def test_only_the_missing_keys_wheels_and_audits_come_back_from_the_builder(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    (out / "k1" / "nested").mkdir(parents=True)
    (out / "k1" / "a-0.1-cp311-linux_x86_64.whl").write_bytes(b"wheel")
    (out / "k1" / "a-0.1-cp311-linux_x86_64.whl.audit.json").write_text("{}")
    (out / "k1" / "notes.txt").write_text("not a wheel or its audit")
    (out / "k1" / "nested" / "deep.whl").write_bytes(b"too deep")
    (tmp_path / "elsewhere").write_text("not the builder's")
    (out / "k1" / "link.whl").symlink_to(tmp_path / "elsewhere")
    (out / "k2").symlink_to(out / "k1")
    (out / "other-lock").mkdir()  # a build's own script wrote under another lock's key
    (out / "other-lock" / "evil-1.0-py3-none-any.whl").write_bytes(b"planted")
    (out / "stray.whl").write_bytes(b"no key")
    _take_back(out, ["k1", "k2", "k3"], cache)
    assert sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) == \
        ["built", "built/k1", "built/k1/a-0.1-cp311-linux_x86_64.whl", "built/k1/a-0.1-cp311-linux_x86_64.whl.audit.json"]


@pytest.mark.parametrize("where", ["output", "secret"])
def test_a_path_the_docker_cli_would_split_is_refused_before_any_build(tmp_path, monkeypatch, where):
    docker = fake_docker(tmp_path / "bin", 0)
    monkeypatch.setenv("PATH", str(docker.parent))
    buildkit.cli.cache_clear()
    odd = tmp_path / "a,dest=elsewhere"
    try:
        with pytest.raises(RigError, match="a comma or a quote cannot be handed to `docker build`"):
            buildkit.build(tmp_path, "runtime", **({"output": odd} if where == "output" else
                                                  {"tag": "t", "secrets": {"rig-ca": odd}}))
    finally:
        buildkit.cli.cache_clear()
    assert not (docker.parent / "calls").exists()  # refused before Docker was asked anything


def test_the_tag_and_labels_come_from_the_lock():
    stack, lock = load(str(REPO / "stacks" / "default.yml")), read(DEFAULT_LOCK)
    assert tag_for(stack, lock) == f"rig/{stack['name']}:{lock['lock_hash'][:12]}"
    meta = labels(stack, lock, ["a", "b"])
    assert meta["dev.rig.lock-hash"] == lock["lock_hash"]
    assert meta["dev.rig.patches"] == "a,b"
    assert meta["dev.rig.sglang"] == stack["sglang"]["version"]


def test_a_build_relays_its_steps_and_a_failed_one_names_its_target_and_the_end_of_its_output(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    # `build --help` answers (BuildKit spoken); a build prints PROGRESS, then exits with $RIG_FAKE_EXIT
    (tmp_path / "progress").write_text("\n".join(PROGRESS) + "\n")
    docker.write_text(f'#!/bin/sh\n[ "$2" = --help ] && exit 0\necho "$*" > {tmp_path}/argv\n'
                      f'/bin/cat {tmp_path}/progress\necho "ERROR: process did not complete successfully"\n'
                      'exit "${RIG_FAKE_EXIT:-0}"\n')
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    buildkit.cli.cache_clear()
    try:
        steps = buildkit.build(tmp_path, "runtime", tag="rig/x:1", args={"BASE": "b"}, labels={"dev.rig.k": "v"})
        assert steps == buildkit.steps_of(PROGRESS) and len(steps) == 4
        argv = (tmp_path / "argv").read_text().split()
        assert argv[-2:] == ["--", str(tmp_path.resolve())] and "--no-cache" not in argv
        assert ["--tag", "rig/x:1"] == argv[argv.index("--tag"):argv.index("--tag") + 2]
        assert "BASE=b" in argv and "dev.rig.k=v" in argv
        monkeypatch.setenv("RIG_FAKE_EXIT", "1")
        with pytest.raises(RigError, match=r"\(target wheels\) failed:(.|\n)*process did not complete successfully"):
            buildkit.build(tmp_path, "wheels", output=tmp_path / "out", no_cache=True)
        assert "--no-cache" in (tmp_path / "argv").read_text().split()
    finally:
        buildkit.cli.cache_clear()


def test_the_image_takes_the_venv_archive_the_role_keeps_where_it_fits_the_base(tmp_path):
    """The archive the python_stack role keeps for /opt/rig/venv (its directory named as the role names it) is
    taken where it fits the base; else the wheels, and the reason is said. A manifest that is a link is not read."""
    from ansible.plugins.filter.core import get_hash

    lock, base = {"lock_hash": "b" * 64, "python": "3.11"}, {"glibc": "2.36", "zstd": True}
    where = kept_dir(tmp_path, lock["lock_hash"], "/opt/rig/venv")
    assert where.name == f"{lock['lock_hash']}-{get_hash('/opt/rig/venv', 'sha256')[:12]}"  # the role's vars/main.yml
    assert kept_venv(tmp_path, lock, base) == (None, f"the lock's wheels (the controller keeps no archive of its "
                                                     f"venv at {where})")
    name = archive_name(lock["lock_hash"], "3.11.2", "x86_64")
    manifest_path, archive = where / f"{name}.manifest.json", where / f"{name}.tar.zst"
    where.mkdir(parents=True)
    archive.write_bytes(b"z" * 10)

    def keep(**changed) -> bytes:
        manifest = {"format": FORMAT, "lock_hash": lock["lock_hash"], "python": "3.11.2", "glibc": "2.36",
                    "arch": "x86_64", "venv": "/opt/rig/venv", "archive": {"name": name, "sha256": "c" * 64, "size": 10},
                    "entries": [], **changed}
        manifest_path.write_text(json.dumps(manifest))
        return manifest_path.read_bytes()

    data = keep()
    assert kept_venv(tmp_path, lock, base) == ({"name": name, "archive": archive, "manifest": data},
                                               f"the controller's archive {archive}")
    for changed, why in (({"venv": "/srv/venv"}, "it was packed at /srv/venv"),
                         ({"glibc": "2.39"}, "it was packed on glibc 2.39, the base has 2.36"),
                         ({"archive": {"name": name, "sha256": "c" * 64, "size": 11}}, "not the size its manifest"),
                         ({"python": "3.12.1"}, "archive.name")):
        keep(**changed)
        taken, said = kept_venv(tmp_path, lock, base)
        assert taken is None and said.startswith("the lock's wheels (") and why in said, said
    keep()
    assert kept_venv(tmp_path, lock, {**base, "zstd": False})[1].endswith("the base has no zstd, which unpacks it)")
    manifest_path.rename(tmp_path / "elsewhere.json")
    manifest_path.symlink_to(tmp_path / "elsewhere.json")
    taken, said = kept_venv(tmp_path, lock, base)
    assert taken is None and "link" in said, said
