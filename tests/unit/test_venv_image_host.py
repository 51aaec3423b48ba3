"""A mounted venv image on its host: the systemd mount unit that survives a reboot, and the environment that lives
outside the read-only image (its hook, its writable site dir, its run-time caches)."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness.venv_images import ENV, NAME

from rig.core import RigError
from rig.python import runtime_env
from rig.python.runtime_env import HOOK, MODULE, hook, hook_text, install
from rig.python.venv_archive import mounts, unit
from rig.python.venv_archive.place import venv_place
from rig.python.venv_archive.unit import escape_path, persist, unit_name, unit_text

# systemd's unit_name_path_escape, worked by hand: slashes trimmed and squeezed, "/" is "-", every other byte but
# [A-Za-z0-9:_.] (and a leading ".") is \xNN, "-" itself included
ESCAPED = {"/": "-", "/opt/rig/venv": "opt-rig-venv", "/a//b/": "a-b", "/srv/.hidden/x y": "srv-.hidden-x\\x20y",
           f"/var/lib/rig/venv-images/venv-0a1b2c3d4e5f/{NAME}":
               "var-lib-rig-venv\\x2dimages-venv\\x2d0a1b2c3d4e5f-venv\\x2d0123456789abcdef\\x2dpy3.11\\x2dx86_64",
           "/opt/ünï/v@1+2": "opt-\\xc3\\xbcn\\xc3\\xaf-v\\x401\\x2b2", "/.x/y.": "\\x2ex-y."}


@pytest.mark.parametrize("path", ESCAPED)
def test_a_unit_is_named_by_systemds_path_escaping(path):
    assert escape_path(path) == ESCAPED[path] and unit_name(path) == f"{ESCAPED[path]}.mount"
    if shutil.which("systemd-escape"):  # the same as systemd's own, byte for byte
        said = subprocess.run(["systemd-escape", "--path", path], capture_output=True, text=True, check=True)
        assert said.stdout.strip() == ESCAPED[path]


def test_a_path_a_unit_file_would_read_otherwise_is_refused_not_pasted():
    fields = {"What": "/var/lib/rig/x.sqfs", "Where": "/var/lib/rig/x", "Type": "squashfs",
              "Options": "ro,loop,nodev,nosuid"}
    text = unit_text(fields, "x")
    assert "\nWhat=/var/lib/rig/x.sqfs\nWhere=/var/lib/rig/x\nType=squashfs\nOptions=ro,loop,nodev,nosuid\n" in text
    assert text.endswith("[Install]\nWantedBy=local-fs.target\n")
    for bad in ("/var/lib/rig/%n.sqfs", "/var/lib/rig/a b", "/var/lib/../etc/x", "/x\nExecStart=/bin/sh"):
        with pytest.raises(RigError, match="no unit written"):
            unit_text({**fields, "What": bad}, "x")
    with pytest.raises(RigError, match="not an absolute, normalized path"):
        escape_path("/a/../b")


def image_venv(tmp_path: Path) -> tuple[Path, Path]:
    """A venv path linked as rig venv mount links it: to STORE/VENVNAME-HASH/NAME (a plain directory here)."""
    venv = tmp_path / "opt" / "venv"
    store = tmp_path / "store" / f"venv-{hashlib.sha256(str(venv).encode()).hexdigest()[:12]}"
    mounted = store / NAME
    (mounted / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    venv.parent.mkdir(parents=True)
    venv.symlink_to(mounted)
    return venv, mounted


def test_the_mount_unit_is_written_enabled_once_and_an_old_images_unit_goes(tmp_path, monkeypatch):
    venv, mounted = image_venv(tmp_path)
    units, booted = tmp_path / "units", tmp_path / "run-systemd"
    units.mkdir()
    said: list = []

    def systemctl(*argv):
        said.append(argv)
        if argv[0] == "enable":  # what systemctl enable makes for WantedBy=local-fs.target
            (units / "local-fs.target.wants").mkdir(exist_ok=True)
            (units / "local-fs.target.wants" / argv[1]).symlink_to(units / argv[1])

    monkeypatch.setattr(unit, "_systemctl", systemctl)
    absent = persist(venv, unit_dir=units, booted=booted, root=tmp_path / "store")
    assert not absent["changed"] and "will not survive a reboot" in absent["msg"] and not list(units.iterdir())
    booted.mkdir()
    old = units / unit_name(mounted.with_name("venv-fedcba9876543210-py3.11-x86_64"))
    old.write_text("# Written by rig: the venv image, an older one\n")
    other = units / unit_name(mounted.with_name("elsewhere"))
    other.write_text("[Mount]\n")  # not rig's: left alone
    dry = persist(venv, check=True, unit_dir=units, booted=booted, root=tmp_path / "store")
    assert dry["changed"] and dry["msg"].startswith("would write") and "disable and remove" in dry["msg"]
    assert said == [] and old.exists() and "+What=" in dry["diff"]
    done = persist(venv, unit_dir=units, booted=booted, root=tmp_path / "store")
    name = unit_name(mounted)
    assert done["changed"] and said == [("disable", old.name), ("daemon-reload",), ("enable", name)]
    assert not old.exists() and other.exists()
    text = (units / name).read_text()
    assert f"What={mounted}.sqfs\nWhere={mounted}\n" in text and "Options=ro,loop,nodev,nosuid" in text
    again = persist(venv, unit_dir=units, booted=booted, root=tmp_path / "store")
    assert not again["changed"] and len(said) == 3 and "enabled" in again["msg"]


def test_a_link_of_rigs_shape_into_another_store_is_never_made_a_boot_time_mount(tmp_path, monkeypatch):
    """Any absolute link to .../VENVNAME-HASH/NAME was rig's: persist wrote a root mount unit for whatever file
    lay beside it. Only a link into the venv's store under the root given (one only root may change) is rig's."""
    venv, mounted = image_venv(tmp_path)
    units, booted = tmp_path / "units", tmp_path / "run-systemd"
    units.mkdir()
    booted.mkdir()
    monkeypatch.setattr(unit, "_systemctl", lambda *argv: None)
    elsewhere = persist(venv, unit_dir=units, booted=booted, root=tmp_path / "other")
    assert not elsewhere["image"] and not elsewhere["changed"] and list(units.iterdir()) == []
    assert "no venv image rig mounted" in elsewhere["msg"]
    with pytest.raises(RigError, match="which rig did not make"):
        venv_place(venv, tmp_path / "other")
    assert venv_place(venv, tmp_path / "store") == venv_place(venv, None) == ("link", mounted)
    mounted.parent.chmod(0o777)  # the store: whoever may write it may swap the image the unit mounts
    with pytest.raises(RigError, match="writable by group or others"):
        persist(venv, unit_dir=units, booted=booted, root=tmp_path / "store")
    assert list(units.iterdir()) == []


def test_the_mount_table_is_read_by_real_paths_but_a_link_is_no_mount_point(tmp_path, monkeypatch):
    """The kernel names a mount point by its real path: a store under a linked directory, or named relative to the
    working directory, never matched, so each run mounted the image again."""
    (tmp_path / "real" / "store" / NAME).mkdir(parents=True)
    (tmp_path / "via").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "store" / "aimed").symlink_to(tmp_path / "real" / "store" / NAME)
    table = f"100 1 7:1 / {tmp_path}/real/store/{NAME} ro,relatime shared:1 - squashfs /dev/sdz9 ro\n".encode()
    read = mounts.read_bytes
    monkeypatch.setattr(mounts, "read_bytes", lambda path, *a, **k: table if path == "/proc/self/mountinfo"
                        else read(path, *a, **k))
    seen = {"type": "squashfs", "source": "/dev/sdz9", "backing": None}
    assert mounts.mounted(tmp_path / "via" / "store" / NAME) == mounts.mounted(tmp_path / "real" / "store" / NAME) == seen
    monkeypatch.chdir(tmp_path / "via")
    assert mounts.mounted(f"store/{NAME}/") == seen
    assert mounts.mounted(tmp_path / "real" / "store" / "aimed") is None  # a link at the mount point's own name


def fake_python_venv(root: Path) -> Path:
    """A real venv of this Python (no pip) under ROOT."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    return root


