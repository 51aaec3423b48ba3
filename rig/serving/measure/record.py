"""A measuring run's record: its one shape, in sglang.bench_serving's names, how it is written into --out and how an
earlier one is read back.

The shape (LEVEL, SERIAL, RUN) is declared once, as schema fields: the documents that hold runs (bench's
results.json, tune.json, prove.json) are checked against it when written and read through it. Each holds `format`:
FORMAT. A file without one is rig's pre-1 format and is converted where it is read (upgraded), once; the reader says
so.

The record is written when the run ends, however it ends (a server that stops, an error, Ctrl-C), with `stopped`
saying why; a failure to write it never hides why the run stopped. tune also writes it mid-way, after each server
(a checkpoint, `stopped` saying so): a machine taken back, or a process killed, writes nothing at the end.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeGuard, cast

from rig.core import RigError, numbers, outdir, progress
from rig.core.schema import Field, between, validate
from rig.serving.measure.stats import REQUEST_SPEED, ms_key

FORMAT = 1  # 1: sglang.bench_serving's names (completed, duration, total_output_tokens, max_concurrency, concurrency)
FORMAT_FIELD = Field(int, required=True, choices=(FORMAT,))

_NUMBER = Field((int, float, type(None)))
_TEXT = Field((str, type(None)))
_NUMBERS = Field(list, default=[], item=_NUMBER)  # per round; None: a round that measured nothing
_COUNT = Field(int, default=0, check=between(0, numbers.LIMIT))
_ERRORS = Field(list, default=[], item=Field(multiline=True))  # a request's error may quote a server's lines
_RUNNING = Field((int, type(None)), check=lambda v: None if v is None else numbers.problem(
    v, 1, numbers.MAX_RUNNING_REQUESTS))
LATENCIES = ("ttft", "tpot", "itl", "e2e_latency")
# the metrics a run may be judged by (the plan's): each the median of its rounds, round_NAME beside it (rounds_of)
METRICS = ("output_throughput", "goodput")

# One level of one run: what its requests came to over every round, and the judged metrics per round.
LEVEL = Field(dict, fields={
    "level": _TEXT, "rate": _NUMBER, "max_concurrency": Field(int, required=True, check=between(
        1, numbers.MAX_RUNNING_REQUESTS)),  # the level's C: requests kept in flight (open-loop: at most)
    "requests": _COUNT, "completed": _COUNT, "failed": _COUNT, "errors": _ERRORS,
    "total_output_tokens": _NUMBER, "duration": _NUMBER,
    "total_throughput": _NUMBER, "request_throughput": _NUMBER,
    "concurrency": _NUMBER,  # the mean in flight (Little's law): the running batch the server saw
    "per_request_speed": Field((dict, type(None)), values=_NUMBER),
    **{ms_key(stat, name): _NUMBER for name in LATENCIES for stat in ("mean", "median", "p90", "p99")},
    "accept_length": _NUMBER, "server_accept_length": _NUMBER, "round_server_accept_length": _NUMBERS,
    **{key: spec for metric in (*METRICS, REQUEST_SPEED)
       for key, spec in ((metric, _NUMBER), (f"round_{metric}", _NUMBERS))},
    "profile": Field((dict, type(None)), open=True)})
# The serial runs: each one request alone, its output tokens/s a "round" of its own.
SERIAL = Field((dict, type(None)), fields={
    "requests": _COUNT, "completed": _COUNT, "failed": _COUNT, "errors": _ERRORS,
    "output_throughput": _NUMBER, "round_output_throughput": _NUMBERS})
# One server measured: what it said of itself, its serial runs and its levels (bench's runs).
RUN = Field(dict, open=True, fields={
    "url": Field(required=True), "label": _TEXT, "speculative_algorithm": _TEXT,
    "context_length": Field((int, type(None))), "max_running_requests": _RUNNING, "serial": SERIAL,
    "levels": Field(list, default=[], item=LEVEL), "stopped": Field((str, type(None)), multiline=True)})


def judged(level: dict, metric: str) -> str:
    """What LEVEL is judged by for a run judged by METRIC: METRIC, but at an open-loop level (a request rate) output
    throughput is each request's own speed (REQUEST_SPEED) where the level has it per round (a record made before
    it keeps the throughput it was judged by); goodput already counts what each request got."""
    return REQUEST_SPEED if metric == METRICS[0] and level.get("rate") and level.get(f"round_{REQUEST_SPEED}") \
        else metric


def value_of(level: dict | None, metric: str) -> float | None:
    """LEVEL's judged value (judged) for a run judged by METRIC: its median over rounds; None where not measured."""
    return (level or {}).get(judged(level or {}, metric))


