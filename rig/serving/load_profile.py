"""A server's load over time, as a histogram of running requests: what `rig tune --load-profile` weighs each
measured level by, to choose the one server that pays best for that load.

Read from what an SGLang box already has, whichever FILE holds (told apart by content):
- the server's log: the scheduler's decode lines, `[YYYY-MM-DD HH:MM:SS TP0] Decode batch, #running-req: N, ...
  gen throughput (token/s): G` (one every decode_log_interval steps; a prefill line's running count is not a
  decode's). A line stands for the decode steps since its rank's previous one, so it weighs by the seconds
  between their stamps; a span that held an idle spell (far longer than the spans before it: SGLang logs nothing
  while idle) and the first line, whose span began before the log did, weigh what a line's span averages.
  Where a decode line carries no stamp, every line weighs N / G (the time of a step; 1 without a throughput):
  SGLang's G divides by the whole gap, idle time included, so this fallback overweighs lines after idle spells;
- a scrape of its Prometheus endpoint (`--enable-metrics`), in the exposition format: samples
  `sglang:num_running_reqs{...} N [TIMESTAMP]`, e.g.
  `while sleep 1; do curl -s http://HOST:PORT/metrics | grep '^sglang:num_running_reqs'; done > load.txt`.
  Each sample weighs the same (one scrape interval); one with a `priority` label is a part of its scrape's total
  (SGLang's priority scheduling exports both), not a sample of its own;
- a JSON object {"histogram": {"RUNNING": WEIGHT, ...}} (weights are shares in any unit, not summing to 1).
Idle samples (0 running) are dropped: a server with nothing to run serves nothing whatever its config.
The file is read in bounded pieces: a line's first MAX_LINE bytes (the rest streams past, never held; a longer
line is no sample), at most MAX_LINES lines and MAX_BYTES in all, a JSON histogram at most MAX_JSON.
"""
from __future__ import annotations

import io
import math
import os
import re
import statistics
from collections import deque
from collections.abc import Iterable, Iterator
from datetime import datetime
from itertools import chain
from pathlib import Path
from typing import BinaryIO

from rig.core import RigError, numbers
from rig.core.documents import parse_json
from rig.core.fs import MAX_READ, open_regular

DECODE = re.compile(r"Decode batch[.,]? .{0,200}?#running-req: ([0-9]{1,7})\b")
THROUGHPUT = re.compile(r"gen throughput \(token/s\): ([0-9]{1,9}(?:\.[0-9]{1,6})?)")
# SGLang's logging prefix: local time to the second, then the rank (`TP0`, `DP1 TP1`), each rank logging its own
STAMP = re.compile(r"\[([0-9]{4})-([0-9]{2})-([0-9]{2})[ T]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:[.,]([0-9]{1,6}))?"
                   r"([^\]]{0,64})\]")
METRIC = "sglang:num_running_reqs"
_LABEL = r'[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\\n]|\\.)*"[ \t]*'  # a value may hold } , and \"
SAMPLE = re.compile(  # the text exposition format's sample line: name, {labels}, value (Go's float), timestamp (ms)
    r"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    rf"(?:[ \t]*\{{(?P<labels>(?:{_LABEL},)*(?:{_LABEL})?)\}}[ \t]*|[ \t]+)"
    r"(?P<value>[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|(?i:inf(?:inity)?|nan)))"
    r"(?:[ \t]+-?[0-9]{1,19})?[ \t\r]*")
LABEL_NAME = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"(?:[^"\\\n]|\\.)*"')
BLANK = b" \t\r\n\x0b\x0c"
BOM = b"\xef\xbb\xbf"

