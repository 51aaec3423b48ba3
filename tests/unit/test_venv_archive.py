"""rig venv pack / unpack: a real (small) venv packed into one reproducible zstd tar and its manifest, unpacked
byte for byte (its bytecode still fresh), pulled over rig's wheel server with a cut-short download resumed, and
every mismatch or hostile input refused before anything lands at the venv path."""
from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tarfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from harness.commands import rig
from harness.os_faults import refuse
from harness.tars import header, padded, unreadable, zstd_of
from harness.venvs import LOCK, cached, flip_a_byte, make_venv, site_of

from rig.core import RigError
from rig.core import http as rig_http
from rig.python.venv import MARKER
from rig.python.venv_archive.manifest import FIXED_MTIME, fits, read_manifest
from rig.python.venv_archive.pack import pack
from rig.python.venv_archive.pull import pull, restore
from rig.python.venv_archive.tree import verify_against
from rig.python.venv_archive.unpack import unpack
from rig.python.wheel_serving import WheelServer

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd binary (apt-get install zstd)")

TAG = sys.implementation.cache_tag


@pytest.fixture
def packed(tmp_path):
    """A venv packed into tmp_path/out, then moved away: its path is free to unpack into."""
    venv = make_venv(tmp_path / "venv")
    result = pack(venv, tmp_path / "out")
    venv.rename(tmp_path / "original")
    return venv, result, read_manifest(result["manifest"])


def test_a_check_looks_at_the_archive_the_run_needs(packed):
    """`venv unpack --check` said "would unpack" where the archive was gone or not the manifest's: a check runs
    every precondition of the run and skips only the writing."""
    venv, result, manifest = packed
    assert unpack(result["archive"], manifest, venv, check=True)["msg"].startswith("would unpack")
    Path(result["archive"]).write_bytes(b"not it")
    with pytest.raises(RigError, match="is not the archive its manifest describes"):
        unpack(result["archive"], manifest, venv, check=True)
    Path(result["archive"]).unlink()
    with pytest.raises(RigError, match="the venv archive"):
        unpack(result["archive"], manifest, venv, check=True)
    assert not venv.exists() and leftovers(venv) == []


def leftovers(venv: Path) -> list[str]:
    return sorted(p.name for p in venv.parent.iterdir() if p.name.startswith(f".{venv.name}.rig-"))


def test_the_same_venv_packs_to_the_same_bytes_whatever_its_files_times(tmp_path):
    venv = make_venv(tmp_path / "venv", checked_hash=True)
    first = pack(venv, tmp_path / "one")
    assert first["changed"] and first["left_out"] == 1  # the stale pyc
    for path in [venv, *venv.rglob("*")]:
        if not path.is_symlink():
            os.utime(path, (1_700_000_000, 1_700_000_000))
    second = pack(venv, tmp_path / "two")
    assert Path(first["archive"]).name == Path(second["archive"]).name == \
        f"venv-{LOCK[:16]}-py{sys.version_info[0]}.{sys.version_info[1]}-{os.uname().machine}.tar.zst"
    for key in ("archive", "manifest"):
        assert Path(first[key]).read_bytes() == Path(second[key]).read_bytes(), key
    again = pack(venv, tmp_path / "one")
    assert again["changed"] is False and again["sha256"] == first["sha256"]


def test_an_archive_changed_at_its_size_is_packed_again(tmp_path):
    """A pack that finds its archive already made hashes it: one of the manifest's size whose bytes changed (a
    disk's error, a copy cut and padded) was taken as made."""
    venv = make_venv(tmp_path / "venv")
    first = pack(venv, tmp_path / "out")
    before = flip_a_byte(Path(first["archive"]))
    again = pack(venv, tmp_path / "out")
    assert again["changed"] and Path(first["archive"]).read_bytes() == before


