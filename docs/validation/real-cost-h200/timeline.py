"""Where a level's time goes, read from SGLang's own log: ramp, steady decode, tail, prefill and the policy's switches.

    python docs/validation/real-cost-h200/timeline.py LOG... [--levels 1,16,64,256] [--host RES/host.csv]

The servers log every decode step (`--decode-log-interval 1`) with milliseconds (`SGLANG_LOG_MS=1`), as
stack-free-off-policy.yml and run.sh start them. tune runs the levels in ascending order, so a level's lines start
at the last prefill into an empty server before the first batch larger than the level below's (twice it); gaps of IDLE_S or
more (the client between rounds) are left out of the wall. Each line's time is the gap since the line before it:
the scheduler logs a batch once its result is processed, so the gap is that batch's share of the wall. Per server and level:
- prefill: the prefill batches and their time;
- at C: decode steps at the level's running count (steady decode), their time and rate;
- below C: the ramp and tail's decode steps, and how many of those drafted (accept length above 1.00: a drafting
  step whose every draft was rejected reads as step 0, which one request at C=1 often does);
- switches: consecutive decode lines of which one drafted and the other did not (the adaptive policy's switches);
- tok/s: every decode line's tokens over the wall;
- with --host (watch.py's host.csv, taken beside the logs: both in UTC seconds), the host through the level's span:
  the median of the fixed piece of Python's milliseconds and of the CPUs' stolen share (a server bound by its host
  runs at the host's pace: a slower level beside a slower probe or a higher steal is the host's, not the server's).
"""
from __future__ import annotations

import argparse
import gzip
import io
import re
import statistics
import sys
from datetime import datetime
from pathlib import Path

from rig.core import RigError
from rig.core.fs import open_regular

IDLE_S = 0.3  # a gap this long is the client between rounds: left out of the wall
MAX_LINE = 65536  # characters: SGLang's lines and watch.py's are far shorter; a longer one is no log's, and skipped
LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})[^\]]*\] (Prefill|Decode) batch[.,] (.*)$")
# counts of at most 9 digits and a plain decimal: what SGLang writes, and what int() and float() always take
RUNNING = re.compile(r"#running-req: (\d{1,9})\b")
NEW_SEQ = re.compile(r"#new-seq: (\d{1,9})\b")
ACCEPT = re.compile(r"accept len: (\d{1,6}(?:\.\d{1,9})?)(?![0-9.])")
EPOCH = datetime(1970, 1, 1)


class LogError(Exception):
    """A log that cannot be read at all: one line, never a traceback."""


def _text(path: Path, what: str = "server log", give: str = "a server's log (or its .gz)"):
    """PATH's lines, read as they come (a gzip one decompressed as it is read, never whole in memory)."""
    try:
        raw = open_regular(path, what)  # a FIFO or a device is refused, never waited on
        with (gzip.open(raw, "rt", errors="replace") if path.suffix == ".gz" else
              io.TextIOWrapper(raw, errors="replace")) as handle:
            while text := handle.readline(MAX_LINE):
                if len(text) == MAX_LINE and not text.endswith("\n"):  # longer than any log's line: dropped
                    while (rest := handle.readline(MAX_LINE)) and not rest.endswith("\n"):
                        pass
                    continue
                yield text
    except RigError as exc:
        raise LogError(f"{exc}; give {give}") from None
    except (OSError, EOFError) as exc:  # gzip's BadGzipFile is an OSError
        raise LogError(f"cannot read {ascii(str(path))}: {getattr(exc, 'strerror', None) or exc}; give {give}"
                       ) from None


