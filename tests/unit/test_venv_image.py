"""rig venv image / mount: a real (small) venv packed, imaged through `mksquashfs -tar` to the same bytes twice, its
bytecode fresh inside the image; then, as root with loop devices, mounted read-only and linked at the venv's path,
rolled back, the images before the previous one collected, and checked by verify and doctor. Every refusal (a
tampered image, a manifest that lies, a link rig did not make, a FIFO) comes before anything changes."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from harness.commands import rig
from harness.venv_images import LONG, imaged, three_images
from harness.venvs import LOCK, cached, flip_a_byte, make_venv, site_of

from rig.core import RigError
from rig.machine.doctor import _venv_image
from rig.python.runtime_env import HOOK, MODULE, hook_text
from rig.python.venv_archive import image as imaging
from rig.python.venv_archive import mount as mounting
from rig.python.venv_archive.image import image, read_image_manifest
from rig.python.venv_archive.manifest import FIXED_MTIME
from rig.python.venv_archive.mount import looked_at, mount
from rig.python.venv_archive.mounts import CannotMount, detach, mountable, mounted
from rig.python.venv_archive.pack import pack
from rig.python.venv_archive.place import store_of

pytestmark = pytest.mark.skipif(not (shutil.which("zstd") and shutil.which("mksquashfs")),
                                reason="needs zstd and mksquashfs (apt install zstd squashfs-tools)")
CANNOT = mountable()
needs_mount = pytest.mark.skipif(CANNOT is not None, reason=f"cannot loop-mount squashfs here: {CANNOT}")


def test_the_same_archive_images_to_the_same_bytes_and_its_manifest_says_what_it_holds(tmp_path):
    first = imaged(tmp_path)
    again = image(first["archive_manifest"], tmp_path / "again")
    assert first["changed"] and again["changed"]
    assert Path(first["image"]).read_bytes() == Path(again["image"]).read_bytes()
    assert Path(first["image_manifest"]).read_bytes() == Path(again["image_manifest"]).read_bytes()
    described = read_image_manifest(first["image_manifest"])
    archive_manifest = json.loads(Path(first["archive_manifest"]).read_text())
    assert described["format"] == "squashfs" and described["compression"] == {"algorithm": "zstd", "level": 3}
    assert described["image"] == {"name": archive_manifest["archive"]["name"], "size": Path(first["image"]).stat().st_size,
                                  "sha256": hashlib.sha256(Path(first["image"]).read_bytes()).hexdigest()}
    assert {key: described[key] for key in ("lock_hash", "python", "glibc", "arch", "venv")} == \
        {key: archive_manifest[key] for key in ("lock_hash", "python", "glibc", "arch", "venv")}
    assert described["archive"] == {"name": archive_manifest["archive"]["name"],
                                    "sha256": archive_manifest["archive"]["sha256"],
                                    "manifest_sha256": hashlib.sha256(Path(first["archive_manifest"]).read_bytes())
                                    .hexdigest()}
    assert described["interpreter"] == first["interpreter"] and os.path.isabs(first["interpreter"])
    assert os.path.realpath(described["interpreter"]) == os.path.realpath(sys.executable)
    assert image(first["archive_manifest"], tmp_path / "images")["changed"] is False
    dry = image(first["archive_manifest"], tmp_path / "dry", check=True)
    assert dry["msg"].startswith("would image") and not (tmp_path / "dry").exists()


def test_an_image_changed_at_its_size_is_built_again(tmp_path):
    """An image run that finds its image already built hashes it: one of the manifest's size whose bytes changed
    was taken as built, and every host mounting it was refused."""
    first = imaged(tmp_path)
    before = flip_a_byte(Path(first["image"]))
    again = image(first["archive_manifest"], tmp_path / "images")
    assert again["changed"] and Path(first["image"]).read_bytes() == before


def test_the_image_holds_the_venv_as_packed_its_bytecode_fresh(tmp_path):
    """Every time is FIXED_MTIME and every pyc header names it with its source's size: Python on a read-only mount
    of the image takes the bytecode as fresh and never compiles again."""
    built = imaged(tmp_path)
    listing = subprocess.run(["unsquashfs", "-lln", built["image"]], capture_output=True, text=True, check=True).stdout
    root = next(line for line in listing.splitlines() if line.endswith(" squashfs-root"))
    assert root.startswith("drwxr-xr-x 0/0")  # a venv directory's mode, root's
    assert f"site-packages/{LONG}.txt" in listing and " 2020-01-01 00:00 " in listing
    tree = tmp_path / "tree"
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(tree), built["image"]], check=True, capture_output=True)
    package = site_of(tree) / "tiny"
    pyc, source = cached(package / "__init__.py"), (package / "__init__.py").stat()
    assert struct.unpack("<4xIII", pyc.read_bytes()[:16])[1:] == (FIXED_MTIME, source.st_size)
    assert source.st_mtime == FIXED_MTIME and not cached(package / "stale.py").exists()
    assert (tree / "bin" / "tool").stat().st_mode & 0o777 == 0o755


def test_an_archive_that_is_not_its_manifests_is_refused_and_nothing_is_written(tmp_path):
    venv = make_venv(tmp_path / "venv")
    packed = pack(venv, tmp_path / "archive")
    archive = Path(packed["archive"])
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    for check in (True, False):
        with pytest.raises(RigError, match="is not the archive its manifest describes"):
            image(packed["manifest"], tmp_path / "images", check=check)
    assert not (tmp_path / "images").exists() or list((tmp_path / "images").iterdir()) == []
    archive.unlink()
    os.mkfifo(archive)
    with pytest.raises(RigError, match="not a regular file"):
        image(packed["manifest"], tmp_path / "images")


@pytest.mark.parametrize("fault", ["no hook", "another venv's hook", "rig's module"])
def test_an_archive_whose_venv_could_not_take_the_stacks_environment_is_not_imaged(tmp_path, fault):
    """Mounted, an image without rig's hook (an archive packed before `rig env hook`), or with rig's environment
    module fixed inside it, could not take the stack's environment: refused before anything is built."""
    venv = make_venv(tmp_path / "venv")
    site = site_of(venv)
    if fault == "no hook":
        (site / HOOK).unlink()
    elif fault == "another venv's hook":
        (site / HOOK).write_text(hook_text("/opt/other"))
    else:
        (site / f"{MODULE}.py").write_text("")
    packed = pack(venv, tmp_path / "archive")
    with pytest.raises(RigError) as refused:
        image(packed["manifest"], tmp_path / "images", check=True)
    assert "cannot be imaged" in refused.value.message and "rig env hook" in refused.value.hint
    assert ("environment module" if fault == "rig's module" else "is not rig's environment hook") in \
        refused.value.message
    assert not (tmp_path / "images").exists()

