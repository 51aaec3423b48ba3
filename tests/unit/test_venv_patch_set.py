"""A venv archive or image carries the rig patch set its venv holds: `rig venv pack --patched` records it once the
venv is checked to hold it exactly, the image copies it, and a host asking for another set (or none) takes neither,
refused before anything is pulled. `rig patch apply` on a read-only venv (a mounted image) that would change it is
refused, said; one it would not change is a no-op."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from harness.commands import rig
from harness.venvs import make_venv, site_of

from rig.core import RigError
from rig.patches import actions
from rig.patches.actions import apply
from rig.patches.env import environment
from rig.patches.patchset import identity, load

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd binary (apt-get install zstd)")

PROVENANCE = {"mirrors": "none", "fixed_in": "none", "checked": "2026-12-07", "drop_when": "never"}


def patch_file(directory: Path, pid: str, replace: str, **more) -> None:
    directory.mkdir(exist_ok=True)
    (directory / f"{pid}.yml").write_text(yaml.safe_dump({
        "id": pid, "summary": "a test patch", "package": "tiny", "needed": ">=1.0,<2", "file": "tiny/__init__.py",
        "why": "test", "hunks": [{"find": "VALUE = 42\n", "replace": replace}], "check": "pass",
        "provenance": PROVENANCE, **more}))


@pytest.fixture
def venv(tmp_path) -> Path:
    """make_venv's venv, its package `tiny` installed as tiny 1.0 (metadata importlib reads)."""
    made = make_venv(tmp_path / "venv")
    info = site_of(made) / "tiny-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n")
    (info / "RECORD").write_text("")
    return made


def ran(*argv: str) -> dict:
    """rig ARGV --json: its object, with its exit status (rc) and its error's words as msg."""
    done = rig(*argv, "--json")
    said = json.loads(done.stdout or "{}")
    return {"rc": done.returncode, **said, "msg": said.get("msg") or said.get("error", done.stderr)}


def test_the_identity_is_what_decides_the_bytes_not_the_prose(tmp_path):
    patch_file(tmp_path / "a", "tiny-value", "VALUE = 43\n")
    patch_file(tmp_path / "b", "tiny-value", "VALUE = 43\n", why="reworded", summary="another summary")
    patch_file(tmp_path / "c", "tiny-value", "VALUE = 44\n")
    patch_file(tmp_path / "c", "tiny-opt", "VALUE = 45\n", opt_in="free-off", file="tiny/other.py")
    one, reworded, changed = (identity(load(tmp_path / d), frozenset()) for d in "abc")
    assert one == reworded and one["ids"] == ["tiny-value"] and one["opt_in"] == []
    assert changed["sha256"] != one["sha256"] and changed["ids"] == ["tiny-value"]  # the opt-in one not asked
    opted = identity(load(tmp_path / "c"), frozenset({"free-off"}))
    assert opted["ids"] == ["tiny-opt", "tiny-value"] and opted["opt_in"] == ["free-off"]
    assert opted["sha256"] != changed["sha256"]