def _seconds(stamp: str) -> float | None:
    """The timestamp's seconds, or None where no such time exists (month 13, second 99): a line that is no log's."""
    try:
        return (datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f") - EPOCH).total_seconds()
    except ValueError:
        return None


def lines(path: Path) -> list[tuple]:
    """(seconds, kind, running after the batch, accept length or None, whether it is a prefill into an empty
    server) per scheduler line with a ms timestamp."""
    rows = []
    for text in _text(path):
        m = LINE.match(text.rstrip("\n"))
        if not m or (at := _seconds(m[1])) is None:
            continue
        before = running = int(r[1]) if (r := RUNNING.search(m[3])) else 0
        if m[2] == "Prefill":  # a prefill line counts the running batch before its new sequences join
            running += int(n[1]) if (n := NEW_SEQ.search(m[3])) else 0
        rows.append((at, m[2], running, float(a[1]) if (a := ACCEPT.search(m[3])) else None,
                     m[2] == "Prefill" and before == 0))
    return rows


def windows(rows: list[tuple], levels: list[int]) -> dict[int, list[tuple]]:
    """Each level's lines: tune runs the levels in ascending order, so a level starts at the last prefill into an
    empty server before the first batch larger than the level below's (its ramp included)."""
    starts = {}
    for below, level in zip(levels, levels[1:], strict=False):
        # well past the level below (a batch can read one over its level while a finished request leaves)
        first = next((i for i, r in enumerate(rows) if r[2] > max(2 * below, below + 2)), None)
        if first is None:
            break
        while first > 0 and not rows[first][4]:
            first -= 1
        starts[level] = first
    bounds = [(levels[0], 0), *sorted(starts.items(), key=lambda kv: kv[1])]
    return {level: rows[at:nxt] for (level, at), (_, nxt) in zip(bounds, [*bounds[1:], (None, len(rows))], strict=True)}


def counted(gap: float) -> bool:
    """Whether a gap between two lines is the server's wall: not the client between rounds (IDLE_S or more), nor a
    line whose time runs backwards."""
    return 0 <= gap < IDLE_S


def summary(rows: list[tuple], level: int) -> dict:
    """The level's wall (idle gaps left out) and where it went; "full" is a decode step at exactly LEVEL running."""
    s = {"wall": 0.0, "prefills": 0, "prefill_s": 0.0, "full": 0, "full_s": 0.0, "below": 0, "below_s": 0.0,
         "below_drafting": 0, "switches": 0, "tokens": 0.0}
    drafting_before = None
    for before, row in zip(rows, rows[1:], strict=False):
        gap = row[0] - before[0]
        if not counted(gap):
            continue
        s["wall"] += gap
        if row[1] == "Prefill":
            s["prefills"] += 1
            s["prefill_s"] += gap
            continue
        drafting = row[3] is not None and abs(row[3] - 1.0) > 1e-9
        s["tokens"] += row[2] * (row[3] or 1.0)
        if row[2] >= level:
            s["full"] += 1
            s["full_s"] += gap
        else:
            s["below"] += 1
            s["below_s"] += gap
            s["below_drafting"] += drafting
        if drafting_before is not None and drafting != drafting_before:
            s["switches"] += 1
        drafting_before = drafting
    return s


HOST_NUMBER = re.compile(r"\d{1,12}(?:\.\d{1,6})?")  # what watch.py writes: plain decimals, never signs or exponents


def host_rows(path: Path) -> list[tuple[float, float, float | None]]:
    """host.csv's (time, probe ms, steal % or None where the file predates that column) per line, its columns found
    by the header's names; a line whose numbers are not watch.py's (a sign, an exponent, a share above 100) is
    skipped, as a log's foreign line is."""
    rows, columns = [], None
    for text in _text(path, "host.csv", "watch.py's host.csv from the same run"):
        fields = text.rstrip("\r\n").split(",")
        if fields[:2] == ["time", "python_ms"]:
            columns = {name: at for at, name in enumerate(fields)}
            continue
        if columns is None or len(fields) != len(columns) or \
                not all(HOST_NUMBER.fullmatch(f) for f in (fields[0], fields[1])):
            continue
        steal = fields[columns["steal_pct"]] if "steal_pct" in columns else ""
        if steal and not (HOST_NUMBER.fullmatch(steal) and float(steal) <= 100):
            continue
        rows.append((float(fields[0]), float(fields[1]), float(steal) if steal else None))
    return rows


def active(rows: list[tuple]) -> list[tuple[float, float]]:
    """The level's busy stretches: runs of consecutive lines whose gaps summary counts in the wall."""
    spans: list[tuple[float, float]] = []
    for before, row in zip(rows, rows[1:], strict=False):
        if counted(row[0] - before[0]):
            if spans and spans[-1][1] == before[0]:
                spans[-1] = (spans[-1][0], row[0])
            else:
                spans.append((before[0], row[0]))
    return spans


def host_cell(host: list[tuple], rows: list[tuple]) -> str:
    """The host while the level was busy: each host.csv line speaks for the time since the line before it (its
    shares cover that stretch), so it counts where that stretch meets one of the level's busy stretches. The
    probe's median ms and the median steal %, with how many lines; '-' where none met."""
    busy = active(rows)
    met = [h for prev, h in zip(host, host[1:], strict=False)  # the first line has no stretch before it
           if any(prev[0] < end and start <= h[0] for start, end in busy)]
    if not met:
        return "-"
    steals = [h[2] for h in met if h[2] is not None]
    steal = f", steal {statistics.median(steals):.1f} %" if steals else ""
    return f"{statistics.median(h[1] for h in met):.1f} ms ({len(met)}){steal}"


def table(paths: list[Path], levels: list[int], host: Path | None = None) -> str:
    head = ("| server | level | wall s | prefill batches (s) | at C: steps (s), steps/s | "
            "below C: steps (s), of them drafting | switches | decode tok/s over the wall |")
    if host:
        head += " host: probe median (lines), steal |"
    machine = host_rows(host) if host else []
    out, met = [head, "|" + "---|" * (head.count("|") - 1)], False
    for path in paths:
        for level, rows in windows(lines(path), levels).items():
            s = summary(rows, level)
            if not s["wall"]:
                continue
            rate = s["full"] / s["full_s"] if s["full_s"] else float("nan")
            server = cell(path.name.split(".")[0])
            beside = host_cell(machine, rows) if host else ""
            met = met or beside not in ("", "-")
            out.append(f"| {server} | C={level} | {s['wall']:.2f} | {s['prefills']} ({s['prefill_s']:.2f}) | "
                       f"{s['full']} ({s['full_s']:.2f}), {rate:.1f} | {s['below']} ({s['below_s']:.2f}), "
                       f"{s['below_drafting']} | {s['switches']} | {s['tokens'] / s['wall']:.0f} |"
                       + (f" {beside} |" if host else ""))
    if host and not met:  # another run's file, or a log's clock not in UTC
        raise LogError(f"no line of host.csv {ascii(str(host))} falls while a level ran (both read in UTC); give "
                       "watch.py's host.csv from the same run as the logs")
    return "\n".join(out)


def cell(text: str) -> str:
    """TEXT as one table cell: a control character or a '|' shown, never a new row or column."""
    return "".join(c if c.isprintable() and c != "|" else ascii(c)[1:-1] if c != "|" else "\\|" for c in text)


def levels(text: str) -> list[int]:
    """--levels: ascending whole numbers above 0, as tune runs them."""
    try:
        found = [int(c) for c in text.split(",")]
    except ValueError:
        found = []
    if not found or found[0] < 1 or any(b <= a for a, b in zip(found, found[1:], strict=False)):
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: give ascending whole numbers above 0, as 1,16,64")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="timeline", description=__doc__.split("\n")[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--levels", type=levels, default="1,16,64,256")
    parser.add_argument("--host", type=Path, help="watch.py's host.csv from the same run: the host's pace per level")
    args = parser.parse_args()
    try:
        print(table(args.logs, args.levels, args.host))
    except LogError as exc:
        print(f"timeline: error: {exc}", file=sys.stderr)
        sys.exit(2)  # as argparse exits for a bad option


if __name__ == "__main__":
    main()
