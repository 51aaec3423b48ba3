"""The one ELF reader: what the dynamic linker sees of a shared object, the SM a CUDA kernel image (a cubin)
holds SASS for, and the SASS and PTX archs inside the CUDA fat binaries an object carries.

A shared object's needed libraries, run paths and dynamic symbols are read as the loader reads them: from
the program headers (PT_DYNAMIC, its addresses mapped to the file through the PT_LOAD segments), so an object
whose section table is stripped (sstrip leaves e_shoff and e_shnum 0) says what it needs all the same. Its fat
binaries are found by section name (.nv_fatbin, and __nv_relfatbin in relocatable device code), or, with no
section table, by their header's magic.

A fat binary is a header (magic 0xBA55ED50, version, header size, size of what follows), then entries, each a
header (kind: 1 PTX, 2 ELF; header size; payload size; the SM at byte 28; flags at byte 40) and its payload.
An ELF payload stored plain is read as a cubin; a compressed one (zstd or the older LZ-type scheme, which the
standard library cannot undo) is known by its entry's SM and flags, which name the arch-specific (a) or family
(f) suffix as nvcc 13 writes them.

Read with struct over bytes or a read-only map, not pyelftools: torch's libraries export ~130,000 symbols and
a cubin wheel holds thousands of images, which pyelftools reads ~40-100x slower (`python scripts/bench.py
cubins`). Every offset, size and count comes from the file and is bounded before use, and so is the total each
table makes rig read (the names its entries point at, the bytes a search for fat binaries walks): a crafted
object costs time and memory in proportion to its size. What does not fit is a RigError naming the object,
never an IndexError or a MemoryError.
"""
from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from rig.core import RigError
from rig.core.fs import open_regular

# ELF64, little-endian
HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # ident, type, machine, version, entry, phoff, shoff, flags, ehsize,
#                                              phentsize, phnum, shentsize, shnum, shstrndx
SECTION = struct.Struct("<IIQQQQIIQQ")  # name, type, flags, addr, offset, size, link, info, addralign, entsize
SEGMENT = struct.Struct("<IIQQQQQQ")  # type, flags, offset, vaddr, paddr, filesz, memsz, align
SYMBOL = struct.Struct("<IBBHQQ")  # name, info, other, shndx, value, size
DYNAMIC = struct.Struct("<qQ")  # tag, value
WORD = struct.Struct("<I")
MAX_NEEDED = 1024  # DT_NEEDED and run path entries in one object
PT_LOAD, PT_DYNAMIC = 1, 2
SHT_NOTE, SHT_NOBITS = 7, 8
# A SHT_NOBITS section (.bss) has no bytes in the file, only memory: it is held to the largest address space a
# process has (48 bits on x86-64 and aarch64) instead of to the file.
ADDRESS_SPACE = 1 << 48
DT_NULL, DT_NEEDED, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_RPATH, DT_RUNPATH = 0, 1, 4, 5, 6, 10, 15, 29
DT_GNU_HASH = 0x6FFFFEF5
EM_CUDA = 190

Bad = Callable[[str], RigError]


def _shared_bad(name: str) -> Bad:
    return lambda why: RigError(f"{name} is not an ELF shared object rig can read: {why}")


def _cubin_bad(name: str) -> Bad:
    return lambda why: RigError(f"{name} is not a CUDA kernel image (cubin) rig can read: {why}")


def _header(data, bad: Bad) -> tuple:
    if len(data) < HEADER.size or data[:4] != b"\x7fELF":
        raise bad("no ELF header")
    if data[4:6] != b"\x02\x01":
        raise bad("not a 64-bit little-endian ELF file")
    return HEADER.unpack_from(data)


def _piece(data, offset: int, size: int, bad: Bad, what: str = "a section") -> bytes:
    if offset + size > len(data):
        raise bad(f"{what} lies outside the file")
    return data[offset:offset + size]