def rounds_of(level: dict, metric: str) -> list:
    """LEVEL's judged value (judged) per round (None where a round measured nothing); its median is value_of."""
    return level.get(f"round_{judged(level, metric)}") or []


def capped(run: dict, level: dict) -> int | None:
    """The server's max_running_requests where it held LEVEL below its concurrency, else None."""
    cap = run.get("max_running_requests")
    return cap if cap and cap < level["max_concurrency"] else None


# ------------------------------------------------------------------ rig's pre-1 format, converted where it is read

# pre-1 names -> format 1's (a pre-1 level's `concurrency` was its C; its `in_flight` the mean in flight)
PRE_1 = {"concurrency": "max_concurrency", "in_flight": "concurrency", "ok": "completed", "duration_s": "duration",
         "output_tokens": "total_output_tokens", "throughput": "output_throughput",
         "round_throughput": "round_output_throughput"}
# older still: latency spreads in seconds
PRE_1_SPREADS = {"ttft_s": "ttft", "tpot_s": "tpot", "e2e_s": "e2e_latency"}
SPREAD_STATS = {"p50": "median", "p90": "p90", "p99": "p99"}


def _level(old: Any, metric: str) -> Any:
    """A pre-1 level in format 1: renamed; `value`/`round_values` are METRIC's; `capped_at` is dropped (the run's
    max_running_requests says it: capped); spreads in seconds are the ms keys. What is no level is left for the
    schema to refuse."""
    if not isinstance(old, dict):
        return old
    old = cast(dict[str, Any], old)
    level: dict[str, Any] = {}
    for key, value in old.items():
        if key not in ("value", "round_values", "capped_at", *PRE_1_SPREADS):
            level.setdefault(PRE_1.get(key, key), value)  # both spellings of one number hold the same value
    if "value" in old:
        level.update({metric: old["value"], f"round_{metric}": old.get("round_values") or []})
    for key, name in PRE_1_SPREADS.items():
        spread = old.get(key) if isinstance(old.get(key), dict) else {}
        for stat, new in SPREAD_STATS.items():
            if _number(seconds := spread.get(stat)):
                level.setdefault(ms_key(new, name), seconds * 1000)
    return level


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _serial(old: Any) -> Any:
    """Pre-1 serial runs (runs, ok, tok_s, median, min, max) in format 1."""
    if not isinstance(old, dict) or "tok_s" not in old:
        return old
    old = cast(dict[str, Any], old)
    runs, ok = old.get("runs"), old.get("ok")
    return {"requests": runs, "completed": ok, "failed": runs - ok if _number(runs) and _number(ok) else None,
            "errors": old.get("errors", []), "output_throughput": old.get("median"),
            "round_output_throughput": old["tok_s"]}


def _each(items: Any, convert: Callable[[Any], Any]) -> Any:
    """CONVERT over a list's items or a mapping's values; anything else as it is (the schema refuses it)."""
    if isinstance(items, list):
        return [convert(item) for item in items]
    if isinstance(items, dict):
        return {key: convert(item) for key, item in items.items()}
    return items


def upgraded(document: Any) -> Any:
    """DOCUMENT (results.json, tune.json or prove.json) of rig's pre-1 format in format 1: its runs' and variants'
    levels and serial runs, the crossover's rows and tune's cap renamed."""
    if not isinstance(document, dict):
        return document
    metric: str = document["metric"] if document.get("metric") in METRICS else METRICS[0]

    def run(old: Any) -> Any:  # bench's run (levels a list) or tune's variant (levels by name)
        if not isinstance(old, dict):
            return old
        new = {**old, "levels": _each(old.get("levels"), lambda lv: _level(lv, metric))}
        return {**new, "serial": _serial(old["serial"])} if "serial" in old else new

    def row(old: Any) -> Any:  # a crossover row: its C is max_concurrency
        return {("max_concurrency" if k == "concurrency" else k): v for k, v in old.items()} \
            if isinstance(old, dict) else old

    new = {**document, "format": FORMAT}
    for key in ("runs", "variants"):
        if key in document:
            new[key] = _each(document[key], run)
    if isinstance(document.get("crossover"), dict):
        new["crossover"] = {**document["crossover"], "levels": _each(document["crossover"].get("levels"), row)}
    if "running_cap" in document:
        new["max_running_requests"] = new.pop("running_cap")
    return new