def test_an_unpacked_venv_is_the_packed_one_and_its_fresh_bytecode_stays_fresh(packed):
    venv, result, manifest = packed
    done = unpack(result["archive"], manifest, venv)
    assert done["changed"] and verify_against(venv, manifest) == {"ok": True, "differs": [],
                                                                  "entries": len(manifest["entries"])}
    package = site_of(venv) / "tiny"
    pyc = cached(package / "__init__.py")
    assert struct.unpack("<I", pyc.read_bytes()[8:12])[0] == FIXED_MTIME
    assert (package / "__init__.py").stat().st_mtime == FIXED_MTIME
    before = (pyc.read_bytes(), pyc.stat().st_mtime_ns)
    ran = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys, tiny; print(tiny.VALUE, sys.prefix)"],
                         capture_output=True, text=True, check=True)
    assert ran.stdout.split() == ["42", str(venv)]
    assert (pyc.read_bytes(), pyc.stat().st_mtime_ns) == before  # Python took it as fresh: not written again
    stale = cached(package / "stale.py")
    assert not stale.exists() and str(stale.relative_to(venv)) not in {e[1] for e in manifest["entries"]}
    assert os.stat(venv / "bin" / "tool").st_mode & 0o777 == 0o755
    assert os.readlink(venv / "bin" / "python3") == os.readlink(venv.parent / "original" / "bin" / "python3")
    assert leftovers(venv) == []
    assert unpack(result["archive"], manifest, venv)["changed"] is False  # its marker has the lock
    (venv / "extra.txt").write_text("x")
    (package / "blob.bin").write_bytes(b"changed")
    assert verify_against(venv, manifest)["differs"] == ["lib/python3.{}/site-packages/tiny/blob.bin: its bytes "
                                                         "differ from the archive's".format(sys.version_info[1]),
                                                         "extra.txt: not in the archive"]


def old_venv(venv: Path) -> Path:
    """A venv of another lock at VENV, which a refused unpack must leave as it is."""
    venv.mkdir()
    (venv / MARKER).write_text(json.dumps({"lock_hash": "b" * 64, "packages": ["a==1"]}))
    (venv / "keep.txt").write_text("old")
    return venv


def test_an_archive_whose_bytes_differ_is_refused_before_anything_is_written(packed):
    venv, result, manifest = packed
    data = bytearray(Path(result["archive"]).read_bytes())
    data[len(data) // 2] ^= 1
    Path(result["archive"]).write_bytes(bytes(data))
    with pytest.raises(RigError, match="is not the archive its manifest describes"):
        unpack(result["archive"], manifest, venv)
    assert not venv.exists() and leftovers(venv) == []
    old_venv(venv)
    with pytest.raises(RigError, match="is not the archive its manifest describes"):
        unpack(result["archive"], manifest, venv)
    assert (venv / "keep.txt").read_text() == "old" and leftovers(venv) == []


def _sha_changed(entries):
    file = next(e for e in entries if e[1].endswith("blob.bin"))
    file[4] = "0" * 64


def _extra(entries):
    entries.append(["link", "zzz-extra", 0o777, None, "nowhere"])


def _missing(entries):
    entries.remove(next(e for e in entries if e[1] == "bin/tool"))


@pytest.mark.parametrize("change, said", [(_sha_changed, "is not the file its manifest describes"),
                                          (_extra, "ends before 'zzz-extra'"),
                                          (_missing, "member 'bin/tool' \\(file\\) is not its manifest's")])
def test_a_manifest_that_does_not_describe_its_archive_stops_the_unpack_and_nothing_changes(packed, change, said):
    venv, result, manifest = packed
    change(manifest["entries"])
    manifest = read_manifest(json.dumps(manifest).encode())  # still a well-formed manifest
    old_venv(venv)
    with pytest.raises(RigError, match=said):
        unpack(result["archive"], manifest, venv)
    assert sorted(p.name for p in venv.iterdir()) == [MARKER, "keep.txt"] and leftovers(venv) == []


def test_a_manifest_of_another_lock_python_or_path_does_not_fit(packed, tmp_path):
    venv, result, manifest = packed
    other = "c" * 64
    with pytest.raises(RigError, match=f"it holds lock {LOCK[:16]}, not {other[:16]}"):
        unpack(result["archive"], manifest, venv, lock_hash=other)
    assert not venv.exists()
    assert fits(manifest, LOCK, venv) is None
    assert "it was packed at" in fits(manifest, LOCK, tmp_path / "elsewhere")
    assert "it is for Python 2.7" in fits({**manifest, "python": "2.7.18"}, None, venv)
    assert "it is for sparc" in fits({**manifest, "arch": "sparc"}, None, venv)
    assert "packed on glibc 9.99" in fits({**manifest, "glibc": "9.99"}, None, venv)
    assert fits({**manifest, "glibc": "2.1"}, None, venv) is None  # an older glibc's wheels run on a newer one


def test_a_pull_cut_short_resumes_from_its_part_and_a_corrupt_part_is_removed(packed, tmp_path):
    _, result, manifest = packed
    served, name = Path(result["archive"]).parent, manifest["archive"]["name"]
    data = Path(result["archive"]).read_bytes()
    half = len(data) // 2
    dest = tmp_path / "dest"
    dest.mkdir()
    part = dest / f"{name}.tar.zst.part"
    part.write_bytes(data[:half])
    with WheelServer(served, "127.0.0.1") as server:
        got = pull(f"{server.url}{name}.manifest.json", dest)
        sent = server.bytes_sent
    assert got.read_bytes() == data and not part.exists()
    assert sent == Path(result["manifest"]).stat().st_size + len(data) - half  # only the rest of the archive
    assert (dest / f"{name}.manifest.json").read_bytes() == Path(result["manifest"]).read_bytes()

    got.unlink()
    part.write_bytes(b"\0" * half)
    with WheelServer(served, "127.0.0.1") as server, \
            pytest.raises(RigError, match="is not the archive its manifest describes"):
        pull(server.url, dest, {"lock_hash": LOCK})  # the directory's URL: the name follows from the lock
    assert not part.exists() and not got.exists()


def test_a_server_that_ignores_the_range_is_answered_by_starting_over(packed, tmp_path):
    _, result, manifest = packed
    served, name = Path(result["archive"]).parent, manifest["archive"]["name"]
    data = Path(result["archive"]).read_bytes()
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / f"{name}.tar.zst.part").write_bytes(b"\0" * 100)  # wrong, but the server sends it all
    handler = lambda *a, **kw: QuietHandler(*a, directory=str(served), **kw)  # noqa: E731
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as plain:
        threading.Thread(target=plain.serve_forever, daemon=True).start()
        try:
            got = pull(f"http://127.0.0.1:{plain.server_address[1]}/{name}.manifest.json", tmp_path / "dest")
        finally:
            plain.shutdown()
    assert got.read_bytes() == data


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *_):
        pass


