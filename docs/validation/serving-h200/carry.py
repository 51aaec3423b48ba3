"""Fetch, from the H200 stack's lock, the wheels the lent GPU machine lacks, hash-checked by rig's wheelhouse,
and cut them into pieces under the device tool's 64 MiB transfer limit (run here, from the repo root).

The GPU machine already has torch 2.11.0+cu130, transformers' dependencies, numpy, triton and the like; the names
below are what sglang 0.5.17 needs on top (as seen there). Every file comes from the lock, so the versions are
the lock's. Usage: python docs/validation/serving-h200/carry.py OUTDIR [--full-kernel] [--lock LOCK]
[--machine PIP_JSON] [--fetch-only]
(--full-kernel keeps sglang-kernel whole: FlashAttention 3, for `server.attention_backends: [..., fa3]`;
--lock another stack's lock, e.g. sglang 0.5.23's with its torch 2.14.1; --machine the machine python3's
`python3 -m pip list --format json`: every locked wheel it lacks at the locked version is carried instead of the
names below, so the machine's own NVIDIA libraries are reused where their versions match; --fetch-only fills
rig's cache with what LOCK has beyond the 0.5.17 lock and the names below, before a loan, and cuts nothing)
"""
import argparse
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from rig.python.lock import read
from rig.python.wheelhouse import cached_path, fetch

LOCK = Path("stacks/h200-sglang-0.5.17.lock")
MISSING = """sglang sglang-kernel flashinfer-python sgl-deep-gemm xgrammar apache-tvm-ffi transformers tokenizers
huggingface-hub fastapi starlette uvicorn pydantic pydantic-core annotated-types typing-inspection python-multipart
orjson msgspec pyzmq pybase64 openai jiter distro sniffio partial-json-parser gguf compressed-tensors setproctitle
loguru dill soundfile cffi pycparser zstandard cuda-python jsonschema jsonschema-specifications referencing rpds-py
opentelemetry-api ipython jedi parso traitlets prompt-toolkit wcwidth pexpect ptyprocess stack-data executing
asttokens pure-eval matplotlib-inline ipython-pygments-lexers""".split()
# a call carries 64 MiB in all, the repo's tracked files included (17 MB by now, and growing with each run's
# record): a piece is what is left of the 64 MiB, less 2 MB for what is untracked but not ignored
TRACKED = sum(Path(f).stat().st_size for f in subprocess.run(
    ["git", "ls-files", "-z"], check=True, capture_output=True, text=True).stdout.split("\0") if Path(f).is_file())
PIECE = 64 * 2**20 - TRACKED - 2_000_000



def strip_wheel(wheel: Path, prefixes: tuple) -> list[str]:
    """Rewrite WHEEL without the members under PREFIXES (and their RECORD lines)."""
    kept = wheel.with_suffix(".tmp")
    dropped = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(kept, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename.startswith(prefixes):
                dropped.append(info.filename)
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line for line in data.splitlines(keepends=True) if not line.startswith(tuple(x.encode() for x in prefixes)))
            dst.writestr(info, data)
    kept.replace(wheel)
    return dropped


def public(version: str) -> str:
    """A version without its local part (the machine's torch is 2.11.0+cu130, the lock's 2.11.0)."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version


def machine_has(path: Path) -> set[tuple[str, str]]:
    """(name, version) of each package `pip list --format json` lists."""
    try:
        listed = json.loads(path.read_text())
        return {(canonicalize_name(p["name"]), public(str(p["version"]))) for p in listed}
    except (OSError, ValueError, TypeError, KeyError) as exc:  # what the machine wrote is input like any other
        raise SystemExit(f"--machine {path}: not `pip list --format json` output ({exc!r}): write it again there")


args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
args.add_argument("out", type=Path)
args.add_argument("--full-kernel", action="store_true")
args.add_argument("--lock", type=Path, default=LOCK)
args.add_argument("--machine", type=Path)
args.add_argument("--fetch-only", action="store_true")
given = args.parse_args()
out, full_kernel = given.out, given.full_kernel
lock = read(given.lock)
if given.machine:
    there = machine_has(given.machine)
    wanted = [w for w in lock["wheels"] if (canonicalize_name(w["name"]), public(w["version"])) not in there]
elif given.fetch_only:  # before the loan: what the machine may lack, whatever its list turns out to be
    known = {(w["name"], w["version"]) for w in read(LOCK)["wheels"]}
    wanted = [w for w in lock["wheels"] if w["name"] in MISSING or (w["name"], w["version"]) not in known]
else:
    wanted = [w for w in lock["wheels"] if w["name"] in MISSING]
    absent = sorted(set(MISSING) - {w["name"] for w in wanted})
    if absent:
        raise SystemExit(f"not in the lock: {absent}")
cache = Path.home() / ".cache" / "rig"
print(fetch({**lock, "wheels": wanted}, cache)["msg"])
if given.fetch_only:
    raise SystemExit(0)
stage = out / "all"
shutil.rmtree(out, ignore_errors=True)
stage.mkdir(parents=True)
for w in wanted:
    shutil.copyfile(cached_path(cache, w), stage / w["filename"])
(out / "wheels.json").write_text(json.dumps(wanted, indent=1))
# sglang-kernel is 383 MB, 340 of them flash_ops.abi3.so (FlashAttention 3, unused by the triton attention
# backend the validation runs); the sm100 ops do not load on SM90. Both stay behind, for transport only: the
# repacked wheel's sha256 differs from the lock's, and stripped.json says what was left out.
kernel = next(stage.glob("sglang_kernel-*.whl"), None)  # the machine may have it already (--machine)
if kernel:
    dropped = strip_wheel(kernel, ("sgl_kernel/sm100/",) if full_kernel else
                          ("sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm100/"))
    (out / "stripped.json").write_text(json.dumps({"wheel": kernel.name, "dropped": dropped}, indent=1))
# a wheel larger than a piece (sglang-kernel whole) travels as NAME.partNNN chunks, joined there before installing
for f in [f for f in stage.iterdir() if f.stat().st_size >= PIECE]:
    data = f.read_bytes()
    for n, at in enumerate(range(0, len(data), PIECE - 1_000_000)):
        (stage / f"{f.name}.part{n:03d}").write_bytes(data[at:at + PIECE - 1_000_000])
    f.unlink()
bins: list[list[Path]] = []
for f in sorted(stage.iterdir(), key=lambda p: -p.stat().st_size):
    fit = next((b for b in bins if sum(x.stat().st_size for x in b) + f.stat().st_size < PIECE), None)
    fit.append(f) if fit is not None else bins.append([f])
for i, group in enumerate(bins, 1):
    (out / f"p{i}").mkdir()
    for f in group:
        f.rename(out / f"p{i}" / f.name)
    print(f"p{i}: {len(group)} wheels, {sum((out / f'p{i}' / f.name).stat().st_size for f in group) / 1e6:.1f} MB")
stage.rmdir()
