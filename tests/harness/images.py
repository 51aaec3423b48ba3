"""rig's images in the Docker store: a script run in one, and a lock's old builds pruned."""
from __future__ import annotations

from pathlib import Path

from harness.commands import ok, run


def in_image(tag: str, script: str) -> str:
    """SCRIPT's output in a throwaway container of TAG, as the image's own user."""
    return ok(run(["docker", "run", "--rm", "--entrypoint", "bash", tag, "-c", script])).stdout


BUILD_CACHE_KEEP = "2GB"


def prune(lock: Path) -> None:
    """Remove LOCK's untagged images (an earlier build of a tag that has moved on): only those, so that
    other locks' images stay."""
    from rig.image import LABEL
    from rig.python.lock import read

    run(["docker", "image", "prune", "-f", "--filter", f"label={LABEL}.lock-hash={read(lock)['lock_hash']}"])
    # BuildKit keeps every build's steps (an 11 GB venv per engine and lock, the 4 GB wheelhouse context) until
    # told. Kept, they sat beside the next whole-stack test on a CI machine's disk; the small steps stay warm
    run(["docker", "builder", "prune", "-f", "--keep-storage", BUILD_CACHE_KEEP])
