"""The default lock's venv from a local wheelhouse, offline and hash-checked: pip as rig ran it, pip with the
bytecode compiled on every core, uv, and unpacking rig's venv archive: which installer rig should use."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from .common import BIN, REPO, STACK, median, write_section


def bench_installer(rounds: int) -> None:
    """The same wheelhouse, the same hash-checked offline install, three installers, interleaved."""
    sys.path.insert(0, str(REPO))
    from rig.python.installer import UV_VERSION

    uv = f"uv=={UV_VERSION}"  # the one rig pins
    lock = STACK.with_suffix(".lock")
    env = {**os.environ}
    subprocess.run([str(BIN / "rig"), "wheelhouse", "fetch", str(lock)], cwd=REPO, check=True)
    with tempfile.TemporaryDirectory(prefix="rig-bench-installer-") as tmp:
        house, tools = Path(tmp) / "house", Path(tmp) / "tools"
        subprocess.run([str(BIN / "rig"), "wheelhouse", "export", str(lock), str(house)], cwd=REPO, check=True)
        subprocess.run([str(BIN / "python"), "-m", "pip", "install", "-q", "--target", str(tools), uv], check=True)
        pip_wheel = next(house.glob("pip-*.whl"))
        offline = ["--no-index", "--require-hashes", "--no-deps", "--find-links", str(house),
                   "-r", str(house / "requirements.txt")]
        venv = Path(tmp) / "venv"
        python = str(venv / "bin" / "python")
        kinds = {
            "pip, compiling while it installs (rig's pip before)": [
                [python, f"{pip_wheel}/pip", "install", "-q", "--no-cache-dir", *offline]],
            "pip --no-compile, then compileall on every core (rig's pip path)": [
                [python, f"{pip_wheel}/pip", "install", "-q", "--no-cache-dir", "--no-compile", *offline],
                [python, "-m", "compileall", "-q", "-j0", str(venv / "lib")]],  # 1: some files do not compile
            "uv pip install --compile-bytecode, a fresh uv cache (rig's default)": [
                [str(tools / "bin" / "uv"), "pip", "install", "-q", "--python", python, "--compile-bytecode",
                 "--cache-dir", str(Path(tmp) / "uv-cache"), *offline]],
        }
        # the venv archive (python_stack_archive): rig's own uv install, packed once, then unpacked in the rounds
        rig_ = str(BIN / "rig")
        subprocess.run([rig_, "venv", "install", "--venv", str(venv), "--lock", str(lock), "--wheelhouse", str(house),
                        "--installer", "uv"], cwd=REPO, check=True, capture_output=True)
        start = time.monotonic()
        packed = json.loads(subprocess.run([rig_, "venv", "pack", "--venv", str(venv), "--out", str(Path(tmp) / "packed"),
                                            "--json"], cwd=REPO, check=True, capture_output=True, text=True).stdout)
        pack_seconds, archive_mb = time.monotonic() - start, Path(packed["archive"]).stat().st_size / 1e6
        unpack = "rig venv unpack of that venv's archive (packed once, see below)"
        kinds[unpack] = [[rig_, "venv", "unpack", "--venv", str(venv), "--manifest", packed["manifest"]]]
        results: dict[str, list] = {kind: [] for kind in kinds}
        for _ in range(rounds):
            for kind, steps in kinds.items():
                shutil.rmtree(venv, ignore_errors=True)
                shutil.rmtree(Path(tmp) / "uv-cache", ignore_errors=True)
                if kind != unpack:  # the archive brings its venv whole
                    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
                start = time.monotonic()
                for step in steps:
                    done = subprocess.run(step, env=env, capture_output=True, text=True, check=False)
                    if done.returncode > (1 if "compileall" in step else 0):  # pip, too, skips what does not compile
                        raise SystemExit(f"{kind}: {' '.join(step)} failed:\n{done.stderr[-3000:]}")
                results[kind].append((time.monotonic() - start, 0))
                print(kind, results[kind][-1], flush=True)
    rows = ["| installer | median s | range s |", "| --- | --- | --- |"]
    for kind, runs in results.items():
        seconds = [s for s, _ in runs]
        rows.append(f"| {kind} | {statistics.median(seconds):.1f} | {min(seconds):.1f}–{max(seconds):.1f} |")
    base = median(results, next(iter(kinds)))
    ratios = "\n".join(f"- {kind}: **{median(results, kind) / base:.2f}** of pip's time" for kind in list(kinds)[1:])
    write_section("installer", f"""
## The installer: pip against uv, same wheelhouse, same guarantees

Measured {datetime.now(timezone.utc):%Y-%m-%d} with `python scripts/bench.py installer` on the development
machine (2 cores, 24 GiB), {rounds} round(s), kinds interleaved: the default lock's
{len(json.loads(lock.read_text())["wheels"])} wheels into a fresh venv from a local exported wheelhouse, offline,
`--require-hashes`, `--no-deps`; each run ends with every module byte-compiled. uv is {uv}.

{chr(10).join(rows)}

{ratios}

The archive: `rig venv pack` of rig's uv venv took {pack_seconds:.1f} s once and made {archive_mb:.0f} MB (zstd -3);
unpacking it is checking its sha256, decompressing, and writing every file against its manifest entry. On this
machine writing is the floor: creating one small file costs the kernel about 0.25-0.4 ms of CPU on its ext4 (100,000
files of 1 kB in 24-42 s; 1 s on tmpfs), and the venv has about 110,000 files.
""")
