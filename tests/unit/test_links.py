"""Writes never follow a link out of their root: lock files, exported wheels, patch backups and targets, the
environment module. Each case was an outside attack's: a link left where rig writes, to a victim file or
directory elsewhere. The victim must come out of every run byte for byte as it went in."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harness.commands import rig
from harness.paths import REPO

PATCH = {"id": "fakepkg-fix", "summary": "a test patch", "package": "fakepkg", "needed": ">=1.0,<2",
         "file": "fakepkg/mod.py", "why": "test", "hunks": [{"find": "X = 1\n", "replace": "X = 2\n"}],
         "check": "import fakepkg.mod\nassert fakepkg.mod.X == 2\n",
         "provenance": {"mirrors": "none", "fixed_in": "none", "checked": "now", "drop_when": "never"}}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("someone else's file\n")
    return path


def venv_with_fakepkg(root: Path, site_elsewhere: Path | None = None) -> Path:
    """A venv holding fakepkg 1.0 (X = 1); its site-packages a link to SITE_ELSEWHERE when given."""
    venv = root / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    if site_elsewhere is not None:
        site.rmdir()
        site_elsewhere.mkdir()
        site.symlink_to(site_elsewhere)
    (site / "fakepkg").mkdir()
    (site / "fakepkg" / "__init__.py").write_text("")
    (site / "fakepkg" / "mod.py").write_text("X = 1\n")
    (site / "fakepkg-1.0.dist-info").mkdir()
    (site / "fakepkg-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\n")
    (site / "fakepkg-1.0.dist-info" / "RECORD").write_text("fakepkg/__init__.py,,\nfakepkg/mod.py,,\n")
    return venv


@pytest.fixture
def patch_set(tmp_path) -> Path:
    found = tmp_path / "pset"
    found.mkdir()
    (found / "fakepkg-fix.yml").write_text(yaml.safe_dump(PATCH))
    return found


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_lock_file_that_is_a_link_or_a_fifo_is_refused_and_the_victim_kept(tmp_path, victim, kind):
    prefix = tmp_path / "prefix"
    (prefix / "cuda-13.0").mkdir(parents=True)
    if kind == "link":
        (prefix / ".rig-cuda.lock").symlink_to(victim)
    else:
        os.mkfifo(prefix / ".rig-cuda.lock")
    before = digest(victim)
    done = rig("cuda", "default", "--version", "13.0", "--prefix", str(prefix), "--state-dir", str(tmp_path / "s"),
               timeout=60)
    assert done.returncode == 2 and done.stderr.count("rig: error:") == 1, done.stderr
    assert ("a link there is never followed" if kind == "link" else "is not a regular file") in done.stderr
    assert digest(victim) == before and not (prefix / "cuda").exists()


def test_wheels_export_replaces_a_link_at_its_destination_and_keeps_its_key_in_the_cache(tmp_path, victim):
    kept = tmp_path / "cache" / "built" / "k1"
    kept.mkdir(parents=True)
    (kept / "evil-1.0-py3-none-any.whl").write_bytes(b"the wheel's bytes")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "evil-1.0-py3-none-any.whl").symlink_to(victim)
    before = digest(victim)
    done = rig("wheels", "export", "k1", str(dest), "--cache", str(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr
    assert digest(victim) == before
    assert not (dest / "evil-1.0-py3-none-any.whl").is_symlink()
    assert (dest / "evil-1.0-py3-none-any.whl").read_bytes() == b"the wheel's bytes"
    climbed = rig("wheels", "export", "../../elsewhere", str(dest), "--cache", str(tmp_path / "cache"))
    assert climbed.returncode == 2 and "leads outside" in climbed.stderr


def test_patch_backups_that_are_a_link_out_are_refused_before_anything_changes(tmp_path, patch_set):
    venv = venv_with_fakepkg(tmp_path)
    outside = tmp_path / "outside-backups"
    outside.mkdir()
    (venv / ".rig-patches").symlink_to(outside)
    mod = next((venv / "lib").glob("python3*/site-packages")) / "fakepkg" / "mod.py"
    done = rig("patch", "apply", "--venv", str(venv), "--patches", str(patch_set))
    assert done.returncode == 2 and "leads outside" in done.stderr, done.stderr
    assert list(outside.iterdir()) == [] and mod.read_text() == "X = 1\n"
    (venv / ".rig-patches").unlink()  # the same venv without the link: applied, backed up inside, reverted
    assert rig("patch", "apply", "--venv", str(venv), "--patches", str(patch_set)).returncode == 0
    assert mod.read_text() == "X = 2\n" and len(list((venv / ".rig-patches").iterdir())) == 1
    assert rig("patch", "revert", "--venv", str(venv), "--patches", str(patch_set)).returncode == 0
    assert mod.read_text() == "X = 1\n"


def test_a_site_packages_that_is_a_link_out_is_neither_patched_nor_given_the_environment(tmp_path, patch_set):
    outside = tmp_path / "outside-site"
    venv = venv_with_fakepkg(tmp_path, site_elsewhere=outside)
    before = {p.name: digest(p) for p in outside.rglob("*") if p.is_file()}
    done = rig("patch", "apply", "--venv", str(venv), "--patches", str(patch_set))
    assert done.returncode == 2 and "fakepkg's install" in done.stderr and "leads outside" in done.stderr
    done = rig("env", "install", "--venv", str(venv), "--stack", str(REPO / "stacks" / "default.yml"))
    assert done.returncode == 2 and "the venv's site-packages" in done.stderr, done.stderr
    assert {p.name: digest(p) for p in outside.rglob("*") if p.is_file()} == before


def test_an_installed_version_or_a_patch_no_rig_can_read_is_named_not_a_crash(tmp_path, patch_set):
    venv = venv_with_fakepkg(tmp_path)
    metadata = next((venv / "lib").glob("python3*/site-packages")) / "fakepkg-1.0.dist-info" / "METADATA"
    metadata.write_text("Metadata-Version: 2.1\nName: fakepkg\nVersion: banana!\n")
    done = rig("patch", "status", "--venv", str(venv), "--patches", str(patch_set))
    assert done.returncode == 2 and "fakepkg is installed with version 'banana!'" in done.stderr, done.stderr
    empty = yaml.safe_load((patch_set / "fakepkg-fix.yml").read_text())
    empty["hunks"][0]["find"] = ""
    (patch_set / "fakepkg-fix.yml").write_text(yaml.safe_dump(empty))
    done = rig("patch", "status", "--venv", str(venv), "--patches", str(patch_set))
    assert done.returncode == 2 and "hunks[0].find: must not be empty" in done.stderr, done.stderr


def test_both_exports_lay_wheels_out_one_way_and_say_changed_only_when_something_changed(tmp_path, victim):
    """rig wheels export and rig wheelhouse export share rig.python.wheelhouse.lay_out: a second run changes
    nothing and says so; a link planted at the requirements file is replaced, not written through."""
    kept = tmp_path / "cache" / "built" / "k1"
    kept.mkdir(parents=True)
    (kept / "ext-1.0-py3-none-any.whl").write_bytes(b"the wheel's bytes")
    dest = tmp_path / "dest"
    argv = ["wheels", "export", "k1", str(dest), "--cache", str(tmp_path / "cache"), "--json"]
    first, second = (json.loads(rig(*argv).stdout) for _ in range(2))
    assert first["changed"] and not second["changed"]
    assert (dest / "built-requirements.txt").read_text().startswith("ext==1.0 --hash=sha256:")
    (dest / "built-requirements.txt").unlink()
    (dest / "built-requirements.txt").symlink_to(victim)
    before = digest(victim)
    third = json.loads(rig(*argv).stdout)
    assert third["changed"] and digest(victim) == before
    assert not (dest / "built-requirements.txt").is_symlink()
    (dest / "built-requirements.txt").unlink()
    (dest / "built-requirements.txt").mkdir()  # a directory there is named, and nothing is laid out
    (dest / "ext-1.0-py3-none-any.whl").unlink()
    refused = rig(*argv)
    assert refused.returncode == 2 and "built-requirements.txt is a directory" in refused.stderr
    assert not (dest / "ext-1.0-py3-none-any.whl").exists()


def test_an_export_under_check_says_what_it_would_place_and_writes_nothing(tmp_path):
    """--check of rig wheels export (and rig wheelhouse export: the same lay_out) names the files it would place,
    creates no directory and writes no file; once exported, --check says nothing would change."""
    kept = tmp_path / "cache" / "built" / "k1"
    kept.mkdir(parents=True)
    (kept / "ext-1.0-py3-none-any.whl").write_bytes(b"the wheel's bytes")
    dest = tmp_path / "dest"
    argv = ["wheels", "export", "k1", str(dest), "--cache", str(tmp_path / "cache"), "--json"]
    dry = json.loads(rig(*argv, "--check").stdout)
    assert dry["changed"] and dry["placed"] == ["ext-1.0-py3-none-any.whl", "built-requirements.txt"]
    assert dry["msg"].startswith("would place 2 file(s)") and not dest.exists()
    assert json.loads(rig(*argv).stdout)["placed"] == dry["placed"]
    (dest / "built-requirements.txt").write_text("stale\n")
    again = json.loads(rig(*argv, "--check").stdout)
    assert again["placed"] == ["built-requirements.txt"] and (dest / "built-requirements.txt").read_text() == "stale\n"
    rig(*argv)
    assert not json.loads(rig(*argv, "--check").stdout)["changed"]