def read(path: str | Path, name: str, spec: Field) -> dict:
    """The document NAME at PATH read through SPEC, an older format converted first (and said)."""
    from rig.core.documents import load_json

    document = load_json(path, name)
    found = document.get("format") if isinstance(document, dict) else None
    if found is None:
        progress(f"read {name} in rig's pre-{FORMAT} format ({path})")
        document = upgraded(document)
    elif found != FORMAT:
        raise RigError(f"{path}: format {found!r}: this rig reads {name} of format {FORMAT} and rig's older ones; "
                       "read it with the rig that wrote it")
    return validate(document, spec, str(path))


# ------------------------------------------------------------------ writing


def reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# what a record written while its run goes on says in `stopped`: read after the run was killed, it is the truth
STILL_RUNNING = "still running when this was written (a checkpoint: a run killed here wrote nothing later)"


class Written(list):
    """A record's writer, and the paths it wrote (the list): save() at the run's end, checkpoint() mid-run."""

    def __init__(self, out: str | Path, result: dict, name: str, spec: Field, report: Callable[[dict], str],
                 draw: Callable[[dict], dict] | None, settle: Callable[[dict], None] | None):
        super().__init__()
        self._out, self._result, self._name, self._spec = out, result, name, spec
        self._report, self._draw, self._settle = report, draw, settle

    def save(self) -> None:
        """The record (SETTLE first, where a verdict is drawn from state kept apart), then report.md and the figures:
        a report that fails to render never costs the record. A record off its schema is written, then raised."""
        result = self._result
        result["finished"] = time.time()
        if self._settle:
            self._settle(result)
        off_shape = self._write(result)
        draw = self._draw
        self.extend(outdir.write(self._out, {"report.md": self._report(result)}, (lambda: draw(result)) if draw else None))
        if off_shape:
            raise off_shape

    def checkpoint(self) -> None:
        """The record as measured so far, `stopped` saying the run goes on (STILL_RUNNING: however this run ends, its
        end writes the record again, unless it is killed outright), so a run whose machine is taken back mid-way
        keeps what it finished. No verdict (SETTLE) and no report: those are the end's. Nothing here stops the run."""
        snapshot = {**self._result, "finished": time.time(), "stopped": self._result["stopped"] or STILL_RUNNING}
        try:
            if off_shape := self._write(snapshot, keep=False):
                progress(f"a checkpoint of {self._name}: {off_shape}")
        except Exception as exc:  # noqa: BLE001 - the run goes on, and its own error is the one to report
            progress(f"could not write a checkpoint of {self._name} into {self._out}: {exc}")

    def _write(self, result: dict, keep: bool = True) -> RigError | None:
        """RESULT as the JSON record, written whether or not it holds to the schema (rig's own bug: the measurement
        is kept all the same); the schema's error, or None."""
        try:
            validate(result, self._spec, self._name)
            off_shape = None
        except RigError as exc:
            off_shape = exc
        paths = outdir.write(self._out, {self._name: outdir.record(result, self._name)})
        if keep:
            self.extend(paths)
        return off_shape


@contextmanager
def recorded(out: str | Path, result: dict, name: str, spec: Field, report: Callable[[dict], str],
             draw: Callable[[dict], dict] | None = None,
             settle: Callable[[dict], None] | None = None) -> Iterator[Written]:
    """Run the block, then write RESULT as the JSON record NAME, held to SPEC, REPORT(RESULT) as report.md and
    DRAW(RESULT)'s figures into OUT (Written.save); however the block ends, `stopped` saying why it did. The writer
    yielded lists the paths written; its checkpoint() writes the record mid-run."""
    result.setdefault("format", FORMAT)
    result.setdefault("started", time.time())
    result.setdefault("stopped", None)
    written = Written(out, result, name, spec, report, draw, settle)
    try:
        yield written
    except BaseException as exc:
        result["stopped"] = result["stopped"] or reason(exc)
        try:
            written.save()
        except Exception as again:  # noqa: BLE001 - the first error is the one to report
            progress(f"could not write what was measured to {out}: {again}")
        raise
    written.save()