def test_the_hook_goes_in_before_packing_and_the_environment_comes_from_a_writable_site_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime_env, "ENV_SITE_ROOT", tmp_path / "venv-env")
    monkeypatch.setattr(runtime_env, "RUNTIME_CACHE", str(tmp_path / "runtime"))
    (tmp_path / "runtime").mkdir(mode=0o755)
    built = fake_python_venv(tmp_path / "built")
    site = runtime_env.site_packages(built)
    install(built, ENV, "tiny")  # a packer's venv that had an environment before
    venv = tmp_path / "opt" / "venv"
    venv.parent.mkdir()
    ready = hook(built)
    assert ready["changed"] and not (site / f"{MODULE}.py").exists() and (site / HOOK).read_text() == hook_text(built)
    assert not hook(built)["changed"]
    # the image: the packed tree behind a link rig made; its hook names the venv path's site dir
    store = tmp_path / "store" / f"venv-{hashlib.sha256(str(venv).encode()).hexdigest()[:12]}"
    store.mkdir(parents=True)
    shutil.copytree(built, store / NAME, symlinks=True)
    inner = runtime_env.site_packages(store / NAME)
    (inner / HOOK).write_text(hook_text(venv))
    venv.symlink_to(store / NAME)
    first = install(venv, ENV, "tiny")
    assert first["changed"] and all(str(runtime_env.env_site(venv)) in f for f in first["files"])
    assert not install(venv, ENV, "tiny")["changed"]
    code = "import os; print(os.environ['CUDA_HOME'], os.environ['TRITON_CACHE_DIR'], " \
           "os.environ['FLASHINFER_WORKSPACE_BASE'])"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], env={}, capture_output=True, text=True, check=False)
    own = tmp_path / "runtime" / f"uid-{os.geteuid()}"
    assert out.stdout.split() == ["/usr/local/cuda-13.0", f"{own}/triton",
                                  f"{own}/flashinfer-jit/cuda-13.0.2-flashinfer-0.7.2"], out.stderr
    assert own.is_dir() and (own.stat().st_mode & 0o777) == 0o700
    # a cache directory someone else could write is never taken: the packages' defaults apply
    own.chmod(0o777)
    code = "import os; print(os.environ.get('TRITON_CACHE_DIR'), os.environ['CUDA_HOME'])"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], env={}, capture_output=True, text=True, check=False)
    assert out.stdout.split() == ["None", "/usr/local/cuda-13.0"], out.stderr
    (inner / HOOK).unlink()
    with pytest.raises(RigError, match="without rig's hook"):
        install(venv, ENV, "tiny")