MAX_LINE = 4000  # a decode or sample line is a few hundred bytes; the rest of a longer one is not read
BLOCK = 1 << 20  # bytes read at a time: what a line (however long) holds in memory while it streams past
MAX_BYTES = 1 << 34  # a log is read as it streams, up to 16 GiB
MAX_LINES = 1 << 27  # a 16 GiB log of 200-byte lines has 86 million
MAX_JSON = MAX_READ  # a histogram is read whole
MAX_WEIGHT = 1e300  # a share in any unit (an hour in ns is 3.6e12): 16 MiB of entries this size sum below 1.8e308
MAX_RANKS = 4096
WINDOW = 16  # a rank's recent spans, whose median says what a line's span is while the server is busy
WARMUP = 4  # a rank's first spans wait until this many are there to be judged against (or the log ends)
IDLE_FACTOR = 4  # a span this many times the recent median (beyond the stamps' slack) held an idle spell
STAMP_SLACK = 2.0  # seconds: stamps are whole seconds, so a span and the median it is judged by are each off by 1


def load(path: str | Path) -> dict[int, float]:
    """A load profile file, a regular file read as it streams (a server's log can be large, and not all UTF-8)."""
    with open_regular(path, "load profile") as handle:
        # its size from fstat: a /proc file is regular, says 0 and cannot seek to its end
        if os.fstat(handle.fileno()).st_size > MAX_BYTES:
            raise RigError(f"load profile {path} is larger than {MAX_BYTES >> 30} GiB; give a part of the log")
        return read(handle, f"load profile {path}")


def parse(text: str, source: str) -> dict[int, float]:
    """{running requests: share of busy time} from TEXT (a log, a metrics scrape or rig's JSON histogram)."""
    return read(io.BytesIO(text.encode("utf-8", "surrogatepass")), source)


def read(stream: BinaryIO, source: str) -> dict[int, float]:
    """{running requests: share of busy time} from a binary STREAM, its kind told by content: a JSON histogram
    starts with `{` (after any blank lines) and is one JSON document with a "histogram"; anything else is read
    line by line, as a log or a scrape (a log of JSON lines starts with `{` too)."""
    blocks = _blocks(stream, source)
    first, skipped_lines = next(blocks, b"").removeprefix(BOM), 0
    while first and not first.strip(BLANK):  # blank space before the content says nothing, and is not held
        skipped_lines += first.count(b"\n")
        first = next(blocks, b"")
    held, note = [first], ""
    if first.lstrip(BLANK).startswith(b"{"):
        size = len(first)
        while size <= MAX_JSON and (block := next(blocks, b"")):
            held.append(block)
            size += len(block)
        if size > MAX_JSON:
            note = f"more than {MAX_JSON >> 20} MiB"
        else:
            try:
                document = parse_json(b"".join(held).decode("utf-8", "replace"), source)
            except RigError as exc:
                note = str(exc).removeprefix(f"{source}: ")
            else:
                if isinstance(document, dict) and "histogram" in document:
                    return _shares(_histogram(document["histogram"], source), source, "")
                note = 'a JSON object without "histogram"'
    return _shares(_samples(_lines(chain(held, blocks), source, skipped_lines), source), source, note)


def _blocks(stream: BinaryIO, source: str) -> Iterator[bytes]:
    total = 0
    while block := stream.read(BLOCK):
        total += len(block)
        if total > MAX_BYTES:
            raise RigError(f"{source} is larger than {MAX_BYTES >> 30} GiB; give a part of the log")
        yield block


def _lines(blocks: Iterable[bytes], source: str, skipped: int) -> Iterator[tuple[int, str, bool]]:
    """(line number, the line's first MAX_LINE bytes as text, whether that is all of it) for each line of BLOCKS;
    the rest of a longer line streams past unheld, however long (a file with no newline is one line)."""
    number, head, cut = skipped, b"", False  # the current line's first bytes; whether its rest is being skipped
    for block in blocks:
        if cut and b"\n" not in block:  # the middle of a line being skipped: looked through, never copied
            continue
        *ended, tail = block.split(b"\n")
        for part in ended:
            number += 1
            if number > MAX_LINES:
                raise RigError(f"{source} has more than {MAX_LINES} lines; give a part of the log")
            line = head if cut else head + part[:MAX_LINE + 1]
            yield number, line[:MAX_LINE].decode("utf-8", "replace"), not cut and len(line) <= MAX_LINE
            head, cut = b"", False
        if not cut:
            head += tail[:MAX_LINE + 1]
            head, cut = head[:MAX_LINE], len(head) > MAX_LINE
    if head:
        yield number + 1, head.decode("utf-8", "replace"), not cut