def test_no_mksquashfs_names_the_package_to_install(tmp_path, monkeypatch):
    venv = make_venv(tmp_path / "venv")
    packed = pack(venv, tmp_path / "archive")
    which = shutil.which
    monkeypatch.setattr(imaging.shutil, "which", lambda name: None if name == "mksquashfs" else which(name))
    with pytest.raises(RigError) as refused:
        image(packed["manifest"], tmp_path / "images")
    assert "mksquashfs is not on PATH" in refused.value.message and "apt install squashfs-tools" in refused.value.hint
    assert not (tmp_path / "images").exists()


def lying(tmp_path: Path, built: dict, **fields) -> Path:
    """The image manifest with FIELDS changed (and its name with them, so only the lie is left to catch)."""
    described = json.loads(Path(built["image_manifest"]).read_text())
    described.update(fields)
    python, arch = described["python"].rsplit(".", 1)[0], described["arch"]
    described["image"]["name"] = f"venv-{described['lock_hash'][:16]}-py{python}-{arch}"
    path = tmp_path / "lies" / f"{described['image']['name']}.image.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(described))
    return path


def test_a_manifest_that_lies_or_a_link_rig_did_not_make_is_refused_before_anything_changes(tmp_path):
    built = imaged(tmp_path)
    venv, store = tmp_path / "venv", tmp_path / "store"
    for fields, said in [({"lock_hash": "b" * 64}, "it holds lock bbbbbbbbbbbbbbbb, not aaaaaaaaaaaaaaaa"),
                         ({"python": "3.99.0"}, "it is for Python 3.99.0"),
                         ({"arch": "sparc64"}, "it is for sparc64")]:
        with pytest.raises(RigError, match=said):
            mount(str(lying(tmp_path, built, **fields)), venv, LOCK, root=store)
    with pytest.raises(RigError, match="it was packed at"):
        mount(built["image_manifest"], tmp_path / "elsewhere", root=store)
    (tmp_path / "theirs").mkdir()
    venv.symlink_to(tmp_path / "theirs")
    with pytest.raises(RigError) as refused:
        mount(built["image_manifest"], venv, root=store)
    assert "which rig did not make" in refused.value.message and "remove the link" in refused.value.hint
    venv.unlink()
    os.mkfifo(venv)
    with pytest.raises(RigError, match="not a directory or a link"):
        mount(built["image_manifest"], venv, root=store)
    venv.unlink()
    where = store_of(venv, store) / read_image_manifest(built["image_manifest"])["image"]["name"]
    assert not store.exists()  # every refusal so far came before the store was made
    where.parent.mkdir(parents=True)
    where.symlink_to(tmp_path / "theirs")
    with pytest.raises(RigError, match="is a link or not a directory; the mount point"):
        mount(built["image_manifest"], venv, root=store)
    assert not os.path.lexists(venv) and sorted(p.name for p in where.parent.iterdir()) == [where.name]