def fsverity_digest(data: bytes) -> str:
    """The fs-verity digest of a file of DATA (SHA-256, 4 KiB blocks, no salt), worked from the kernel's
    Documentation/filesystems/fsverity.rst: the blocks hashed, the hashes packed into zero-padded blocks and hashed
    again until one block is left, whose hash is the root; the digest is the hash of the 256-byte descriptor."""
    block = 4096
    level = [data[i:i + block].ljust(block, b"\0") for i in range(0, len(data), block)]
    root = bytes(32)
    while level:
        hashes = b"".join(hashlib.sha256(b).digest() for b in level)
        if len(level) == 1:
            root = hashes
            break
        level = [hashes[i:i + block].ljust(block, b"\0") for i in range(0, len(hashes), block)]
    descriptor = bytes([1, 1, 12, 0]) + bytes(4) + len(data).to_bytes(8, "little") + root.ljust(64, b"\0") + bytes(176)
    return "sha256:" + hashlib.sha256(descriptor).hexdigest()


def test_fs_verity_keeps_an_image_checked_where_the_host_offers_it_and_says_why_not_where_not(tmp_path):
    """Either the kernel turns fs-verity on (its digest is the file's, and the file can no longer be written) or
    it says it cannot and the file is left as it was, writable, with the reason in words."""
    from rig.python.venv_archive import verity

    data = os.urandom(3 * 4096 + 123)  # four blocks, the last partial: one level of the tree above the data
    image = tmp_path / "x.sqfs"
    image.write_bytes(data)
    said = verity.keep_checked(image)
    with image.open("rb") as handle:
        now = verity.measured(handle.fileno())
    assert now == said if said["on"] else not now["on"]
    if said["on"]:
        assert said == {"on": True, "digest": fsverity_digest(data)} == verity.keep_checked(image)  # again: on
        with pytest.raises(OSError):
            image.open("r+b")
    else:
        assert said["why"] in verity.NOT_HERE.values(), said  # no fs-verity here, not a failure of rig's ioctl
        with image.open("r+b") as handle:
            handle.write(b"y")  # left as it was: still writable
    assert image.read_bytes()[1:] == data[1:]
    image.with_name("link.sqfs").symlink_to(image)
    os.mkfifo(tmp_path / "fifo.sqfs")
    for refused in ("link.sqfs", "fifo.sqfs"):
        with pytest.raises(RigError, match="a link|not a regular file"):
            verity.keep_checked(tmp_path / refused)


def test_the_tests_fs_verity_digest_is_the_fsverity_tools():
    """The digest the test above holds the kernel to, against what Debian's fsverity-utils 1.5 printed for the
    same bytes (`fsverity digest --hash-alg=sha256 --block-size=4096`): empty, one byte, a whole block, a block and
    a byte, and 130 blocks and 5 bytes (two levels above the data)."""
    counted = bytes(range(256)) * 16
    files = {b"": "3d248ca542a24fc62d1c43b916eae5016878e2533c88238480b26128a1f1af95",
             b"a": "bce75948b9e7510293f8f2720412af9697c1479281323f3f220623fb8e94b557",
             counted: "15a0095100272ab90a2209e97f8a2c54dff6f84d2b29524f95d92fe23b6ef25b",
             counted + b"z": "97022ac4afc6ef9828db41f7506099d66914768ae8b51357325ba81bf1c7c9b9",
             bytes((i * 7) % 251 for i in range(4096 * 130 + 5)):
                 "c8726cb1ac0d6953895ccc936e87174133ed18de96565d61411f0e1e51bf0a08"}
    assert {len(data): fsverity_digest(data) for data in files} == \
        {len(data): f"sha256:{digest}" for data, digest in files.items()}
