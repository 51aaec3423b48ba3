"""fs-verity on a venv image: once the pulled image's sha256 is its manifest's, the kernel is asked to keep it
checked while mounted (FS_IOC_ENABLE_VERITY). The kernel then builds a Merkle tree of the verified bytes and checks
every later read of the file against it, the loop mount's included, and the file can no longer be written; it stays
so over a reboot (the tree is kept by the filesystem).

fs-verity, not dm-verity: it needs no hash device beside the image, no device-mapper table and no set-up at boot
before the systemd mount unit, only a filesystem with the feature (ext4 made or tuned with `-O verity`, f2fs, btrfs)
and a kernel built with CONFIG_FS_VERITY. Where either is missing the image is checked only before each mount
(its sha256), and that is said."""
from __future__ import annotations

import errno
import fcntl
import struct
from pathlib import Path

from rig.core import progress
from rig.core.fs import open_regular

ENABLE = 0x40806685  # FS_IOC_ENABLE_VERITY: _IOW('f', 133, struct fsverity_enable_arg), 128 bytes
MEASURE = 0xC0046686  # FS_IOC_MEASURE_VERITY: _IOWR('f', 134, struct fsverity_digest), a 4-byte header
SHA256, BLOCK = 1, 4096  # FS_VERITY_HASH_ALG_SHA256; 4 KiB Merkle blocks: the page size of x86_64 (kernels before
# 6.3 take only the page size; later ones any power of two up to the filesystem's block size)
# fsverity_enable_arg: version, hash_algorithm, block_size, salt_size, salt_ptr, sig_size, reserved, sig_ptr, 11
# reserved u64s; no salt and no signature (the manifest's sha256, checked first, is what the bytes are trusted by)
ENABLE_ARG = struct.pack("=IIIIQIIQ88x", 1, SHA256, BLOCK, 0, 0, 0, 0, 0)
NOT_HERE = {errno.ENOTTY: "the filesystem holding it has no fs-verity",
            errno.EOPNOTSUPP: "this kernel has no fs-verity (CONFIG_FS_VERITY), or the filesystem holding it was "
                              "made without the feature (ext4: tune2fs -O verity)",
            errno.EINVAL: f"the kernel refused fs-verity with {BLOCK}-byte Merkle blocks (before Linux 6.3 only the "
                          "page size is taken, and never more than the filesystem's block size)"}


def keep_checked(image: str | Path) -> dict:
    """IMAGE (its bytes already checked) under fs-verity: {"on": True, "digest"}, the kernel's fs-verity digest of
    it (already on: the same); or {"on": False, "why"} where this host cannot, the file left as it was."""
    with open_regular(image, "the venv image", follow=False) as handle:
        progress(f"asking the kernel to keep {image} checked (fs-verity: where it can, it reads the file once)")
        try:
            fcntl.ioctl(handle.fileno(), ENABLE, ENABLE_ARG)
        except OSError as exc:
            if exc.errno != errno.EEXIST:  # EEXIST: on already, from an earlier mount
                why = NOT_HERE.get(exc.errno or 0) or f"turning fs-verity on failed: {exc.strerror or exc}"
                return {"on": False, "why": why}
        return measured(handle.fileno())


def measured(fd: int) -> dict:
    """Whether the open file FD is under fs-verity now: {"on": True, "digest"} as the kernel measures it
    (FS_IOC_MEASURE_VERITY), or {"on": False, "why"}; nothing changes."""
    asked = bytearray(struct.pack("=HH", 0, 64) + bytes(64))  # room for the largest digest the kernel has
    try:
        fcntl.ioctl(fd, MEASURE, asked)
    except OSError as exc:
        if exc.errno == errno.ENODATA:
            return {"on": False, "why": "fs-verity is not on for it"}
        why = NOT_HERE.get(exc.errno or 0) or f"measuring its fs-verity failed: {exc.strerror or exc}"
        return {"on": False, "why": why}
    algorithm, size = struct.unpack_from("=HH", asked)  # another algorithm: someone else turned it on
    return {"on": True, "digest": ("sha256" if algorithm == SHA256 else f"algorithm-{algorithm}") + ":" +
            bytes(asked[4:4 + size]).hex()}
