"""rig venv image / mount under attack: an archive whose members are not its (self-consistent) manifest's, a
store, state or mount point someone else made or mounted over, two runs at once. Every refusal is one RigError
naming the problem, and nothing is changed: no image built, nothing pulled, mounted or linked."""
from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from harness.os_faults import refuse
from harness.tars import padded, unreadable, zstd_of
from harness.venv_images import ENV, NAME, imaged, three_images
from harness.venvs import make_venv

from rig.core import RigError
from rig.python import runtime_env
from rig.python.runtime_env import HOOK, hook_text
from rig.python.venv import MARKER
from rig.python.venv_archive import mount as mounting
from rig.python.venv_archive.image import image
from rig.python.venv_archive.mount import mount
from rig.python.venv_archive.mounts import detach, mountable, mounted
from rig.python.venv_archive.pack import pack
from rig.python.venv_archive.place import store_of
from rig.python.venv_archive.unit import unit_name

pytestmark = pytest.mark.skipif(not (shutil.which("zstd") and shutil.which("mksquashfs")),
                                reason="needs zstd and mksquashfs (apt install zstd squashfs-tools)")


@pytest.fixture(scope="module")
def packed_once(tmp_path_factory) -> tuple[Path, dict, list[tuple[tarfile.TarInfo, bytes]]]:
    """A real venv packed once: its manifest, and its tar's members with their bytes (to craft archives from)."""
    root = tmp_path_factory.mktemp("packed")
    done = pack(make_venv(root / "venv"), root / "out")
    raw = subprocess.run(["zstd", "-q", "-dc", done["archive"]], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        members = [(member, tar.extractfile(member).read() if member.isfile() else b"") for member in tar]
    return Path(done["manifest"]), json.loads(Path(done["manifest"]).read_text()), members


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", mode: int = 0o644, **fields) -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime = kind, len(data) if kind == tarfile.REGTYPE else 0, mode, 1577836800
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data


def crafted_pair(where: Path, manifest: dict, members: list[tuple[tarfile.TarInfo, bytes]] | bytes) -> Path:
    """MEMBERS (or a tar's bytes) as WHERE/NAME.tar.zst and the (unchanged, valid) entries of MANIFEST beside it,
    the archive's sha256 and size right: a hostile packer's self-consistent pair, whose tar alone says what the
    venv holds."""
    raw = io.BytesIO()
    if isinstance(members, bytes):
        raw.write(members)
    else:
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for info, data in members:
                tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    archive = zstd_of(raw.getvalue())
    where.mkdir(parents=True, exist_ok=True)
    name = manifest["archive"]["name"]
    (where / f"{name}.tar.zst").write_bytes(archive)
    told = {**manifest, "archive": {**manifest["archive"], "sha256": hashlib.sha256(archive).hexdigest(),
                                    "size": len(archive)}}
    (where / f"{name}.manifest.json").write_text(json.dumps(told))
    return where / f"{name}.manifest.json"


def _swapped(members: list, name: str, change) -> list:
    return [change(info, data) if info.name == name else (info, data) for info, data in members]


def _setuid(info: tarfile.TarInfo, data: bytes) -> tuple:
    info = copy.copy(info)
    info.mode = 0o4755
    return info, data


def _other_bytes(info: tarfile.TarInfo, data: bytes) -> tuple:
    return info, b"#!/bin/sh\necho owned!\n"[:len(data)].ljust(len(data), b"#")


def _before_links(members: list, *extra: tuple) -> list:
    """EXTRA inserted after the last file (the links come last, as rig packs them)."""
    last = max(index for index, (info, _) in enumerate(members) if not info.issym())
    return [*members[:last + 1], *extra, *members[last + 1:]]


def _unended(members: list) -> bytes:
    """MEMBERS' tar without its end (its zero blocks)."""
    return b"".join(info.tobuf(tarfile.PAX_FORMAT) + padded(data) for info, data in members)


def _two_names(members: list, name: str, other: str) -> bytes:
    """MEMBERS' tar, NAME's header preceded by a PAX path NAME (what tarfile reads) and a GNU long name OTHER
    (what mksquashfs 4.5 reads)."""
    told = {"path": tarfile.TarInfo._create_pax_generic_header({"path": name}, tarfile.XHDTYPE, "utf-8"),
            "long": tarfile.TarInfo._create_gnu_long_header(other, tarfile.GNUTYPE_LONGNAME, "utf-8", "strict")}
    return b"".join((told["path"] + told["long"] if info.name == name else b"") + _unended([(info, data)])
                    for info, data in members) + bytes(1024)


HOSTILE = {
    "a FIFO": lambda m: _before_links(m, _member("bin/fifo", tarfile.FIFOTYPE)),
    "a device": lambda m: _before_links(m, _member("bin/null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3)),
    "a set-id bit": lambda m: _swapped(m, "bin/tool", _setuid),
    "other bytes": lambda m: _swapped(m, "bin/tool", _other_bytes),
    "a hard link out": lambda m: _before_links(m, _member("bin/passwd", tarfile.LNKTYPE, linkname="/etc/passwd")),
    "a hard link in": lambda m: _before_links(m, _member("bin/again", tarfile.LNKTYPE, linkname="bin/tool")),
    "an absolute path": lambda m: _before_links(m, _member("/etc/rig-owned", data=b"x")),
    "a member twice": lambda m: _before_links(m, *[(i, d) for i, d in m if i.name == "bin/tool"]),
    "a member missing": lambda m: [(i, d) for i, d in m if i.name != "bin/tool"],
    "a link elsewhere": lambda m: _swapped(m, "bin/python", lambda i, d: (_member("bin/python", tarfile.SYMTYPE,
                                                                                   mode=0o777, linkname="/bin/sh")[0], d)),
    # tarfile ends the tar at the unreadable header; mksquashfs 4.5.1 imaged it as a set-uid bin/evil
    "a member after the tar's end": lambda m: _unended(m) + unreadable("bin/evil", b"#!/bin/sh\n") + bytes(1024),
}


@pytest.mark.parametrize("attack", HOSTILE)
def test_an_archive_whose_members_are_not_its_manifests_entries_is_imaged_to_nothing(packed_once, tmp_path, attack):
    """The archive's sha256 is its manifest's, so only its members can give it away: each one is checked against
    the manifest's next entry as it streams to mksquashfs (a hard link to /etc/passwd made mksquashfs 4.5.1 crash;
    a device node, a set-id bit or other bytes were imaged as the tar said)."""
    _, manifest, members = packed_once
    crafted = crafted_pair(tmp_path / "crafted", manifest, HOSTILE[attack](list(members)))
    with pytest.raises(RigError, match="not its manifest's|do not belong together|leads outside|not whole|other "
                                       "than zeros after its last member"):
        image(crafted, tmp_path / "images")
    assert not (tmp_path / "images").exists() or list((tmp_path / "images").iterdir()) == []


def test_the_untouched_members_still_image(packed_once, tmp_path):
    _, manifest, members = packed_once
    built = image(crafted_pair(tmp_path / "crafted", manifest, list(members)), tmp_path / "images")
    assert built["changed"] and listed(built["image"]) == entries_of(manifest)


def listed(image_path: str) -> dict[str, str]:
    """Each path in the image (unsquashfs -lln), with its mode as ls writes it."""
    out = subprocess.run(["unsquashfs", "-lln", image_path], capture_output=True, text=True, check=True).stdout
    return {line.split(" squashfs-root", 1)[1].lstrip("/").split(" -> ")[0]: line.split()[0]
            for line in out.splitlines() if " squashfs-root" in line}


def entries_of(manifest: dict) -> dict[str, str]:
    """What the image of MANIFEST's archive holds: its entries, each with its mode, and the venv's directory."""
    kinds = {"dir": stat.S_IFDIR, "file": stat.S_IFREG, "link": stat.S_IFLNK}
    return {"": "drwxr-xr-x", **{path: stat.filemode(kinds[kind] | mode) for kind, path, mode, *_ in manifest["entries"]}}


def test_a_name_only_mksquashfs_would_read_never_reaches_the_image(packed_once, tmp_path):
    """A PAX path and a GNU long name for one member: tarfile reads the path (the manifest's bin/tool, checked),
    mksquashfs 4.5.1 read the long name, and the image held bin/evil. Built from the checked members written anew,
    the image holds the manifest's entries, each with its mode, and nothing else."""
    _, manifest, members = packed_once
    built = image(crafted_pair(tmp_path / "crafted", manifest, _two_names(members, "bin/tool", "bin/evil")),
                  tmp_path / "images")
    assert listed(built["image"]) == entries_of(manifest)


def test_an_archive_whose_marker_names_another_lock_is_imaged_to_nothing(packed_once, tmp_path):
    """Entries and members agree, but the venv's marker names lock b...: the image would say it holds lock a...
    (the name it is mounted by) while the venv inside says b..., as unpack already refuses."""
    _, manifest, members = packed_once
    other = json.dumps({"lock_hash": "b" * 64, "packages": ["a==1"]}).encode()
    swapped = _swapped(list(members), MARKER, lambda info, _: _member(MARKER, data=other))
    told = {**manifest, "entries": [["file", MARKER, 0o644, len(other), hashlib.sha256(other).hexdigest()]
                                    if entry[1] == MARKER else entry for entry in manifest["entries"]]}
    with pytest.raises(RigError, match=f"marker {MARKER} names lock b{{16}}, its manifest lock a{{16}}"):
        image(crafted_pair(tmp_path / "crafted", told, swapped), tmp_path / "images")
    assert list((tmp_path / "images").iterdir()) == []


# ------------------------------------------------------------------ rig venv mount: the store, its state, the runs

CANNOT = mountable()
needs_mount = pytest.mark.skipif(CANNOT is not None, reason=f"cannot loop-mount squashfs here: {CANNOT}")


@pytest.fixture
def unmounted_after(tmp_path):
    """Every mount this test left under tmp_path unmounted (the last made first), pass or fail."""
    yield
    for _ in range(8):
        points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                  if line.split()[4].startswith(str(tmp_path))]
        if not points:
            return
        detach(points[-1])


def mounts_at(where: Path) -> int:
    return sum(line.split()[4] == str(where) for line in Path("/proc/self/mountinfo").read_text().splitlines())


def nothing_changed(venv: Path, store: Path) -> None:
    assert not os.path.lexists(venv) and list(store.rglob("*.sqfs")) == [] and list(store.rglob("*.part")) == []
    assert not any(line.split()[4].startswith(str(store)) for line in
                   Path("/proc/self/mountinfo").read_text().splitlines())


@pytest.mark.parametrize("state", ["garbage", "fifo", "link"])
def test_a_state_file_rig_did_not_write_is_refused_before_anything_is_pulled_or_mounted(tmp_path, state, unmounted_after):
    """state.json was read after the pull and the mount: a broken one left the image mounted and the venv unlinked,
    and every run after did the same."""
    built = imaged(tmp_path)
    venv, store = tmp_path / "venv", tmp_path / "store"
    kept = store_of(venv, store)
    kept.mkdir(parents=True)
    if state == "garbage":
        (kept / "state.json").write_text('{"current": "../../etc"}')
    elif state == "fifo":
        os.mkfifo(kept / "state.json")
    else:
        (tmp_path / "elsewhere.json").write_text('{"current": null}')
        (kept / "state.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(RigError) as refused:
        mount(built["image_manifest"], venv, root=store)
    assert "state.json" in refused.value.message and "remove" in f"{refused.value.message} {refused.value.hint}"
    nothing_changed(venv, store)


@needs_mount
def test_collecting_an_old_image_leaves_what_someone_else_mounted_there(tmp_path, unmounted_after):
    """A bind mount of / over an old image's mount point: collecting the image unmounted it (umount of whatever
    was there), then could not remove the directory (EBUSY, a traceback after the link had moved)."""
    first, second, third = three_images(tmp_path)
    venv, store = tmp_path / "venv", tmp_path / "store"
    where = Path(mount(str(first), venv, root=store)["mount"])
    mount(str(second), venv, root=store)
    subprocess.run(["mount", "--bind", "-o", "ro", "/", str(where)], check=True)  # over the first image's mount
    done = mount(str(third), venv, root=store)
    assert os.readlink(venv).endswith(third.name.removesuffix(".image.json"))
    assert mounts_at(where) == 2 and mounted(where)["type"] != "squashfs"  # the bind stays, on the image
    assert done["collected"] == [] and "not its image" in done["msg"]


@needs_mount
def test_two_mounts_at_once_mount_the_image_once(tmp_path, unmounted_after, monkeypatch):
    """The second run looked while the first was between its look and its mount: both mounted, one over the other
    (a loop device lost, and the later collection could not remove the mount point)."""
    built = imaged(tmp_path)
    venv, store = tmp_path / "venv", tmp_path / "store"
    first_mounting, answers = threading.Event(), []
    said = mounting.progress

    def slow(message: str) -> None:  # the first run pauses between its look and its mount
        said(message)
        if message.startswith("mounting") and not first_mounting.is_set():
            first_mounting.set()
            time.sleep(1.5)

    monkeypatch.setattr(mounting, "progress", slow)
    first = threading.Thread(target=lambda: answers.append(mount(built["image_manifest"], venv, root=store)))
    first.start()
    assert first_mounting.wait(60)
    answers.append(mount(built["image_manifest"], venv, root=store))
    first.join(60)
    where = Path(answers[0]["mount"])
    assert mounts_at(where) == 1 and os.readlink(venv) == str(where)
    assert sorted(answer["changed"] for answer in answers) == [False, True]


@needs_mount
def test_a_store_inside_the_venv_is_refused_before_anything_changes(tmp_path, unmounted_after):
    """Moved aside with the venv directory, the mount went with it and the venv linked to nothing; under an image
    venv, the store was to be made inside the read-only image."""
    first, second, _ = three_images(tmp_path)
    venv = tmp_path / "venv"
    make_venv(venv)
    with pytest.raises(RigError, match="inside the venv"):
        mount(str(first), venv, root=venv / "store")
    assert not (venv / "store").exists() and (venv / "pyvenv.cfg").exists()
    mount(str(first), venv, root=tmp_path / "store")
    with pytest.raises(RigError, match="inside the venv"):
        mount(str(second), venv, root=venv / "store")


@pytest.mark.parametrize("who, mode", [(65534, 0o755), (0, 0o777), (0, 0o775)])
def test_a_store_someone_else_may_change_is_refused_before_anything_is_pulled(tmp_path, who, mode, unmounted_after):
    """Whoever may write the store (or a directory above it) may swap the image between its check and its mount:
    the venv's code, run by the server, would be theirs."""
    built = imaged(tmp_path)
    venv, store = tmp_path / "venv", tmp_path / "store"
    store.mkdir()
    os.chown(store, who, -1)
    store.chmod(mode)
    with pytest.raises(RigError, match=f"{store} is (owned by uid {who}|writable by group or others)"):
        mount(built["image_manifest"], venv, root=store)
    nothing_changed(venv, store)


def test_a_store_changed_between_its_first_check_and_its_making_is_refused_under_the_lock(tmp_path, monkeypatch,
                                                                                         unmounted_after):
    """The store was checked once, before it was made and outside the lock: one made (or opened up) in between
    was used as it stood."""
    built = imaged(tmp_path)
    venv, store = tmp_path / "venv", tmp_path / "store"
    made = mounting._made

    def opened_up(path: Path) -> None:
        made(path)
        path.chmod(0o777)

    monkeypatch.setattr(mounting, "_made", opened_up)
    with pytest.raises(RigError, match=f"{store_of(venv, store)} is writable by group or others"):
        mount(built["image_manifest"], venv, root=store)
    nothing_changed(venv, store)


@needs_mount
def test_a_relative_store_or_one_under_a_link_mounts_once_and_links_absolutely(tmp_path, monkeypatch, unmounted_after):
    """A relative --store made a relative link (read from the venv's parent: broken), which the next run refused as
    not rig's; a store under a linked directory never matched the mount table's real paths, so no run saw the
    mount as its own."""
    built = imaged(tmp_path)
    venv = tmp_path / "venv"
    monkeypatch.chdir(tmp_path)
    done = mount(built["image_manifest"], venv, root="store")
    assert os.readlink(venv) == done["mount"] == str(store_of(venv, tmp_path / "store") / Path(built["image"]).stem)
    assert mount(built["image_manifest"], venv, root="store")["changed"] is False
    venv.unlink()  # a link into the first store: rig's, but not the next store's to replace
    (tmp_path / "real").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "real")
    monkeypatch.chdir("/")
    first = mount(built["image_manifest"], venv, root=tmp_path / "via" / "store")
    again = mount(built["image_manifest"], venv, root=tmp_path / "via" / "store")
    real = tmp_path / "real" / "store" / store_of(venv, tmp_path).name / Path(built["image"]).stem
    assert first["changed"] and again["changed"] is False and mounts_at(real) == 1


def test_an_image_larger_than_the_stores_free_space_is_refused_before_it_is_pulled(tmp_path, unmounted_after):
    built = imaged(tmp_path)
    described = json.loads(Path(built["image_manifest"]).read_text())
    described["image"]["size"] = 1 << 50  # a petabyte: a server's endless answer would fill the disk first
    Path(built["image_manifest"]).write_text(json.dumps(described))
    venv, store = tmp_path / "venv", tmp_path / "store"
    with pytest.raises(RigError, match="free"):
        mount(built["image_manifest"], venv, root=store)
    nothing_changed(venv, store)


def test_a_venv_directory_the_link_cannot_replace_is_put_back(tmp_path, monkeypatch):
    """The directory was moved aside, then the link's rename failed: the venv path was left empty, the directory
    beside it under another name."""
    venv, where = make_venv(tmp_path / "venv"), tmp_path / "store" / NAME
    refuse(monkeypatch, "replace", venv, OSError(5, "Input/output error"), arg=1)
    with pytest.raises(OSError, match="Input/output error"):
        mounting._switch(venv, where, mounting._aside_name(venv))
    assert (venv / "pyvenv.cfg").is_file() and not venv.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["venv"]  # nothing aside, no link left beside it


# ------------------------------------------------------------------ the environment outside the image

@pytest.fixture
def hooked_image_venv(tmp_path, monkeypatch) -> Path:
    """A venv path linked (as rig links it) to a copy of a real venv that carries rig's hook: an image venv, as
    `rig env install` sees one; its site dir and run-time caches under tmp_path."""
    monkeypatch.setattr(runtime_env, "ENV_SITE_ROOT", tmp_path / "venv-env")
    monkeypatch.setattr(runtime_env, "RUNTIME_CACHE", str(tmp_path / "cache" / "runtime"))
    venv = tmp_path / "opt" / "venv"
    venv.parent.mkdir()
    inside = store_of(venv, tmp_path / "store") / NAME
    inside.parent.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(inside)], check=True)
    (runtime_env.site_packages(inside) / HOOK).write_text(hook_text(venv))
    venv.symlink_to(inside)
    return venv


