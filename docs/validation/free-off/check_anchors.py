"""Prove the free-off patches (and their opt-in check) against the real sglang wheels, with no GPU and nothing installed.

    python docs/validation/free-off/check_anchors.py [--wheel VERSION=PATH ...]

(by default the sglang wheels of stacks/h200-sglang-0.5.17.lock and stacks/sm120-sglang-0.5.23.lock, fetched into
rig's wheel cache and checked against the locks' hashes)

For every version, the files the patches touch are read from the wheel (a zip; nothing is installed) and:

1. each hunk's anchor (find) occurs exactly once in the wheel's file, its replacement does not occur there
   (else rig would call the file "applied" untouched), and applied in order every later anchor still occurs
   once; the patched file compiles;
2. rig's own engine (rig.patches: status, apply, revert) runs on a plain directory holding those files as a
   stand-in install: status says needed, apply writes them (it compiles them and runs each patch's check in
   this Python), status then says applied, and the serving worker holds none of the check's code; a second
   apply changes nothing; an apply that also asks for free-off-check adds the check, one that no longer asks
   takes it out (the serving files byte for byte as before), one without free-off restores the wheel's bytes;
   and revert puts back the wheel's bytes exactly (sha256), leaving no state file or backup behind.

Exit status 0 only when every check passes. Run from the repository root (rig is imported from it).
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from rig.patches.actions import apply, revert  # noqa: E402
from rig.patches.env import Env  # noqa: E402
from rig.patches.patchset import load  # noqa: E402
from rig.patches.report import status  # noqa: E402

PATCHES = ROOT / "rig" / "patches" / "set"
FEATURE, CHECK = "free-off", "free-off-check"  # the opt-in features of the patches checked here: serving, its check
SERVING, CHECKED = frozenset({FEATURE}), frozenset({CHECK})
LOCKS = {"0.5.17": ROOT / "stacks" / "h200-sglang-0.5.17.lock", "0.5.23": ROOT / "stacks" / "sm120-sglang-0.5.23.lock"}


def locked_wheel(lock_path: Path) -> Path:
    """The lock's sglang wheel, from rig's cache (fetched and hash-checked there when absent)."""
    import os

    from rig.python.lock import read
    from rig.python.wheelhouse import cached_path, fetch

    cache = Path(os.environ.get("RIG_CACHE", Path.home() / ".cache" / "rig"))
    lock = read(lock_path)
    wheel = [w for w in lock["wheels"] if w["name"] == "sglang"]
    fetch({**lock, "wheels": wheel}, cache)
    return cached_path(cache, wheel[0])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def first_line(text: str) -> str:
    return next(line.strip() for line in text.splitlines() if line.strip())


def check_version(version: str, wheel: Path, patches: list, diffs: Path | None = None) -> list[str]:
    """The failures for VERSION (empty: all passed); prints what it checked."""
    failures: list[str] = []
    mine = [p for p in patches if p.needs(version)]
    print(f"\n== sglang {version}: {wheel.name}")
    if not mine:
        return [f"{version}: no patch in {PATCHES} covers it"]
    with zipfile.ZipFile(wheel) as archive:
        originals = {p.file: archive.read(p.file) for p in mine}

    # 1. the anchors, read directly
    for patch in mine:
        text = originals[patch.file].decode()
        print(f"  {patch.id}  ({patch.file}, sha256 {sha(originals[patch.file])[:12]})")
        for n, (find, new) in enumerate(patch.hunks, 1):
            count = text.count(find)
            present = new in originals[patch.file].decode()
            ok = count == 1 and not present
            print(f"    hunk {n}: anchor found {count}x, replacement already there: {present}"
                  f"  [{'ok' if ok else 'FAIL'}]  {first_line(find)[:70]!r}")
            if not ok:
                failures.append(f"{version} {patch.id} hunk {n}: anchor x{count}, replacement present {present}")
            if count == 1:
                text = text.replace(find, new, 1)
        for n, (_, new) in enumerate(patch.hunks, 1):
            if new not in text:
                failures.append(f"{version} {patch.id} hunk {n}: a later hunk overwrote this one's replacement")
        try:
            compile(text, patch.file, "exec")
        except SyntaxError as exc:
            failures.append(f"{version} {patch.id}: the patched file does not compile: {exc}")
        lines = text.count("\n") - originals[patch.file].decode().count("\n")
        print(f"    applied in order: compiles, +{lines} lines")

    # 2. rig's engine on a stand-in install
    with tempfile.TemporaryDirectory(prefix=f"free-off-{version}-") as tmp:
        prefix = Path(tmp)
        for name, data in originals.items():
            (prefix / name).parent.mkdir(parents=True, exist_ok=True)
            (prefix / name).write_bytes(data)
        env = Env(python=sys.executable, prefix=prefix,
                  packages={"sglang": {"version": version, "root": str(prefix)}})
        if diffs is not None:  # what rig would write for serving, as its dry run reports it
            diffs.mkdir(parents=True, exist_ok=True)
            (diffs / f"sglang-{version}.diff").write_text(apply(env, patches, check=True, opted=SERVING)["diff"])
        try:
            failures += engine_steps(version, env, patches, mine, originals)
        except Exception as exc:  # noqa: BLE001 - report and go on to the next version
            failures.append(f"{version}: rig's engine failed: {exc}")
            print(f"  FAILED: {exc}")
    return failures


def engine_steps(version: str, env: Env, patches: list, mine: list, originals: dict[str, bytes]) -> list[str]:
    """status, apply (serving, then with the check, then without it, then with neither) and revert, on ENV."""
    failures: list[str] = []
    prefix = Path(env.prefix)
    serving = [p for p in mine if p.opt_in == FEATURE]
    checking = [p for p in mine if p.opt_in == CHECK]

    def expect(ok: bool, problem: str) -> None:
        if not ok:
            failures.append(f"{version}: {problem}")

    def statuses(opted: frozenset) -> dict:
        return {r["id"]: r["status"] for r in status(env, patches, opted)}

    def files() -> dict[str, bytes]:
        return {name: (prefix / name).read_bytes() for name in originals}

    unasked = statuses(frozenset())
    print(f"  rig status, nothing asked for: {unasked}")
    expect(all(unasked[p.id] == "opt-in" for p in mine), f"status without the opt-ins is {unasked}")
    before = statuses(SERVING)
    print(f"  rig status, {FEATURE} asked for: {before}")
    expect(all(before[p.id] == "needed" for p in serving) and all(before[p.id] == "opt-in" for p in checking),
           f"status before apply is {before}, wanted needed for {[p.id for p in serving]}, opt-in for the check")

    result = apply(env, patches, opted=SERVING)
    after = {r["id"]: r["status"] for r in result["patches"]}
    print(f"  rig apply: changed={result['changed']}, checks passed, status after: {after}")
    expect(all(after[p.id] == "applied" for p in serving), f"status after apply is {after}")
    worker = next((prefix / p.file).read_text() for p in serving if "worker" in p.id)
    alone = "_rig_check_ingest" not in worker and "needs rig's free-off-check patch" in worker
    print(f"  the serving worker holds no comparison code, and says RIG_FREE_OFF_CHECK=1 needs the check: {alone}")
    expect(alone, "the serving worker patch carries the check's code, or does not say that it is absent")
    serving_only = files()
    again = apply(env, patches, opted=SERVING)
    print(f"  rig apply again: changed={again['changed']}")
    expect(not again["changed"], "a second apply changed files")

    checked = apply(env, patches, opted=SERVING | CHECKED)
    print(f"  rig apply with {CHECK}: {checked['msg'].splitlines()[0]}, checks passed")
    expect(checked["changed"] and all(r["status"] == "applied" for r in checked["patches"] if r["id"] in
                                      {p.id for p in mine}), f"an apply with {CHECK} left {checked['patches']}")
    unchecked = apply(env, patches, opted=SERVING)
    print(f"  rig apply without {CHECK}: {unchecked['msg'].splitlines()[0]}")
    expect(files() == serving_only, f"an apply without {CHECK} did not leave the serving patches alone, byte for byte")

    dropped = apply(env, patches)  # the stack no longer asks: taken out
    print(f"  rig apply without {FEATURE}: {dropped['msg'].splitlines()[0]}")
    expect(dropped["changed"] is True and files() == originals,
           f"an apply without {FEATURE} did not restore the files byte for byte")

    apply(env, patches, opted=SERVING | CHECKED)
    patched = files()
    undone = revert(env)
    print(f"  rig revert (applied again first, with {CHECK}): changed={undone['changed']}, files={len(undone['files'])}")
    for name, data in originals.items():
        now = (prefix / name).read_bytes()
        print(f"    {name}: patched sha256 {sha(patched[name])[:12]} -> reverted {sha(now)[:12]}"
              f" == wheel {sha(data)[:12]}: {now == data}")
        expect(now == data, f"revert did not restore {name} byte for byte")
    leftovers = [str(p.relative_to(prefix)) for p in prefix.rglob("*") if p.name.startswith(".rig-patches")]
    expect(not leftovers, f"revert left {leftovers}")
    print(f"  state file and backups after revert: {leftovers or 'none'}")
    return failures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", action="append", default=[], metavar="VERSION=PATH",
                        help="an sglang wheel to check against (default: the locks' 0.5.17 and 0.5.23 wheels)")
    parser.add_argument("--diffs", type=Path, metavar="DIR",
                        help="also write each version's unified diff (rig's dry run) into DIR")
    args = parser.parse_args(argv)
    wheels = {}
    for item in args.wheel:
        version, _, path = item.partition("=")
        wheels[version] = Path(path)
    if not wheels:
        wheels = {version: locked_wheel(lock) for version, lock in LOCKS.items()}
    patches = [p for p in load(PATCHES) if p.opt_in in (FEATURE, CHECK)]
    print(f"patch set: {PATCHES.relative_to(ROOT)}, opt-in {FEATURE} and {CHECK} ({', '.join(p.id for p in patches)})")
    failures = []
    for version, wheel in wheels.items():
        failures += check_version(version, wheel, patches, args.diffs)
    print()
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"all checks passed for {', '.join(wheels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