def _sections(data, header: tuple, bad: Bad) -> tuple[list[tuple], bytes]:
    """The section headers and the section names' table; none when the table is stripped (e_shnum 0). Each
    section is held to the file as readelf holds it, though rig reads few of them: one that lies outside the
    file, links to no section or takes its name from outside the names' table is a damaged or crafted object."""
    *_, shoff, _, _, _, _, shentsize, shnum, shstrndx = header
    if not shnum:
        return [], b""
    if shentsize != SECTION.size or shstrndx >= shnum:
        raise bad("its section table is malformed")
    if shoff + shnum * SECTION.size > len(data):
        raise bad("its section table lies outside the file")
    sections = [SECTION.unpack_from(data, shoff + i * SECTION.size) for i in range(shnum)]
    for i, (_, kind, _, _, offset, size, link, *_) in enumerate(sections):
        if kind == SHT_NOBITS and size > ADDRESS_SPACE:
            raise bad(f"a section is larger than any address space (section {i}: {size} bytes of memory, "
                      f"more than 2**48)")
        if kind != SHT_NOBITS and offset + size > len(data):
            raise bad(f"a section lies outside the file (section {i}: {size} bytes at offset {offset}, "
                      f"in a file of {len(data)})")
        if link >= shnum:
            raise bad(f"its section {i} links to section {link}, and it has {shnum} sections")
    names = sections[shstrndx]
    table = b"" if names[1] == SHT_NOBITS else data[names[4]:names[4] + names[5]]
    for i, section in enumerate(sections):
        if section[0] and section[0] >= len(table):
            raise bad(f"its section {i} takes its name from outside the section names' table")
    return sections, table


class _Names:
    """A dynamic string table's names, each offset read once and all of them together at most LIMIT bytes:
    a crafted object points thousands of entries into one long string (16384 DT_NEEDED at one 256 KB name
    would be 4 GB of names from a 512 KB file). A linker writes each name once, sharing only a suffix now and
    then, so an object that reads four times its table is refused."""

    def __init__(self, table: bytes, bad: Bad):
        self.table, self.bad = table, bad
        self.read: dict[int, str] = {}
        self.limit = self.left = 4 * len(table) + (1 << 20)

    def __call__(self, at: int) -> str:
        known = self.read.get(at)
        if known is not None:
            return known
        end = self.table.find(b"\0", at, at + self.left + 1)  # never scans past what is left to read
        if at >= len(self.table) or end < 0 and at + self.left + 1 >= len(self.table):
            raise self.bad("a name points outside its string table")
        if end < 0:
            raise self.bad(f"its dynamic entries name more than {self.limit} bytes from a string table of "
                           f"{len(self.table)}: they point into one another's names, as no linker writes them")
        self.left -= end - at
        self.read[at] = self.table[at:end].decode("utf-8", "replace")
        return self.read[at]


# ------------------------------------------------------------------ shared objects

@dataclass
class SharedObject:
    name: str
    needed: list[str]
    runpath: list[str]
    undefined: set[str]
    defined: set[str]
    has_fatbin: bool
    cubins: list[str] = field(default_factory=list)  # SASS archs of its fat binaries, as cuobjdump spells them
    ptx: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # what rig could not read of it, and why


FATBIN_SECTIONS = (b".nv_fatbin\0", b"__nv_relfatbin\0")


def read_shared_object(path: Path, name: str, device_code: bool = True) -> SharedObject:
    """What the dynamic linker sees of a shared object (DT_NEEDED, the run paths, the dynamic symbols it
    needs and defines) and, with DEVICE_CODE, the SASS and PTX archs of its fat binaries."""
    with open_regular(path, "shared object") as handle:  # never a FIFO or a device a RECORD names
        try:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:  # an empty file cannot be mapped
            raise RigError(f"{name} is not an ELF shared object: {exc}") from exc
        with data:
            return parse_shared_object(data, name, device_code)