@pytest.mark.parametrize("where, who, mode", [("site", 65534, 0o755), ("site", 0, 0o777), ("root", 0, 0o777),
                                              ("root", 65534, 0o755), ("cache", 0, 0o777), ("cache", 65534, 0o755)])
def test_an_environment_dir_someone_else_may_change_is_refused_and_nothing_is_written(hooked_image_venv, tmp_path,
                                                                                      where, who, mode):
    """The site dir's .pth runs at every start of the venv, as whoever starts it, and triton loads the kernels its
    cache holds: a directory another user may write (or one above it) would run their code."""
    venv = hooked_image_venv
    site = runtime_env.env_site(venv)
    target = {"site": site, "root": site.parent, "cache": Path(runtime_env.RUNTIME_CACHE).parent}[where]
    target.mkdir(parents=True)
    os.chown(target, who, -1)
    target.chmod(mode)
    with pytest.raises(RigError, match=f"{target} is (owned by uid {who}|writable by group or others)"):
        runtime_env.install(venv, ENV, "tiny")
    assert not site.exists() or list(site.iterdir()) == []
    assert not Path(runtime_env.RUNTIME_CACHE).exists()


@pytest.mark.parametrize("site_is", ["a link", "open to all"])
def test_a_former_site_dir_rig_does_not_own_is_never_emptied(tmp_path, monkeypatch, site_is):
    """A directory venv's install empties the site dir the venv had as an image: it unlinked the files there
    through a link, or in a directory anyone could have filled."""
    monkeypatch.setattr(runtime_env, "ENV_SITE_ROOT", tmp_path / "venv-env")
    venv = tmp_path / "venv"
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    site, theirs = runtime_env.env_site(venv), tmp_path / "theirs"
    theirs.mkdir()
    site.parent.mkdir()
    if site_is == "a link":
        site.symlink_to(theirs)
    else:
        theirs = site
        site.mkdir(mode=0o777)
        site.chmod(0o777)
    for name in (runtime_env.PTH, f"{runtime_env.MODULE}.py"):
        (theirs / name).write_text("kept\n")
    with pytest.raises(RigError, match="is a link or not a directory|writable by group or others"):
        runtime_env.install(venv, ENV, "tiny")
    assert sorted(p.name for p in theirs.iterdir()) == sorted([runtime_env.PTH, f"{runtime_env.MODULE}.py"])


def test_a_mount_point_too_long_for_a_unit_name_is_refused_naming_the_fix():
    """systemd names a mount unit by its escaped path, at most 255 bytes: a venv named 200 characters long made a
    name of 294, and the unit file's write failed with "File name too long"."""
    where = store_of(Path("/opt") / ("v" * 200), Path("/var/lib/rig/venv-images")) / NAME
    with pytest.raises(RigError) as refused:
        unit_name(where)
    assert "longer than the 255 bytes" in refused.value.message and "shorter" in refused.value.hint