def test_a_host_that_cannot_mount_says_cannot_mount_and_exits_4(tmp_path, monkeypatch, capsys):
    """The role falls back to the archive on this answer: its own exit status and `reason`, before any pull."""
    import signal

    import rig.cli as boundary

    built = imaged(tmp_path)
    monkeypatch.setattr(mounting, "mountable", lambda: "this host has no loop device (/dev/loop-control)")
    with pytest.raises(CannotMount):
        mount(built["image_manifest"], tmp_path / "venv", root=tmp_path / "store")
    monkeypatch.setattr(signal, "signal", lambda *_: None)
    with pytest.raises(SystemExit) as done:
        boundary.main(["venv", "mount", "--image-manifest", built["image_manifest"], "--venv", str(tmp_path / "venv"),
                       "--store", str(tmp_path / "store"), "--json"])
    answer = json.loads(capsys.readouterr().out)
    assert done.value.code == answer["exit"] == 4 and answer["reason"] == "cannot-mount"
    assert "no loop device" in answer["error"] and "rig venv unpack" in answer["hint"]
    assert list((tmp_path / "store").rglob("*.sqfs")) == []  # nothing pulled


# ------------------------------------------------------------------ mounted for real (root, loop devices)

@pytest.fixture
def unmounted_after(tmp_path):
    """Every mount this test left under tmp_path unmounted, pass or fail."""
    yield
    for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
        point = line.split()[4]
        if point.startswith(str(tmp_path)):
            detach(point)


@needs_mount
def test_mount_links_rolls_back_and_keeps_only_the_current_and_the_previous(tmp_path, unmounted_after):
    first, second, third = three_images(tmp_path)
    venv, store = tmp_path / "venv", tmp_path / "store"
    done = mount(str(first), venv, root=store)
    where = Path(done["mount"])
    assert done["changed"] and os.readlink(venv) == str(where) and mounted(where)["type"] == "squashfs"
    assert mount(str(first), venv, root=store)["changed"] is False  # already mounted and linked
    # bytecode fresh on the read-only mount: Python reads it, and says of nothing that it is stale
    ran = subprocess.run([str(venv / "bin" / "python"), "-v", "-c", "import sys, tiny; print(tiny.VALUE, sys.prefix)"],
                         capture_output=True, text=True, check=True)
    assert ran.stdout.split() == ["42", str(venv)] and "bytecode is stale" not in ran.stderr
    assert f"code object from '{cached(site_of(venv) / 'tiny' / '__init__.py')}'" in ran.stderr
    pyc, source = cached(site_of(venv) / "tiny" / "__init__.py"), (site_of(venv) / "tiny" / "__init__.py").stat()
    assert struct.unpack("<4xIII", pyc.read_bytes()[:16])[1:] == (int(source.st_mtime), source.st_size)
    with pytest.raises(OSError):
        (venv / "written").write_text("x")  # read-only
    assert mount(str(second), venv, root=store)["previous"] == first.name.removesuffix(".image.json")
    third_done = mount(str(third), venv, root=store)
    assert third_done["collected"] == [first.name.removesuffix(".image.json")] and mounted(where) is None
    assert not where.exists() and not (store_of(venv, store) / f"{where.name}.sqfs").exists()
    rolled = mount(str(second), venv, root=store)  # the rollback: mounted already, only the link moves
    assert rolled["changed"] and rolled["collected"] == [] and "pull" not in rolled["msg"]
    assert os.readlink(venv).endswith(second.name.removesuffix(".image.json"))
    assert rolled["previous"] == third.name.removesuffix(".image.json")
    assert sorted(p.name for p in store_of(venv, store).glob("*.sqfs")) == \
        sorted(p.name.replace(".image.json", ".sqfs") for p in (second, third))