def test_pack_records_the_patch_set_only_once_the_venv_holds_it_and_hosts_asking_another_are_refused(tmp_path, venv):
    patches, out = tmp_path / "set", tmp_path / "out"
    patch_file(patches, "tiny-value", "VALUE = 43\n")
    refused = ran("venv", "pack", "--venv", str(venv), "--out", str(out), "--patched", "--patches", str(patches))
    assert refused["rc"] != 0 and "does not hold rig's patch set as asked: an apply would apply tiny-value" in \
        refused["msg"] and not out.exists(), refused
    assert ran("patch", "apply", "--venv", str(venv), "--patches", str(patches))["changed"]
    packed = ran("venv", "pack", "--venv", str(venv), "--out", str(out), "--patched", "--patches", str(patches))
    assert packed["rc"] == 0 and packed["changed"], packed
    recorded = json.loads(Path(packed["manifest"]).read_text())["patches"]
    assert recorded == identity(load(patches), frozenset())
    # the same venv packed without --patched records none: another archive, not a no-op
    assert ran("venv", "pack", "--venv", str(venv), "--out", str(out))["changed"]
    assert json.loads(Path(packed["manifest"]).read_text())["patches"] is None
    packed = ran("venv", "pack", "--venv", str(venv), "--out", str(out), "--patched", "--patches", str(patches))
    moved = tmp_path / "elsewhere"
    os.rename(venv, moved)
    # another set (an opt-in asked for), or none, is refused before anything is written at the venv's path
    patch_file(patches, "tiny-opt", "X = 1\n", opt_in="free-off", file="tiny/stale.py")
    for asked, said in ((["--unpatched"], "the host asks for no rig patch set"),
                        (["--patched", "--opt-in", "free-off"], "(2 patches, opt-in free-off)")):
        no = ran("venv", "unpack", "--venv", str(venv), "--manifest", packed["manifest"], "--patches", str(patches),
                 *asked)
        assert no["rc"] != 0 and "does not fit" in no["msg"] and said in no["msg"] and "carries rig patch set" in \
            no["msg"] and not os.path.lexists(venv), no
    took = ran("venv", "unpack", "--venv", str(venv), "--manifest", packed["manifest"], "--patches", str(patches),
               "--patched")
    assert took["rc"] == 0 and took["changed"], took
    assert (site_of(venv) / "tiny" / "__init__.py").read_text() == "VALUE = 43\n"
    # the unpacked venv holds the set: an apply is a no-op
    assert not ran("patch", "apply", "--venv", str(venv), "--patches", str(patches))["changed"]
    assert ran("venv", "unpack", "--venv", str(tmp_path / "v2"), "--manifest", packed["manifest"], "--opt-in",
               "free-off")["rc"] == 2  # --opt-in names patches: only with --patched


@pytest.mark.skipif(shutil.which("mksquashfs") is None, reason="needs mksquashfs (apt install squashfs-tools)")
def test_the_image_carries_its_archives_patch_set_and_mount_refuses_another_before_anything(tmp_path, venv):
    patches = tmp_path / "set"
    patch_file(patches, "tiny-value", "VALUE = 43\n")
    ran("patch", "apply", "--venv", str(venv), "--patches", str(patches))
    packed = ran("venv", "pack", "--venv", str(venv), "--out", str(tmp_path / "out"), "--patched", "--patches",
                 str(patches))
    imaged = ran("venv", "image", "--manifest", packed["manifest"], "--out", str(tmp_path / "images"))
    assert json.loads(Path(imaged["image_manifest"]).read_text())["patches"] == \
        json.loads(Path(packed["manifest"]).read_text())["patches"]
    store = tmp_path / "store"
    refused = ran("venv", "mount", "--venv", str(venv), "--image-manifest", imaged["image_manifest"], "--store",
                  str(store), "--unpatched")
    assert refused["rc"] == 2 and "does not fit" in refused["msg"] and "the host asks for no rig patch set" in \
        refused["msg"] and not store.exists(), refused


def test_apply_on_a_read_only_venv_is_refused_where_it_would_change_it_and_a_no_op_where_not(tmp_path, venv,
                                                                                             monkeypatch):
    patches = tmp_path / "set"
    patch_file(patches, "tiny-value", "VALUE = 43\n")
    env, found, _ = environment(str(venv), None, None, patches)
    target = site_of(venv) / "tiny" / "__init__.py"
    real = os.statvfs

    class ReadOnly:
        def __init__(self, path) -> None:
            self.f_flag = real(path).f_flag | (os.ST_RDONLY if Path(path) == env.prefix else 0)

    monkeypatch.setattr(actions.os, "statvfs", ReadOnly)
    for check in (True, False):
        with pytest.raises(RigError, match="is read-only .* would apply tiny-value; nothing was changed") as said:
            apply(env, found, check=check)
        assert "python_stack_patches" in str(said.value) and target.read_text() == "VALUE = 42\n"
    monkeypatch.undo()
    apply(env, found)
    monkeypatch.setattr(actions.os, "statvfs", ReadOnly)
    assert not apply(env, found)["changed"] and not apply(env, found, check=True)["changed"]
