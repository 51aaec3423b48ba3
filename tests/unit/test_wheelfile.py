"""rig.core.wheelfile, the one zip reader: what every wheel rig opens (audit, the toolkit from NVIDIA's wheels,
validate's patch check, uv, the tools) is held to, and the callers that go through it."""
from __future__ import annotations

import os
import stat
import zipfile

import pytest

from rig.core import RigError, wheelfile


def make(path, members: dict, modes: dict | None = None):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (modes or {}).get(name, 0o644) << 16
            archive.writestr(info, data)
    return path


def test_members_are_read_and_unpacked_with_pips_modes(tmp_path):
    wheel = make(tmp_path / "w-1.0-py3-none-any.whl", {"bin/tool": b"#!", "w/a.txt": b"a" * 1000},
                 {"bin/tool": 0o744})
    with wheelfile.opened(wheel) as archive:
        assert wheelfile.read(archive, "w/a.txt") == b"a" * 1000
        tool = wheelfile.unpack(archive, "bin/tool", tmp_path / "out")
        renamed = wheelfile.unpack(archive, "w/a.txt", tmp_path / "out", "lib64/a.txt")
    assert stat.S_IMODE(tool.stat().st_mode) == 0o755 and stat.S_IMODE(renamed.stat().st_mode) == 0o644
    assert renamed == (tmp_path / "out" / "lib64" / "a.txt").resolve() and renamed.read_bytes() == b"a" * 1000


def test_a_member_larger_than_the_limit_or_than_its_header_says_is_refused(tmp_path):
    wheel = make(tmp_path / "big.whl", {"k.cubin": b"\0" * 5000})
    with wheelfile.opened(wheel) as archive:
        with pytest.raises(RigError, match="big.whl: its member k.cubin is larger than 4096 bytes; refusing it"):
            wheelfile.read(archive, "k.cubin", limit=4096)
        info = archive.getinfo("k.cubin")
        info.file_size = 10  # a header that lies: the bytes past its claim fail the member's CRC
        with pytest.raises(RigError, match="big.whl: its member k.cubin cannot be read .*damaged or crafted"):
            wheelfile.read(archive, info)


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "a/../../escape"])
def test_a_member_leading_out_of_its_root_is_refused_and_nothing_is_written(tmp_path, name):
    wheel = make(tmp_path / "evil.whl", {name: b"x"})
    with wheelfile.opened(wheel) as archive, pytest.raises(RigError, match="evil.whl: member"):
        wheelfile.unpack(archive, archive.infolist()[0], tmp_path / "root")
    assert not (tmp_path / "escape").exists() and not list(tmp_path.rglob("passwd"))


def test_a_link_at_the_target_is_never_written_through(tmp_path):
    wheel = make(tmp_path / "w.whl", {"lib/libx.so": b"payload"})
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / "root" / "lib").mkdir(parents=True)
    (tmp_path / "root" / "lib" / "libx.so").symlink_to(victim)
    with wheelfile.opened(wheel) as archive, pytest.raises(RigError, match="link"):
        wheelfile.unpack(archive, "lib/libx.so", tmp_path / "root")
    assert victim.read_bytes() == b"keep"


def test_a_damaged_archive_a_missing_member_and_a_fifo_are_each_one_named_error(tmp_path):
    (tmp_path / "cut.whl").write_bytes(make(tmp_path / "whole.whl", {"a": b"x" * 100}).read_bytes()[:60])
    with pytest.raises(RigError, match=r"cut.whl is not a readable wheel \(.*\); it is damaged or crafted"):
        with wheelfile.opened(tmp_path / "cut.whl"):
            pass
    with wheelfile.opened(tmp_path / "whole.whl") as archive, pytest.raises(RigError, match="whole.whl has no b"):
        wheelfile.read(archive, "b")
    os.mkfifo(tmp_path / "fifo.whl")
    with pytest.raises(RigError, match="not a regular file"):  # refused at once, never waited on
        with wheelfile.opened(tmp_path / "fifo.whl"):
            pass


def test_uv_from_a_wheel_without_its_program_is_refused_by_name(tmp_path, monkeypatch):
    from rig.python import installer

    wheel = make(tmp_path / "uv.whl", {"uv/__init__.py": b""})
    monkeypatch.setattr(installer, "sha256_file", lambda path: installer.uv_wheel()["sha256"])
    with pytest.raises(RigError, match=f"uv.whl has no uv-{installer.UV_VERSION}.data/scripts/uv"):
        installer.uv_binary(wheel, tmp_path)


def test_crafted_members_are_each_one_named_error_and_a_directory_entry_is_a_directory(tmp_path):
    wheel = make(tmp_path / "c.whl", {"lib/": b"", "lib/a.so": b"x" * 3000, "a.so": b"1", "a.so/inner.so": b"2"})
    with wheelfile.opened(wheel) as archive:
        assert wheelfile.unpack(archive, "lib/", tmp_path / "out").is_dir()
        with pytest.raises(RigError, match="c.whl: its member lib/a.so is larger than 1024 bytes"):
            wheelfile.unpack(archive, "lib/a.so", tmp_path / "out", limit=1024)
        wheelfile.unpack(archive, "a.so", tmp_path / "out")
        with pytest.raises(RigError, match="c.whl: member a.so/inner.so cannot be unpacked .*another member holds"):
            wheelfile.unpack(archive, "a.so/inner.so", tmp_path / "out")
    data = bytearray(make(tmp_path / "enc.whl", {"k.so": b"x"}).read_bytes())
    for at in (6, data.rindex(b"PK\x01\x02") + 8):  # the general-purpose flags, local and central: "encrypted"
        data[at] |= 1
    (tmp_path / "enc.whl").write_bytes(bytes(data))
    with wheelfile.opened(tmp_path / "enc.whl") as archive, pytest.raises(RigError, match="enc.whl: its member k.so"):
        wheelfile.read(archive, "k.so")


def test_an_error_of_the_callers_own_is_not_called_a_damaged_wheel(tmp_path):
    with pytest.raises(KeyError), wheelfile.opened(make(tmp_path / "ok.whl", {"a": b"x"})):
        raise KeyError("the caller's")