def _samples(lines: Iterable[tuple[int, str, bool]], source: str) -> dict[int, float]:
    """{running: weight} from a log's decode lines or a scrape's samples (one or the other: their weights are
    different units)."""
    scraped: dict[int, float] = {}
    decode = _DecodeLog()
    for number, line, whole in lines:
        where = f"{source}: line {number}"
        text = line.lstrip(" \t")
        if text.startswith("#"):  # the exposition format's comments: # HELP, # TYPE
            continue
        if text.startswith(METRIC) and text[len(METRIC):len(METRIC) + 1] in ("{", " ", "\t", "\r", ""):
            if not whole:  # its head could read as a sample, its value cut short
                raise RigError(f"{where}: a {METRIC} line longer than {MAX_LINE} bytes; give the scrape as "
                               "/metrics wrote it")
            if (running := _sample(text, where)) is not None:
                scraped[running] = scraped.get(running, 0.0) + 1
        elif whole and (found := _decode(line)):  # a longer line is no decode line (a logged prompt?)
            decode.add(line, found, where)
        else:
            continue
        if scraped and decode.lines:
            raise RigError(f"{where}: the file holds both a server log's decode lines and /metrics samples; give "
                           "one or the other")
    return scraped or decode.weights()


def _decode(line: str) -> re.Match | None:
    """LINE's decode-line match, found from its one `#running-req: ` back to the `Decode batch` before it: a
    line of many `Decode batch` would otherwise start a scan at each one (quadratic in the line)."""
    at = line.find("#running-req: ")
    head = line.rfind("Decode batch", max(0, at - 220), at) if at >= 0 else -1
    return DECODE.match(line, head) if head >= 0 else None


def _sample(text: str, where: str) -> int | None:
    """The running requests of a sglang:num_running_reqs sample, or None for a per-priority part of the total."""
    found = SAMPLE.fullmatch(text)
    if not found or found["name"] != METRIC:
        raise RigError(f"{where}: {text[:80]!r} is not a sample of the Prometheus text format "
                       '(NAME{LABEL="VALUE",...} VALUE [TIMESTAMP]); give the scrape as /metrics wrote it')
    labels = LABEL_NAME.findall(found["labels"] or "")
    if len(set(labels)) != len(labels):
        raise RigError(f"{where}: a label is given twice; give the scrape as /metrics wrote it")
    if "priority" in labels:
        return None
    return round(numbers.parse(found["value"], f"{where}: running requests", float, 0, numbers.MAX_RUNNING_REQUESTS))


class _DecodeLog:
    """A log's decode lines as {running: weight}: seconds from their stamps, or N / G where a line has none."""

    def __init__(self) -> None:
        self.lines = self.unstamped = 0
        self.paced: dict[int, float] = {}  # running: sum of N / G, the fallback
        self.timed: dict[int, float] = {}  # running: seconds of spans read from stamps
        self.untimed: dict[int, int] = {}  # running: lines whose span is unknown or held idle time
        self.busy_seconds, self.busy_spans = 0.0, 0
        self.ranks: dict[str, _Rank] = {}

    def add(self, line: str, found: re.Match, where: str) -> None:
        running = int(numbers.parse(found.group(1), where, int, 0, numbers.MAX_RUNNING_REQUESTS, whole=True))
        rate = THROUGHPUT.search(line)
        speed = numbers.parse(rate.group(1), where, float, 0, 1e9) if rate else 0
        self.paced[running] = self.paced.get(running, 0.0) + (running / speed if speed and running else 1.0)
        self.lines += 1
        if not (stamp := STAMP.search(line, 0, found.start())):
            self.unstamped += 1
            return
        moment, name = _seconds(stamp, where), stamp.group(8).strip()
        if name not in self.ranks and len(self.ranks) >= MAX_RANKS:
            raise RigError(f"{where}: more than {MAX_RANKS} ranks ([... TP0]) log decode lines; not an SGLang log")
        rank = self.ranks.setdefault(name, _Rank())
        last, rank.last = rank.last, moment
        if last is None or moment < last:  # its span began before the log did, or before a clock was set back
            self.untimed[running] = self.untimed.get(running, 0) + 1
            return
        rank.spans.append(moment - last)
        rank.pending.append((running, moment - last))
        if len(rank.spans) >= WARMUP:  # enough spans to tell a busy one from one that held an idle spell
            self._judge(rank)

    def _judge(self, rank: _Rank) -> None:
        for running, span in rank.pending:
            if span <= STAMP_SLACK or span <= IDLE_FACTOR * statistics.median_low(rank.spans) + STAMP_SLACK:
                self.timed[running] = self.timed.get(running, 0.0) + span
                self.busy_seconds += span
                self.busy_spans += 1
            else:
                self.untimed[running] = self.untimed.get(running, 0) + 1
        rank.pending.clear()

    def weights(self) -> dict[int, float]:
        for rank in self.ranks.values():  # a short log's few spans, judged against one another
            self._judge(rank)
        if self.unstamped or not self.busy_seconds:  # one unit for all lines; stamps a second apart at least
            return self.paced
        typical = self.busy_seconds / self.busy_spans
        return {running: self.timed.get(running, 0.0) + self.untimed.get(running, 0) * typical
                for running in self.timed.keys() | self.untimed.keys()}