def parse_shared_object(data, name: str, device_code: bool = True) -> SharedObject:
    bad = _shared_bad(name)
    header = _header(data, bad)
    sections, names = _sections(data, header, bad)
    needed, runpath, undefined, defined, unread = _dynamic(data, header, bad)
    # a name compared over its own length only: thousands of sections may share one long name
    spans = sorted((s[4], s[5]) for s in sections if s[1] != SHT_NOBITS and
                   any(names[s[0]:s[0] + len(n)] == n for n in FATBIN_SECTIONS))
    for (offset, size), (later, _) in pairwise(spans):
        if later < offset + size:  # each would be read whole: thousands over one region is quadratic
            raise bad(f"its fat binary sections overlap (at offsets {offset} and {later})")
    so = SharedObject(name, needed, runpath, undefined, defined, bool(spans), unread=unread)
    if not device_code:
        return so
    sass: set[str] = set()
    ptx: set[str] = set()
    missed: list[str] = []
    if sections:
        for offset, size in spans:
            found = fatbin_archs(data, name, offset, offset + size)
            sass |= set(found[0])
            ptx |= set(found[1])
    else:  # no section table to name them: every well-formed fat binary in the file
        scanned, missed = _scanned_fatbins(data)
        so.has_fatbin = bool(scanned)
        for found in scanned:
            sass |= set(found[0])
            ptx |= set(found[1])
        so.unread += missed
    if so.has_fatbin and not sass and not ptx and not missed:
        so.unread.append("its fat binaries hold no SASS or PTX entry rig reads (only other kinds, e.g. LTO IR)")
    so.cubins, so.ptx = sorted(sass), sorted(ptx)
    return so


def _dynamic(data, header: tuple, bad: Bad) -> tuple[list[str], list[str], set[str], set[str], list[str]]:
    """(needed, run paths, undefined and defined dynamic symbols, what was not read) from PT_DYNAMIC."""
    phoff, phentsize, phnum = header[5], header[9], header[10]
    if not phnum:
        return [], [], set(), set(), ["it has no program headers: nothing the loader would load"]
    if phentsize != SEGMENT.size or phoff + phnum * SEGMENT.size > len(data):
        raise bad("its program header table lies outside the file")
    segments = [SEGMENT.unpack_from(data, phoff + i * SEGMENT.size) for i in range(phnum)]
    mapped = _mapper(data, segments, bad)
    dynamic = [s for s in segments if s[0] == PT_DYNAMIC]
    if not dynamic:
        return [], [], set(), set(), []  # a static object: it needs nothing
    _, _, offset, _, _, filesz, _, _ = dynamic[0]
    tags, libraries, paths = _dynamic_entries(_piece(data, offset, filesz, bad, "its dynamic segment"), bad)
    if DT_STRTAB not in tags or DT_STRSZ not in tags:
        if libraries or paths or DT_SYMTAB in tags:
            raise bad("its dynamic segment names strings but has no string table (DT_STRTAB, DT_STRSZ)")
        return [], [], set(), set(), []
    at, _ = mapped(tags[DT_STRTAB], tags[DT_STRSZ], "dynamic string table")
    name = _Names(data[at:at + tags[DT_STRSZ]], bad)
    needed = [name(value) for value in libraries]
    runpath = [part for value in paths for part in name(value).split(":")]
    return (needed, runpath, *_symbols(data, tags, mapped, name, bad))