def test_the_wheel_server_serves_the_rest_of_a_file_from_a_byte_on(tmp_path):
    (tmp_path / "f.bin").write_bytes(b"0123456789")
    with WheelServer(tmp_path, "127.0.0.1") as server:
        ask = urllib.request.Request(server.url + "f.bin", headers={"Range": "bytes=4-"})
        with urllib.request.urlopen(ask, timeout=10) as answer:
            assert (answer.status, answer.headers["Content-Range"], answer.read()) == (206, "bytes 4-9/10", b"456789")
        with pytest.raises(urllib.error.HTTPError) as beyond:
            urllib.request.urlopen(urllib.request.Request(server.url + "f.bin", headers={"Range": "bytes=10-"}),
                                   timeout=10)
        assert beyond.value.code == 416 and beyond.value.headers["Content-Range"] == "bytes */10"
        other = urllib.request.Request(server.url + "f.bin", headers={"Range": "bytes=2-3"})  # not served: all of it
        with urllib.request.urlopen(other, timeout=10) as answer:
            assert (answer.status, answer.read()) == (200, b"0123456789")
        assert server.bytes_sent == 6 + 10


def test_three_hosts_pull_and_unpack_at_once_from_one_server(tmp_path):
    served = tmp_path / "served"
    venvs = [tmp_path / f"venv{i}" for i in range(3)]
    for i, venv in enumerate(venvs):
        pack(make_venv(venv, lock=str(i) * 64), served)
        venv.rename(tmp_path / f"original{i}")
    with WheelServer(served, "127.0.0.1") as server, ThreadPoolExecutor(3) as pool:
        # the first by its manifest's URL, the others by the directory's, their lock naming the archive there
        first = server.url + next(served.glob("venv-" + "0" * 16 + "-*.manifest.json")).name
        results = list(pool.map(lambda i: restore(server.url if i else first, venvs[i], lock_hash=str(i) * 64 if i
                                                  else None), range(3)))
    assert [r["changed"] for r in results] == [True] * 3
    for i, venv in enumerate(venvs):
        manifest = read_manifest(next(served.glob(f"venv-{str(i) * 16}-*.manifest.json")))
        assert verify_against(venv, manifest)["ok"] and leftovers(venv) == []


