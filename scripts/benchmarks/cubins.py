"""The cubin audit on a real wheel (flashinfer-cubin 0.6.13): unzipping every .cubin, then reading each arch
with rig's struct reader against pyelftools on the same bytes: why rig reads ELF itself."""
from __future__ import annotations

import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

from .common import write_section


def bench_cubins(rounds: int) -> None:
    """The cubin audit on a real wheel (flashinfer-cubin 0.6.13, from the index into the cache as the tests
    fetch it): unzipping every .cubin, then reading each one's arch with rig's struct reader and, side by side
    on the same bytes, with pyelftools (header, section names, the toolkit note): the reason for the former."""
    import io
    import zipfile

    from elftools.elf.elffile import ELFFile

    from rig.core.elf import CUDA_ARCH_OPTION, cubin_arch
    from rig.python.pip import download, target_args

    dest = Path(os.environ.get("RIG_CACHE", Path.home() / ".cache" / "rig")) / "index-wheels" / \
        "flashinfer-cubin-0.6.13"
    if not list(dest.glob("*.whl")):
        download(["flashinfer-cubin==0.6.13"], dest, target_args("3.11"), [])
    wheel = next(dest.glob("*.whl"))

    def unzip() -> list[bytes]:
        with zipfile.ZipFile(wheel) as archive:
            return [archive.read(i) for i in archive.infolist() if i.filename.endswith(".cubin")]

    def with_pyelftools(data: bytes) -> tuple:
        elf = ELFFile(io.BytesIO(data))
        note = elf.get_section_by_name(".note.nv.tkinfo")
        return elf.header["e_flags"], CUDA_ARCH_OPTION.search(note.data()) if note is not None else None

    images: list[bytes] = []
    times: dict[str, list[float]] = {"unzip every .cubin": [], "read the archs: rig (struct)": [],
                                     "read the archs: pyelftools": []}
    for _ in range(rounds):
        start = time.perf_counter()
        images = unzip()
        times["unzip every .cubin"].append(time.perf_counter() - start)
        for name, read in (("read the archs: rig (struct)", lambda d: cubin_arch(d, "bench")),
                           ("read the archs: pyelftools", with_pyelftools)):
            start = time.perf_counter()
            for data in images:
                read(data)
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) for name, t in times.items()}
    rows = ["| step | median s | range s |", "| --- | --- | --- |"]
    rows += [f"| {name} | {median[name]:.2f} | {min(t):.2f}-{max(t):.2f} |" for name, t in times.items()]
    ratio = median["read the archs: pyelftools"] / median["read the archs: rig (struct)"]
    write_section("cubins", f"""## What the cubin audit costs ({datetime.now(timezone.utc):%Y-%m-%d})

`python scripts/bench.py cubins`: {wheel.name} ({wheel.stat().st_size / 1e6:.0f} MB, {len(images)} .cubin files,
{sum(map(len, images)) / 1e9:.2f} GB unzipped), {rounds} rounds, {os.cpu_count()} cores. `rig audit`, `rig validate`
(`kernels`) and `rig doctor` (`audit-flashinfer-cubin`) pay the unzip (or the read from the venv) and rig's read.

{chr(10).join(rows)}

pyelftools takes {ratio:.1f}x as long as rig's reader on the same bytes.
""")
