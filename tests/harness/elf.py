"""CUDA device code laid out by hand (nvcc is not on every machine): a CUDA ELF as ptxas writes one, a fat
binary's entries and the fat binary around them, a PTX payload, and a real shared object with one more section."""
from __future__ import annotations

import struct

PTX = b"//\n.version 9.0\n.target sm_90\n"


def cuda_elf(flags: int, abi: int = 8, tkinfo: bytes | None = b"ptxas\0-arch sm_120a -m 64 \0",
             machine: int = 190) -> bytes:
    """A CUDA ELF as ptxas lays one out, reduced to what the audit reads: the header, the section names and
    the toolkit note (made by hand: nvcc is not on this machine)."""
    names = b"\0.shstrtab\0.note.nv.tkinfo\0"
    note = struct.pack("<III", 13, len(tkinfo), 2000) + b"NVIDIA Corp\0\0\0\0" + tkinfo if tkinfo else b""
    body = names + note
    table = 64 + len(body)
    sections = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(names), 0, 0, 1, 0)]
    if tkinfo:
        sections.append(struct.pack("<IIQQQQIIQQ", 11, 7, 0, 0, 64 + len(names), len(note), 0, 0, 4, 0))
    header = b"\x7fELF\x02\x01\x01" + bytes([0x41, abi]) + bytes(7) + struct.pack(
        "<HHIQQQIHHHHHH", 2, machine, 1, 0, 0, table, flags, 64, 0, 0, 64, len(sections), 1)
    return header + body + b"".join(sections)


def entry(kind: int, sm: int, payload: bytes, flags: int = 0x11) -> bytes:
    """An entry: kind (1 PTX, 2 ELF), version, header size, payload size; the SM at byte 28, flags at 40."""
    header = bytearray(64)
    struct.pack_into("<HHIQ", header, 0, kind, 0x101, 64, len(payload))
    struct.pack_into("<I", header, 28, sm)
    struct.pack_into("<Q", header, 40, flags)
    return bytes(header) + payload


def fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def with_section(data: bytes, name: bytes, body: bytes) -> bytes:
    """DATA (a real shared object) with one more section, NAME holding BODY, appended after everything: a new
    names table and a new section table at the end, the header pointed at them."""
    shoff, = struct.unpack_from("<Q", data, 40)
    shnum, shstrndx = struct.unpack_from("<H", data, 60)[0], struct.unpack_from("<H", data, 62)[0]
    table = [bytearray(data[shoff + 64 * i:shoff + 64 * (i + 1)]) for i in range(shnum)]
    names_at, names_size = struct.unpack_from("<QQ", table[shstrndx], 24)
    names = data[names_at:names_at + names_size] + name + b"\0"
    out = bytearray(data) + bytes(-len(data) % 8)
    body_at = len(out)
    out += body + bytes(-len(body) % 8)
    struct.pack_into("<QQ", table[shstrndx], 24, len(out), len(names))
    out += names + bytes(-len(names) % 8)
    table.append(bytearray(struct.pack("<IIQQQQIIQQ", names_size, 1, 2, 0, body_at, len(body), 0, 0, 8, 0)))
    struct.pack_into("<Q", out, 40, len(out))
    struct.pack_into("<H", out, 60, shnum + 1)
    return bytes(out + b"".join(table))
