"""A measuring run's record in --out: written when the run ends, however it ends (a server that stops, an
error, Ctrl-C), with `stopped` saying why; a failure to write it never hides why the run stopped."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rig.core import outdir, progress


def reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@contextmanager
def recorded(out: str | Path, result: dict, name: str, report: Callable[[dict], str],
             draw: Callable[[dict], dict] | None = None,
             settle: Callable[[dict], None] | None = None) -> Iterator[list[str]]:
    """Run the block, then write RESULT (SETTLE(RESULT) first, where a verdict is drawn from state kept apart) as
    the JSON record NAME, REPORT(RESULT) as report.md and DRAW(RESULT)'s figures into OUT, in that order: a report
    that fails to render never costs the record. The list yielded gets the paths written."""
    result.setdefault("started", time.time())
    result.setdefault("stopped", None)
    written: list[str] = []

    def save() -> None:
        result["finished"] = time.time()
        if settle:
            settle(result)
        written.extend(outdir.write(out, {name: outdir.record(result, name)}))
        written.extend(outdir.write(out, {"report.md": report(result)}, (lambda: draw(result)) if draw else None))

    try:
        yield written
    except BaseException as exc:
        result["stopped"] = result["stopped"] or reason(exc)
        try:
            save()
        except Exception as again:  # noqa: BLE001 - the first error is the one to report
            progress(f"could not write what was measured to {out}: {again}")
        raise
    save()