class _Rank:
    """One rank's decode lines so far: its last stamp, its recent spans, and those not yet judged (until WARMUP)."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.spans: deque[float] = deque(maxlen=WINDOW)
        self.pending: list[tuple[int, float]] = []


def _seconds(stamp: re.Match, where: str) -> float:
    year, month, day, hour, minute, second = (int(part) for part in stamp.group(1, 2, 3, 4, 5, 6))
    try:
        moment = datetime(year, month, day, hour, minute, second, int((stamp.group(7) or "").ljust(6, "0")))
    except ValueError:
        raise RigError(f"{where}: {stamp.group(0)[:40]!r} is not a date and time (YYYY-MM-DD HH:MM:SS); fix the "
                       "line or leave it out") from None
    return (moment - datetime(2000, 1, 1)).total_seconds()


def _histogram(histogram: object, source: str) -> dict[int, float]:
    if not isinstance(histogram, dict):
        raise RigError(f"{source}: a JSON load profile is {{\"histogram\": {{\"RUNNING\": WEIGHT, ...}}}}")
    counts: dict[int, float] = {}
    for key, weight in histogram.items():
        running = int(numbers.parse(str(key), f"{source}: running requests {key!r}", int, 0,
                                    numbers.MAX_RUNNING_REQUESTS, whole=True))
        if found := numbers.problem(weight, 0, MAX_WEIGHT, limit=MAX_WEIGHT):
            raise RigError(f"{source}: weight of {key}: {found}")
        counts[running] = counts.get(running, 0.0) + weight
    return counts


def _shares(counts: dict[int, float], source: str, note: str) -> dict[int, float]:
    """COUNTS over their sum, idle and weightless ones dropped; scaled by the largest first, so that no sum of
    finite weights overflows."""
    counts.pop(0, None)
    top = max(counts.values(), default=0)
    scaled = {running: weight / top for running, weight in sorted(counts.items()) if weight} if top else {}
    total = math.fsum(scaled.values())
    if not total:
        raise RigError(f"{source}: no busy sample (no `Decode batch ... #running-req: N` log line, no "
                       "sglang:num_running_reqs sample above 0, no histogram weight"
                       + (f"; as a JSON histogram: {note}" if note else "")
                       + "): give the server's log, a scrape of its /metrics or {\"histogram\": {\"RUNNING\": "
                       "WEIGHT, ...}}")
    return {running: share for running, weight in scaled.items() if (share := weight / total) > 0}


def nearest(running: int, measured: list[int]) -> int:
    """The measured concurrency that stands for RUNNING requests: the nearest on a log scale (load effects grow
    with the batch's size, not its difference)."""
    return min(measured, key=lambda c: (abs(math.log(c) - math.log(running)), c))
