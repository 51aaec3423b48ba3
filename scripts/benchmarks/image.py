"""`rig image build`: a cold build, a patch-only rebuild, and where the runtime image's size goes (against
SGLang's and vLLM's published images)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from .common import BIN, REPO, table, timed, write_section


def bench_image(rounds: int) -> None:
    """Cold build, patch-only rebuild and size of the default stack's image, interleaved."""
    env = {**os.environ}
    if not env.get("RIG_BASE_IMAGE"):
        env["RIG_BASE_IMAGE"] = subprocess.run(["bash", "scripts/base-image.sh"], cwd=REPO, check=True,
                                               capture_output=True, text=True).stdout.strip().splitlines()[-1]
    work = Path(tempfile.mkdtemp(prefix="rig-bench-image-"))
    variants = []
    for drop in ("sglang-fusion-preflight-unicast", "sglang-symm-mem-multimem-sm120"):
        shutil.copytree(REPO / "rig" / "patches" / "set", work / drop)
        (work / drop / f"{drop}.yml").unlink()
        variants.append(work / drop)
    rig = str(BIN / "rig")
    results: dict[str, list] = {"cold build (--no-cache)": [], "patch-only rebuild": []}
    size = 0
    for i in range(rounds):
        # --no-archive: the wheels' install, as before the archive; not a venv some host installed and compiled
        results["cold build (--no-cache)"].append(timed([rig, "image", "build", "--no-cache", "--no-archive", "--json"],
                                                        env))
        subprocess.run(["docker", "image", "prune", "-f"], capture_output=True, check=False)
        results["patch-only rebuild"].append(timed([rig, "image", "build", "--no-archive", "--json", "--patches",
                                                    str(variants[i % 2])], env))
        listing = subprocess.run([rig, "image", "build", "--no-archive", "--json"], cwd=REPO, env=env, check=True,
                                 capture_output=True, text=True).stdout
        built = json.loads(listing)
        size = built["size"]
    parts = image_breakdown(built["tag"], env["RIG_BASE_IMAGE"])
    floor = dict(parts)["venv: package files, without .pyc"]
    shutil.rmtree(work, ignore_errors=True)
    write_section("image", f"""
## `rig image build`

Measured {datetime.now(timezone.utc):%Y-%m-%d} with `python scripts/bench.py image`, {rounds} round(s), on this
2-core machine with the controller's caches warm (wheels and CUDA wheels already downloaded).
**cold**: `rig image build --no-cache` of the default stack. **patch-only**: the same build with one
patch file removed from the patch set (every layer before the patch set comes from the cache).

{table(results)}

- runtime image: **{size / 1e9:.2f} GB** (Docker's uncompressed size), against SGLang's published runtime
  image (about 20 GB) and vLLM's (about 19.7 GB): {size / 20e9:.0%} and {size / 19.7e9:.0%} of them.
  Goal: at most half their size, about 10 GB.

Where the size is (`du` in the image, `docker image inspect` for the base):

| part | GB | of SGLang's 20 GB |
| --- | --- | --- |
{chr(10).join(f"| {name} | {b / 1e9:.2f} | {b / 20e9:.1%} |" for name, b in parts)}

The files the locked packages install, without their .pyc, are {floor / 1e9:.2f} GB: {floor / 20e9:.1%} of
SGLang's image by themselves. Neither the base, the toolkit nor the .pyc files can bring the image
to half; only leaving out files that the lock's packages install could.
""")


def image_breakdown(tag: str, base: str) -> list[tuple[str, int]]:
    """The base, the toolkit, the venv's package files and its .pyc files, and its largest packages."""
    script = r"""
site=/opt/rig/venv/lib/python3.*/site-packages
echo "toolkit $(du -sb /usr/local/cuda-* | awk '{s+=$1} END {print s}')"
echo "venv $(du -sb /opt/rig/venv | cut -f1)"
echo "pyc $(find /opt/rig/venv -name '*.pyc' -printf '%s
' | awk '{s+=$1} END {print s}')"
du -sb $site/* | sort -nr | head -6 | while read b p; do echo "pkg:$(basename $p) $b"; done
python3 - <<'PY'
import glob, os
def files(*roots):
    for root in roots:
        for d, _, names in os.walk(root):
            for n in names:
                p = os.path.join(d, n)
                if os.path.isfile(p) and not os.path.islink(p):
                    yield n, os.path.getsize(p)
toolkit, nvidia = glob.glob("/usr/local/cuda-*"), glob.glob("/opt/rig/venv/lib/python3.*/site-packages/nvidia")
venv_files = set(files(*nvidia))
print("static", sum(s for n, s in files(*toolkit, "/opt/rig/venv") if n.endswith(".a")))
print("twice", sum(s for n, s in files(*toolkit) if (n, s) in venv_files))
print("nvrtc", sum(s for n, s in files(*toolkit, *nvidia) if n.startswith("libnvrtc")))
PY
"""
    out = subprocess.run(["docker", "run", "--rm", "--entrypoint", "bash", tag, "-c", script],
                         capture_output=True, text=True, check=True).stdout.split()
    sizes = dict(zip(out[::2], map(int, out[1::2]), strict=True))
    base_size = json.loads(subprocess.run(["docker", "image", "inspect", base], capture_output=True, text=True,
                                          check=True).stdout)[0]["Size"]
    return [("base image (Debian, python3, g++)", base_size), ("CUDA toolkit", sizes["toolkit"]),
            ("venv", sizes["venv"]), ("venv: .pyc files", sizes["pyc"]),
            ("venv: package files, without .pyc", sizes["venv"] - sizes["pyc"]),
            *[(f"venv: {k[4:]}/ (with its .pyc)", v) for k, v in sizes.items() if k.startswith("pkg:")],
            ("static archives (.a), toolkit and venv", sizes["static"]),
            ("toolkit files the venv's nvidia/ holds too (same name and size)", sizes["twice"]),
            ("libnvrtc*, toolkit and venv together", sizes["nvrtc"])]