def hostile(tmp_path: Path, venv: Path, manifest: dict, members: list[tuple[str, str, bytes | str]]) -> tuple:
    """An archive of MEMBERS (kind, name, bytes or link text) as a hostile packer would make it, with a manifest
    that lists them exactly, its archive's hash right: only the members' own names and order can refuse it."""
    raw = io.BytesIO()
    entries = []
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for kind, name, data in members:
            info = tarfile.TarInfo(name)
            if kind == "link":
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, str(data), 0o777
                tar.addfile(info)
                entries.append(["link", name, 0o777, None, str(data)])
            else:
                assert isinstance(data, bytes)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
                entries.append(["file", name, 0o644, len(data), hashlib.sha256(data).hexdigest()])
    archive = tmp_path / "hostile.tar.zst"
    archive.write_bytes(subprocess.run(["zstd", "-q", "-c"], input=raw.getvalue(), capture_output=True,
                                       check=True).stdout)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    return archive, {**manifest, "archive": {**manifest["archive"], "sha256": digest, "size": archive.stat().st_size},
                     "entries": entries}


@pytest.mark.parametrize("path", ["../x", "/tmp/x", "lib/../../x", "a\0b"])
def test_a_manifest_path_outside_the_venv_is_refused(packed, path):
    _, _, manifest = packed
    manifest["entries"][0][1] = path
    with pytest.raises(RigError, match="is not a relative path inside the venv"):
        read_manifest(json.dumps(manifest).encode())


def test_a_member_outside_the_staging_dir_is_refused_and_nothing_is_written_outside(packed, tmp_path):
    venv, _, manifest = packed
    archive, evil = hostile(tmp_path, venv, manifest, [("file", "../escaped", b"owned")])
    with pytest.raises(RigError, match="leads outside"):
        unpack(archive, evil, venv)
    assert not (tmp_path / "escaped").exists() and not venv.exists() and leftovers(venv) == []


def test_a_file_after_a_link_is_refused_and_nothing_is_written_through_the_link(packed, tmp_path):
    venv, _, manifest = packed
    outside = tmp_path / "outside"
    outside.mkdir()
    archive, evil = hostile(tmp_path, venv, manifest, [("link", "lnk", str(outside)), ("file", "lnk/owned", b"x")])
    with pytest.raises(RigError, match="comes after a link|not listed before it"):
        read_manifest(json.dumps(evil).encode())
    with pytest.raises(RigError, match="comes after a link: the links come last"):
        unpack(archive, evil, venv)  # the manifest handed over unchecked: the members' order still refuses it
    assert list(outside.iterdir()) == [] and not venv.exists() and leftovers(venv) == []