def _symbols(data, tags: dict[int, int], mapped, name: _Names, bad: Bad) -> tuple[set[str], set[str], list[str]]:
    """(undefined, defined dynamic symbols, what was not read) from the dynamic symbol table, where there is one."""
    undefined: set[str] = set()
    defined: set[str] = set()
    if DT_SYMTAB not in tags:
        return undefined, defined, []
    table, table_end = mapped(tags[DT_SYMTAB], 0, "dynamic symbol table")
    count = _symbol_count(data, tags, mapped, (table_end - table) // SYMBOL.size, bad)
    if count is None:
        return undefined, defined, ["its dynamic symbols were not read: no DT_HASH or DT_GNU_HASH says how many there are"]
    symbols = data[table:table + count * SYMBOL.size]
    for name_at, _, _, shndx, _, _ in SYMBOL.iter_unpack(symbols):
        if name_at:
            (defined if shndx else undefined).add(name(name_at))
    return undefined, defined, []


def _mapper(data, segments: list[tuple], bad: Bad) -> Callable[[int, int, str], tuple[int, int]]:
    """mapped(ADDRESS, SIZE, WHAT): the file offset of ADDRESS, and where its loaded segment's bytes in the file
    end; an address in no loaded segment is BAD."""
    loads = [(vaddr, filesz, offset) for kind, _, offset, vaddr, _, filesz, _, _ in segments if kind == PT_LOAD]

    def mapped(address: int, size: int, what: str) -> tuple[int, int]:
        for vaddr, filesz, offset in loads:
            if vaddr <= address and address + size <= vaddr + filesz and offset + filesz <= len(data):
                return offset + address - vaddr, offset + filesz
        raise bad(f"its {what} lies in no loaded segment of the file")

    return mapped


def _dynamic_entries(entries, bad: Bad) -> tuple[dict[int, int], list[int], list[int]]:
    """The dynamic segment's entries up to DT_NULL: (the first value of each other tag, the DT_NEEDED string
    offsets, the run paths' string offsets)."""
    tags: dict[int, int] = {}
    libraries, paths = [], []
    for tag, value in DYNAMIC.iter_unpack(entries[:len(entries) - len(entries) % DYNAMIC.size]):
        if tag == DT_NULL:
            break
        if tag == DT_NEEDED:
            libraries.append(value)
        elif tag in (DT_RPATH, DT_RUNPATH):
            paths.append(value)
        else:
            tags.setdefault(tag, value)
    if len(libraries) + len(paths) > MAX_NEEDED:
        raise bad(f"its dynamic segment has {len(libraries)} DT_NEEDED and {len(paths)} run path entries, more "
                  f"than the {MAX_NEEDED} rig reads (torch's largest library needs a few dozen)")
    return tags, libraries, paths


def _symbol_count(data, tags: dict[int, int], mapped, most: int, bad: Bad) -> int | None:
    """How many dynamic symbols there are (the loader's hash tables say; the ELF header does not), at most
    MOST (those that fit in the symbol table's loaded segment)."""
    if DT_HASH in tags:  # nbucket, nchain: one chain entry a symbol
        at, _ = mapped(tags[DT_HASH], 8, "symbol hash table")
        count = WORD.unpack_from(data, at + 4)[0]
    elif DT_GNU_HASH in tags:  # nbuckets, symoffset, bloom words, shift; buckets; one chain word a hashed symbol
        at, end = mapped(tags[DT_GNU_HASH], 16, "GNU symbol hash table")
        buckets, first, blooms, _ = struct.unpack_from("<IIII", data, at)
        start = at + 16 + 8 * blooms
        if start + 4 * buckets > end:
            raise bad("its GNU symbol hash table lies outside its segment")
        last = max(struct.unpack_from(f"<{buckets}I", data, start), default=0)
        count = first
        if last >= first:  # walk the last bucket's chain to its end (the word with bit 0 set)
            chain = start + 4 * buckets
            index = last
            while True:
                if chain + 4 * (index - first) + 4 > end or index >= most:
                    raise bad("its GNU symbol hash chain runs past its segment")
                if WORD.unpack_from(data, chain + 4 * (index - first))[0] & 1:
                    break
                index += 1
            count = index + 1
    else:
        return None
    if count > most:
        raise bad(f"its hash table counts {count} dynamic symbols, more than its segment holds")
    return count


# ------------------------------------------------------------------ cubins

CUDA_ARCH_OPTION = re.compile(rb"-arch sm_(\d{2,3})([af]?)\b")
MAX_NOTE = 64 << 10  # bytes: ptxas's toolkit note is a few hundred
TKINFO = b".note.nv.tkinfo\0"


def cubin_arch(data: bytes, name: str) -> str:
    """The SM a raw CUDA ELF (a .cubin file) holds SASS for, spelt as cuobjdump does after sm_ (120, 120a,
    100f). The number is in e_flags: bits 8-15 from ELF ABI 8 (CUDA 12.8 on), bits 0-7 before. The arch-specific
    (a) or family (f) suffix is only in the -arch that ptxas records in .note.nv.tkinfo; without it, the plain SM."""
    bad = _cubin_bad(name)
    header = _header(data, bad)
    machine, flags = header[2], header[7]
    if machine != EM_CUDA:
        raise bad(f"its ELF machine is {machine}, not CUDA's {EM_CUDA}")
    sm = (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF
    if sm < 20:  # sm_20 is the oldest SASS there was
        raise bad(f"its e_flags {flags:#x} name no SM (sm_{sm})")
    sections, names = _sections(data, header, bad)
    if not sections:
        raise bad("it has no section table")
    option = None
    for name_at, kind, _, _, offset, size, *_ in sections:
        if kind == SHT_NOTE and names[name_at:name_at + len(TKINFO)] == TKINFO:
            if size > MAX_NOTE:
                raise bad(f"its toolkit note is {size} bytes, far more than ptxas writes")
            option = CUDA_ARCH_OPTION.search(_piece(data, offset, size, bad))
            break  # the first is ptxas's: a crafted file may carry thousands
    return f"{sm}{option[2].decode()}" if option and int(option[1]) == sm else str(sm)


# ------------------------------------------------------------------ fat binaries

FATBIN_MAGIC = 0xBA55ED50
FATBIN = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries that follow
ENTRY = struct.Struct("<HHIQ")  # kind, version, header size, payload size
ENTRY_SM = struct.Struct("<I")  # at byte 28 of an entry's header
ENTRY_FLAGS = struct.Struct("<Q")  # at byte 40
ENTRY_MIN = 48  # bytes: an entry's header reaches its flags
KIND_PTX, KIND_ELF = 1, 2
# entry flags, as nvcc 13.0 writes them (read from its output; tests/unit/test_elf.py holds them to nvcc's)
COMPRESSED = 0x2000 | 0x8000  # the older LZ-type scheme, zstd
SUFFIXES = ((0x100000, "a"), (0x200000, "f"))


def fatbin_archs(data, name: str, start: int = 0, stop: int | None = None) -> tuple[list[str], list[str]]:
    """(SASS archs, PTX archs) of the fat binaries in DATA[START:STOP], laid back to back as in a .nv_fatbin
    section (zero padding between them allowed). Anything else there is a RigError that names NAME."""
    def bad(why: str) -> RigError:
        return RigError(f"{name}: its CUDA fat binary is not one rig can read: {why}")

    stop = len(data) if stop is None else stop
    sass: set[str] = set()
    ptx: set[str] = set()
    at = start
    while True:
        content = NOT_ZERO.search(data, at, stop)  # past the alignment padding between two fat binaries
        if not content:
            return sorted(sass), sorted(ptx)
        entries, at = _fatbin(data, content.start(), stop, bad)
        _archs(data, entries, bad, sass, ptx, f"{name}: ", None)


NOT_ZERO = re.compile(rb"[^\0]")


class _Spent(Exception):
    """A search for fat binaries by their magic walked all it may."""


def _fatbin(data, at: int, stop: int, bad: Bad, budget: list[int] | None = None) -> tuple[list[tuple], int]:
    """The entries (offset, kind, SM, flags, payload's offset and size) of the fat binary at AT (inside
    DATA[:STOP]) that are SASS or PTX, and where it ends; each byte walked is taken from BUDGET, where given."""
    if at + FATBIN.size > stop:
        raise bad(f"{stop - at} bytes at offset {at} are too few for a fat binary header")
    magic, _, header_size, size = FATBIN.unpack_from(data, at)
    if magic != FATBIN_MAGIC:
        raise bad(f"no fat binary header at offset {at} (magic {magic:#x}, not {FATBIN_MAGIC:#x})")
    if header_size < FATBIN.size or at + header_size + size > stop:
        raise bad(f"the fat binary at offset {at} says it runs past its section")
    entry, end = at + header_size, at + header_size + size
    entries = []
    while entry < end:
        if entry + ENTRY_MIN > end:
            raise bad(f"an entry header at offset {entry} runs past its fat binary")
        kind, _, entry_header, payload = ENTRY.unpack_from(data, entry)
        if entry_header < ENTRY_MIN or entry + entry_header + payload > end:
            raise bad(f"the entry at offset {entry} says it runs past its fat binary")
        if budget is not None:
            budget[0] -= entry_header + payload
            if budget[0] < 0:
                raise _Spent
        if kind in (KIND_PTX, KIND_ELF):
            sm = ENTRY_SM.unpack_from(data, entry + 28)[0]
            if not 20 <= sm < 10000:
                raise bad(f"the entry at offset {entry} names no SM ({sm})")
            entries.append((entry, kind, sm, ENTRY_FLAGS.unpack_from(data, entry + 40)[0], entry + entry_header,
                            payload))
        entry += entry_header + payload
    return entries, end


def _archs(data, entries: list[tuple], bad: Bad, sass: set[str], ptx: set[str], name: str,
           unread: list[str] | None) -> None:
    """Add the archs of ENTRIES (one fat binary's) to SASS and PTX. A plain cubin rig cannot read is a
    RigError, or with UNREAD, said there and its arch left out: an arch whose cubin was not read is not
    proven present."""
    for entry, kind, sm, flags, body, payload in entries:
        arch = f"{sm}{''.join(s for bit, s in SUFFIXES if flags & bit)}"
        if kind == KIND_ELF and not flags & COMPRESSED and data[body:body + 4] == b"\x7fELF":
            try:
                read = cubin_arch(data[body:body + payload], f"{name}the cubin at offset {body} of its fat binary")
                if read.rstrip("af") != str(sm):
                    raise bad(f"the entry at offset {entry} says sm_{sm}, its cubin is sm_{read}")
            except RigError as exc:
                if unread is None:
                    raise
                unread.append(f"sm_{arch} is not counted: {exc}")
                continue
            arch = read if read != str(sm) else arch  # ptxas's own note, where it has one
        (sass if kind == KIND_ELF else ptx).add(arch)


def _scanned_fatbins(data) -> tuple[list[tuple[list[str], list[str]]], list[str]]:
    """(SASS archs, PTX archs) of every well-formed fat binary in DATA, found by its magic (an object whose
    section table is stripped names none), and what was not read of them. What merely holds the magic's four
    bytes is not one, and is passed over.

    Those found lie apart, so they walk the file at most once; magic that heads no fat binary may walk as much
    again. Headers laid over one another (14,000 in 672 KB, each walking the rest) would walk it quadratically
    often: the search stops there, and says so."""
    found, unread = [], []
    budget = [2 * len(data)]
    magic = struct.pack("<I", FATBIN_MAGIC)
    at = data.find(magic)
    while at >= 0:
        try:
            entries, end = _fatbin(data, at, len(data), RigError, budget)
        except _Spent:
            unread.append(f"the search for its fat binaries by their magic stopped at offset {at}: the headers "
                          f"found overlap, as no compiler lays them out, and walked {2 * len(data)} bytes, twice "
                          "the file; what follows was not read")
            break
        except RigError:
            end = at + 1
        else:
            sass: set[str] = set()
            ptx: set[str] = set()
            _archs(data, entries, RigError, sass, ptx, "", unread)
            found.append((sorted(sass), sorted(ptx)))
        at = data.find(magic, end)
    return found, unread
