"""`rig lock` and `rig wheelhouse fetch`, cold (empty caches) and warm: the resolver and the download behind
every stack, and the bytes they move."""
from __future__ import annotations

import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from .common import BIN, STACK, fresh_caches, table, timed, write_section

READING_LOCK = """
Reading the numbers: `rig lock` runs pip's resolver, which downloads a whole wheel when
the index offers no separate metadata file for it, so even a warm lock moves gigabytes;
that is where its time goes. The interface counters of this sandbox undercount (the cold
fetch stores 4.1 GB of wheels, as `rig wheelhouse fetch` itself reports, while the counters
saw 1.4 GB), so read the MB column as a lower bound and an indication only.
"""


def bench_lock(rounds: int) -> None:
    results: dict[str, list] = {"lock cold": [], "lock warm": [], "fetch cold": [], "fetch warm": []}
    lock = STACK.with_suffix(".lock")
    for _ in range(rounds):
        cache, env = fresh_caches()
        with tempfile.TemporaryDirectory() as tmp:
            stack = Path(tmp) / STACK.name
            shutil.copyfile(STACK, stack)
            for kind in ("lock cold", "lock warm"):
                results[kind].append(timed([str(BIN / "rig"), "lock", "--stack", str(stack)], env))
        for kind in ("fetch cold", "fetch warm"):
            results[kind].append(timed([str(BIN / "rig"), "wheelhouse", "fetch", str(lock), "--cache", str(cache)], env))
        shutil.rmtree(cache, ignore_errors=True)
    write_section("lock", f"""
## `rig lock` and `rig wheelhouse fetch`

Measured {datetime.now(timezone.utc):%Y-%m-%d} with `python scripts/bench.py lock`, {rounds} rounds,
stack `sm120-sglang-0.5.23` ({len(lock.read_text().split('"filename"')) - 1} wheels). **cold**: a new,
empty RIG_CACHE and pip cache; **warm**: the same command again right after.

{table(results)}

One box against three: see the provision section.
{READING_LOCK}""")