def test_a_fifo_in_the_venv_is_named_and_nothing_is_packed(tmp_path):
    venv = make_venv(tmp_path / "venv")
    os.mkfifo(venv / "lib" / "pipe")
    with pytest.raises(RigError, match=f"{venv}/lib/pipe is a FIFO, a socket or a device"):
        pack(venv, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_venv_rig_did_not_install_is_not_packed(tmp_path):
    venv = make_venv(tmp_path / "venv")
    (venv / MARKER).unlink()
    with pytest.raises(RigError, match="pack a venv rig installed"):
        pack(venv, tmp_path / "out")


def test_the_commands_pack_unpack_and_verify_against_the_manifest(tmp_path):
    venv = make_venv(tmp_path / "venv")
    done = rig("venv", "pack", "--venv", str(venv), "--out", str(tmp_path / "out"), "--json")
    assert done.returncode == 0, done.stderr
    manifest = json.loads(done.stdout)["manifest"]
    venv.rename(tmp_path / "original")
    dry = rig("venv", "unpack", "--manifest", manifest, "--venv", str(venv), "--check", "--json")
    assert json.loads(dry.stdout)["changed"] is True and not venv.exists()
    done = rig("venv", "unpack", "--manifest", manifest, "--venv", str(venv), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["changed"] is True, done.stderr
    # the marker's "a==1" is not installed (a test venv), so verify judges it failed; the files are as packed
    checked = rig("venv", "verify", "--venv", str(venv), "--manifest", manifest, "--json")
    assert checked.returncode == 1 and json.loads(checked.stdout)["archive"]["ok"] is True


# ------------------------------------------------------------------ a hostile user's inputs, each once a defect

def marker_of(lock: str = LOCK) -> bytes:
    return json.dumps({"lock_hash": lock, "packages": ["a==1"]}).encode()


def crafted(tmp_path: Path, manifest: dict, archive_bytes: bytes, entries: list) -> tuple[Path, dict]:
    """ARCHIVE_BYTES as the archive of MANIFEST listing ENTRIES, its sha256 and size right."""
    archive = tmp_path / "crafted.tar.zst"
    archive.write_bytes(archive_bytes)
    return archive, {**manifest, "entries": entries, "archive": {**manifest["archive"], "size": len(archive_bytes),
                                                                  "sha256": hashlib.sha256(archive_bytes).hexdigest()}}


def tar_of(*files: tuple[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def file_entry(name: str, data: bytes) -> list:
    return ["file", name, 0o644, len(data), hashlib.sha256(data).hexdigest()]


@pytest.mark.parametrize("change, said", [
    (lambda m: m["entries"][0].__setitem__(2, 420.0), "mode 420.0 is not one rig packs"),  # then oct() crashed verify
    (lambda m: m.update(glibc="9" * 5000 + ".1"), "is not a glibc version"),  # then int() of 5000 digits crashed fits
    (lambda m: m["entries"][0].__setitem__(1, "\udcff"), "is not a relative path inside the venv"),  # not UTF-8
    (lambda m: m["entries"][0].__setitem__(1, "bin\x1b]0;owned\x07"), "is not a relative path inside the venv"),
    (lambda m: m["entries"].append(["link", "zz", 0o777, None, "\udcff"]), "its link text, one line of UTF-8"),
])
def test_a_manifest_field_rig_never_writes_is_one_error(packed, change, said):
    _, _, manifest = packed
    change(manifest)
    with pytest.raises(RigError, match=said):
        read_manifest(json.dumps(manifest).encode())


def test_a_source_that_is_no_url_is_one_error_not_a_crash(tmp_path):
    with pytest.raises(RigError, match="neither a file nor a URL"):
        read_manifest("http://[::1/venv.manifest.json")
    with pytest.raises(RigError, match="not a URL"):
        rig_http.download("http://[::1/x", io.BytesIO(), "x", 10, 5)


@pytest.mark.parametrize("make", [lambda venv: (venv / "a\nb").write_text("x"),
                                  lambda venv: (venv / "lib" / "l").symlink_to("one\ntwo")])
def test_pack_refuses_a_name_or_link_its_manifest_could_not_hold_and_writes_nothing(tmp_path, make):
    venv = make_venv(tmp_path / "venv")
    make(venv)
    with pytest.raises(RigError, match="holds a control character"):
        pack(venv, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_pack_refuses_an_out_dir_that_links_into_the_venv(tmp_path):
    venv = make_venv(tmp_path / "venv")
    (tmp_path / "out").symlink_to(venv / "lib")
    with pytest.raises(RigError, match="is inside the venv"):
        pack(venv, tmp_path / "out")
    assert sorted(p.name for p in (venv / "lib").iterdir()) == [f"python{sys.version_info[0]}.{sys.version_info[1]}"]


def unpacks_to_nothing(archive: Path, manifest: dict, venv: Path, said: str) -> None:
    """unpack refuses, in a thread that must end (a defect here once waited for good), leaving nothing."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            unpack(archive, manifest, venv)
        except BaseException as exc:  # noqa: BLE001 - judged below
            failed.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "unpack hung"
    assert len(failed) == 1 and isinstance(failed[0], RigError) and said in str(failed[0]), failed
    assert not venv.exists() and leftovers(venv) == []


def test_tar_headers_that_crashed_or_hung_tarfile_are_refused(packed, tmp_path):
    venv, _, manifest = packed
    marker = marker_of()
    entries = [file_entry(".rig-stack.json", marker)]
    member = tar_of((".rig-stack.json", marker))
    pax = b"20 comment=xxxxxxxx\n"
    chained = (header("pax", tarfile.XHDTYPE, len(pax)) + pax + b"\0" * (512 - len(pax))) * 2000 + member
    huge = header("pax", tarfile.XHDTYPE, 8 << 20) + b"\0" * (8 << 20) + member  # read whole into memory
    sparse = io.BytesIO()
    with tarfile.open(fileobj=sparse, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(".rig-stack.json")
        info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}  # its map: garbage (ValueError)
        tar.addfile(info, io.BytesIO(b""))
    garbage = b"\xff" * 512 + random.Random(2).randbytes(1 << 20)  # zstd still writing as tarfile gives up
    after_end = header(".rig-stack.json", tarfile.REGTYPE, len(marker)) + padded(marker) + \
        unreadable("bin/evil", b"#!/bin/sh\n") + bytes(1024)
    for raw, said in [(chained, "not a tar as rig packs it"), (huge, "not a tar as rig packs it"),
                      (sparse.getvalue(), "not a tar as rig packs it"), (garbage, "not a tar as rig packs it"),
                      (member + b"\0" * (64 << 20), "after the tar's end"),  # 64 MiB of zstd's zeros: a bomb
                      (after_end, "bytes other than zeros after its last member")]:
        archive, evil = crafted(tmp_path, manifest, zstd_of(raw), entries)
        unpacks_to_nothing(archive, evil, venv, said)


def test_a_link_under_a_link_is_refused_even_when_the_manifest_was_not_checked(packed, tmp_path):
    venv, _, manifest = packed
    outside = tmp_path / "outside"
    outside.mkdir()
    archive, evil = hostile(tmp_path, venv, manifest, [("link", "lnk", str(outside)), ("link", "lnk/owned", "x")])
    with pytest.raises(RigError, match="not listed before it"):
        read_manifest(json.dumps(evil).encode())
    with pytest.raises(RigError, match="lies under a link of the archive"):
        unpack(archive, evil, venv)
    assert list(outside.iterdir()) == [] and not venv.exists() and leftovers(venv) == []


@pytest.mark.parametrize("members, said", [([], "is missing"), ([("file", MARKER, marker_of("b" * 64))],
                                                                 f"names lock {'b' * 16}")])
def test_an_archive_whose_marker_is_not_its_manifests_lock_is_refused(packed, tmp_path, members, said):
    venv, _, manifest = packed
    archive, evil = hostile(tmp_path, venv, manifest, [("file", "x.txt", b"x"), *members])
    old_venv(venv)
    with pytest.raises(RigError, match=said):
        unpack(archive, read_manifest(json.dumps(evil).encode()), venv)
    assert sorted(p.name for p in venv.iterdir()) == [MARKER, "keep.txt"] and leftovers(venv) == []


def test_unpack_refuses_a_directory_that_is_no_venv_and_a_parent_that_is_no_directory(packed, tmp_path):
    venv, result, manifest = packed
    venv.mkdir()
    (venv / "thesis.tex").write_text("years of work")
    with pytest.raises(RigError, match="holds files but is no venv"):
        unpack(result["archive"], manifest, venv, check=True)
    with pytest.raises(RigError, match="holds files but is no venv"):
        unpack(result["archive"], manifest, venv)
    assert (venv / "thesis.tex").read_text() == "years of work"
    for above in (tmp_path / "file", tmp_path / "dangling"):
        if above.name == "file":
            above.write_text("x")
        else:
            above.symlink_to(tmp_path / "nowhere")
        inner = above / "venv"
        with pytest.raises(RigError, match=f"{above} is not a directory"):
            unpack(result["archive"], {**manifest, "venv": str(inner)}, inner)
    assert not (tmp_path / "nowhere").exists()
    with pytest.raises(RigError, match="is the root directory"):
        unpack(result["archive"], {**manifest, "venv": "/"}, "/")


def test_an_old_venv_that_cannot_move_aside_leaves_nothing_behind(packed, monkeypatch):
    venv, result, manifest = packed
    old_venv(venv)
    refuse(monkeypatch, "rename", venv, PermissionError(13, "Permission denied"))
    with pytest.raises(RigError, match="cannot move the old venv"):
        unpack(result["archive"], manifest, venv)
    assert (venv / "keep.txt").read_text() == "old" and leftovers(venv) == []


def test_a_new_venv_that_cannot_take_the_old_ones_place_puts_the_old_one_back(packed, monkeypatch):
    venv, result, manifest = packed
    old_venv(venv)
    refuse(monkeypatch, "replace", venv, OSError(28, "No space left on device"), arg=1)
    with pytest.raises(OSError, match="No space left"):
        unpack(result["archive"], manifest, venv)
    assert (venv / "keep.txt").read_text() == "old" and leftovers(venv) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root removes a read-only directory's files anyway")
def test_an_old_venv_with_a_read_only_directory_is_removed_whole(packed):
    venv, result, manifest = packed
    old_venv(venv)
    (venv / "ro" / "deep").mkdir(parents=True)
    (venv / "ro" / "deep" / "f").write_text("x")
    os.chmod(venv / "ro" / "deep", 0)
    os.chmod(venv / "ro", 0o555)
    unpack(result["archive"], manifest, venv)
    assert leftovers(venv) == []


class Scripted(http.server.BaseHTTPRequestHandler):
    """The manifest as served, then the archive as the test's SCRIPT answers (status, headers, body)."""
    protocol_version = "HTTP/1.0"

    def log_message(self, *_):
        pass

    def do_GET(self):
        if self.path.endswith(".manifest.json"):
            status, headers, body = 200, {}, self.server.manifest
        else:
            status, headers, body = self.server.script(self.headers.get("Range"))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def scripted(manifest: bytes, script) -> Iterator[str]:
    """A server that answers MANIFEST, and SCRIPT(request) for anything else, while the block runs: its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    server.manifest, server.script = manifest, script  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


def test_a_download_cut_short_keeps_its_part_a_part_no_server_can_finish_goes(packed, tmp_path):
    _, result, manifest = packed
    name, data = manifest["archive"]["name"], Path(result["archive"]).read_bytes()
    served = Path(result["manifest"]).read_bytes()
    dest = tmp_path / "dest"
    part = dest / f"{name}.tar.zst.part"
    with scripted(served, lambda _: (200, {}, data[:1000])) as server_url:  # no length, closed after 1000 bytes
        with pytest.raises(RigError, match="ended after 1000 of the archive's"):
            pull(f"{server_url}{name}.manifest.json", dest)
    assert part.read_bytes() == data[:1000]  # it was removed as "not the archive" before
    with scripted(served, lambda _: (416, {"Content-Range": "bytes */500"}, b"")) as server_url:
        with pytest.raises(RigError, match="the partial download is removed"):
            pull(f"{server_url}{name}.manifest.json", dest)
    assert not part.exists()  # it stayed, so that every later run got 416 again


def test_a_failed_pull_leaves_no_pull_dir_and_a_redirect_is_named(packed):
    venv, result, manifest = packed
    name = manifest["archive"]["name"]
    served = Path(result["manifest"]).read_bytes()
    with scripted(served, lambda _: (302, {"Location": "http://elsewhere.example/a"}, b"")) as server_url:
        with pytest.raises(RigError, match="rig does not follow redirects"):
            restore(f"{server_url}{name}.manifest.json", venv)
    assert not venv.exists() and leftovers(venv) == []  # an empty .part and the pull dir were left


def test_an_archive_pulled_whole_that_does_not_unpack_leaves_no_pull_dir(packed, tmp_path):
    venv, result, manifest = packed
    evil = zstd_of(tar_of((MARKER, marker_of())))  # the manifest's hash, not its entries
    _, lying = crafted(tmp_path, manifest, evil, manifest["entries"])
    with scripted(json.dumps(lying).encode(), lambda _: (200, {}, evil)) as server_url:
        with pytest.raises(RigError, match="ends before 'bin', which its manifest lists"):
            restore(f"{server_url}{manifest['archive']['name']}.manifest.json", venv)
    assert not venv.exists() and leftovers(venv) == []


def test_a_pull_dir_that_is_a_link_is_refused_and_nothing_is_written_through_it(packed, tmp_path):
    venv, result, manifest = packed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (venv.parent / f".{venv.name}.rig-pull").symlink_to(elsewhere)
    with WheelServer(Path(result["archive"]).parent, "127.0.0.1") as server, \
            pytest.raises(RigError, match="is a link or not a directory; rig pulls only into a directory of its own"):
        restore(f"{server.url}{manifest['archive']['name']}.manifest.json", venv)
    assert list(elsewhere.iterdir()) == [] and not venv.exists()


def test_the_wheel_server_never_waits_on_a_fifo_asked_for_by_range(tmp_path, monkeypatch):
    os.mkfifo(tmp_path / "p.bin")
    monkeypatch.setattr(Path, "is_file", lambda self: True)  # a file when send_head looked, a FIFO when opened
    with WheelServer(tmp_path, "127.0.0.1") as server, pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(server.url + "p.bin", headers={"Range": "bytes=1-"}), timeout=10)
    assert refused.value.code == 404