@needs_mount
def test_a_venv_directory_is_moved_aside_and_a_busy_mount_point_or_tampered_image_is_refused(tmp_path, unmounted_after):
    first, second, _ = three_images(tmp_path)
    venv, store = tmp_path / "venv", tmp_path / "store"
    make_venv(venv)
    done = mount(str(first), venv, root=store)
    assert done["moved_aside"] == str(tmp_path / "venv.rig-before-image") and (tmp_path / "venv.rig-before-image"
                                                                                 / "pyvenv.cfg").exists()
    # another image mounted where the second's goes: refused, the link stays
    second_name = second.name.removesuffix(".image.json")
    squatter = store_of(venv, store) / second_name
    squatter.mkdir()
    subprocess.run(["mount", "-t", "squashfs", "-o", "ro,loop", str(store_of(venv, store) / f"{first.name[:-11]}.sqfs"),
                    str(squatter)], check=True)
    with pytest.raises(RigError, match="already has .* mounted"):
        mount(str(second), venv, root=store)
    detach(squatter)
    # the image served is not its manifest's: the pull refuses it, nothing is mounted or kept
    served = second.with_name(f"{second_name}.sqfs")
    data = bytearray(served.read_bytes())
    data[100] ^= 0xFF
    served.write_bytes(bytes(data))
    with pytest.raises(RigError, match="is not the image its manifest describes"):
        mount(str(second), venv, root=store)
    assert os.readlink(venv).endswith(first.name[:-11]) and mounted(squatter) is None
    assert not (store_of(venv, store) / f"{second_name}.sqfs").exists()
    served.unlink()
    os.mkfifo(served)
    with pytest.raises(RigError, match="not a regular file|never a FIFO"):
        mount(str(second), venv, root=store)


@needs_mount
def test_verify_and_doctor_follow_the_link_to_the_mounted_image_and_catch_a_changed_one(tmp_path, unmounted_after):
    built = imaged(tmp_path)
    venv, store = tmp_path / "venv", tmp_path / "store"
    mount(built["image_manifest"], venv, root=store)
    seen = looked_at(venv)
    assert seen["ok"] and seen["name"] == Path(built["image"]).stem and seen["problems"] == []
    check = _venv_image(str(venv))
    assert check.status == "pass" and "mounted image" in check.detail
    # the marker's "a==1" is not installed (a test venv), so verify judges it failed; the image is as built
    for manifest, key in ((built["image_manifest"], "image"), (built["archive_manifest"], "archive")):
        done = rig("venv", "verify", "--venv", str(venv), "--manifest", manifest, "--json")
        assert done.returncode == 1 and json.loads(done.stdout)[key]["ok"] is True, done.stdout + done.stderr
    kept = store_of(venv, store) / Path(built["image"]).name
    with open(kept, "ab") as grown:  # a byte past the filesystem's end: it still mounts, but is no longer the image
        grown.write(b"\0")
    assert looked_at(venv)["problems"] == [f"{kept}'s bytes are not its manifest's (sha256 or size differs)"]
    assert _venv_image(str(venv)).status == "fail"
    done = rig("venv", "verify", "--venv", str(venv), "--manifest", built["image_manifest"], "--json")
    assert done.returncode == 1 and json.loads(done.stdout)["image"]["ok"] is False
    detach(Path(os.readlink(venv)))
    assert "nothing is mounted at" in _venv_image(str(venv)).detail
    assert _venv_image(str(tmp_path / "archive-aaaa")) is None  # a directory: no image to speak of


@needs_mount
def test_an_archive_replaces_rigs_link_to_an_image_and_the_image_stays_mounted(tmp_path, unmounted_after):
    """The archive's fallback where the venv is an image rig mounted (built wheels go into a directory): the link is
    replaced, even by an archive of the image's own lock, and the image stays in the store, mounted, for a rollback."""
    built = imaged(tmp_path)
    venv, store = tmp_path / "venv", tmp_path / "store"
    where = Path(mount(built["image_manifest"], venv, root=store)["mount"])
    done = rig("venv", "unpack", "--venv", str(venv), "--manifest", built["archive_manifest"], "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["changed"], done.stdout + done.stderr
    assert venv.is_dir() and not venv.is_symlink() and mounted(where)["type"] == "squashfs"
    assert (site_of(venv) / "tiny" / "__init__.py").read_text() == "VALUE = 42\n"
    planted = tmp_path / "planted"
    venv.rename(tmp_path / "unpacked")
    planted.mkdir()
    venv.symlink_to(planted)  # a link rig did not make is never replaced
    refused = rig("venv", "unpack", "--venv", str(venv), "--manifest", built["archive_manifest"])
    assert refused.returncode == 2 and "which rig did not make" in refused.stderr and venv.is_symlink()
