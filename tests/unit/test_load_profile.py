"""rig tune --load-profile: a server's load read from its log, a metrics scrape or a histogram, and the one
server that pays best for it."""
import json
import re
import tracemalloc
from collections import Counter
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rig.core import RigError
from rig.serving import load_profile
from rig.serving.load_profile import BLOCK, MAX_LINE, load, nearest, parse, read
from rig.serving.measure.plan import Level
from rig.serving.measure.verdict import for_load

START = datetime(2026, 12, 5, 10, 0, 0)


def decode(seconds, running, throughput, rank="TP0"):
    """An SGLang scheduler's decode line, stamped SECONDS after START (SGLang stamps whole seconds)."""
    return (f"[{START + timedelta(seconds=seconds):%Y-%m-%d %H:%M:%S} {rank}] Decode batch, #running-req: "
            f"{running}, #token: {running * 140}, token usage: 0.05, cuda graph: True, gen throughput (token/s): "
            f"{throughput:.2f}, #queue-req: 0, ")


def prefill(seconds, new):
    return (f"[{START + timedelta(seconds=seconds):%Y-%m-%d %H:%M:%S} TP0] Prefill batch, #new-seq: {new}, "
            f"#new-token: {512 * new}, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, ")


def unstamped(log):
    return re.sub(r"^\[[^]]*\] ", "", log, flags=re.M)


# SGLang's scheduler lines (decode every decode_log_interval steps); a prefill line's #running-req is no decode's
LOG = (
    "[2026-12-04 10:00:01 TP0] Decode batch. #running-req: 64, #token: 13312, token usage: 0.05, "
    "gen throughput (token/s): 6400.00, #queue-req: 0\n"
    "[2026-12-04 10:00:02 TP0] Prefill batch. #new-seq: 1, #new-token: 40, #cached-token: 0, #running-req: 3\n"
    "[2026-12-04 10:00:03 TP0] Decode batch. #running-req: 64, #token: 13400, token usage: 0.05, "
    "gen throughput (token/s): 6400.00, #queue-req: 3\n"
    "[2026-12-04 10:00:04 TP0] Decode batch. #running-req: 1, #token: 200, token usage: 0.00, "
    "gen throughput (token/s): 100.00, #queue-req: 0\n"
    "[2026-12-04 10:00:05 TP0] Decode batch. #running-req: 0, #token: 0, token usage: 0.00, #queue-req: 0\n")
SCRAPE = """sglang:num_running_reqs{model_name="m",engine_type="unified"} 12.0
sglang:num_running_reqs{model_name="m",engine_type="unified"} 12.0
sglang:num_queue_reqs{model_name="m"} 4.0
sglang:num_running_reqs 3
"""
MODEL = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
HELP = ("# HELP sglang:num_running_reqs The number of running requests.\n"
        "# TYPE sglang:num_running_reqs gauge\n")


def scrape_0523(total, parts, stamp):
    """One /metrics answer of SGLang 0.5.23 with priority scheduling: the total, then a sample per priority."""
    labels = f'engine_type="unified",{MODEL},pp_rank="0",tp_rank="0"'
    return (HELP + f"sglang:num_running_reqs{{{labels}}} {total:.1f} {stamp}\n"
            + "".join(f'sglang:num_running_reqs{{{labels},priority="{p}"}} {n:.1f} {stamp}\n'
                      for p, n in enumerate(parts))
            + "# HELP sglang:num_running_reqs_offline_batch The number of running low-priority offline batch "
              "requests(label is 'batch').\n# TYPE sglang:num_running_reqs_offline_batch gauge\n"
              f"sglang:num_running_reqs_offline_batch{{{labels}}} 0.0 {stamp}\n"
              f"# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
              f"sglang:num_queue_reqs{{{labels}}} 3.0 {stamp}\n")


def test_a_log_without_stamps_a_scrape_and_a_histogram_give_shares_of_busy_time(tmp_path):
    # without stamps each decode line stands for the same steps: 64 running at 6400 tok/s is 0.01 s a step, 1 at
    # 100 tok/s too; the idle line is no load, the prefill line's 3 no decode
    log = unstamped(LOG)
    assert parse(log, "log") == pytest.approx({1: 1 / 3, 64: 2 / 3})
    slow = log.replace("gen throughput (token/s): 100.00", "gen throughput (token/s): 25.00")  # 0.04 s a step
    assert parse(slow, "log") == pytest.approx({1: 2 / 3, 64: 1 / 3})
    path = tmp_path / "server.log"
    path.write_bytes(log.encode() + b"\xff\xfe not UTF-8\n")  # a real log is read whole, odd bytes and all
    assert load(path) == pytest.approx({1: 1 / 3, 64: 2 / 3})
    assert parse(SCRAPE, "scrape") == pytest.approx({3: 1 / 3, 12: 2 / 3})
    assert parse('{"histogram": {"4": 3, "256": 1}}', "json") == {4: 0.75, 256: 0.25}


def test_a_stamped_log_weighs_each_decode_line_by_the_seconds_since_its_ranks_previous_one():
    # LOG once weighed by N / G (so {1: 1/3, 64: 2/3}); its stamps say 64 ran 2 s (10:00:01-03) and 1 ran 1 s, and
    # the first line, whose span began before the log, weighs the average span (4 s over 3 spans)
    assert parse(LOG, "log") == pytest.approx({1: 1 / (1 + 2 + 4 / 3), 64: (2 + 4 / 3) / (1 + 2 + 4 / 3)})
    # with DP attention each rank logs its own decode lines: DP0 every 4 s at 8 running, DP1 every second or two
    # at 2; across ranks every span would be one second
    dp0 = [decode(t, 8, 80, "DP0 TP0") for t in (0, 4, 8)]
    dp1 = [decode(t, 2, 80, "DP1 TP1") for t in (1, 2, 3, 5, 6, 7)]
    lines = sorted(dp0 + dp1, key=lambda line: line[:20])
    assert parse("\n".join(lines), "dp") == pytest.approx({2: (6 + 2) / 18, 8: (8 + 2) / 18})


def test_a_bursty_log_counts_its_idle_spells_as_no_load():
    # three bursts: a request arrives after 10 idle minutes, its first decode line (1 running) divides by the whole
    # gap in SGLang's throughput, then 40 s at 64 running (a line each 0.5 s: 40 steps at 12.5 ms)
    lines = []
    for burst in range(3):
        begin = burst * 640.4
        lines += [prefill(begin, 1), decode(begin + 0.3, 1, 40 / 600.3 if burst else 130)]
        lines += [decode(begin + 0.3 + 0.5 * k, 64, 5120) for k in range(1, 81)]
    log = "\n".join(lines)
    shares = parse(log, "bursty")
    assert shares[64] == pytest.approx(0.99, abs=0.005) and set(shares) == {1, 64}
    # without stamps, only SGLang's throughput is left, and it counts the idle minutes as time at 1 running
    assert parse(unstamped(log), "bursty") == pytest.approx({1: 0.905, 64: 0.095}, abs=0.001)


def test_a_scrape_with_priority_scheduling_counts_each_scrapes_total_once():
    # 0.5.23 with priority scheduling: 10 running, 4 at priority 0 and 6 at priority 1 is one sample of 10;
    # timestamps (ms) and label values holding } , and \" are the format's own
    scrape = "".join(scrape_0523(10, (4, 6), 1764900000000 + 1000 * s) for s in range(5))
    scrape += scrape_0523(32, (32,), 1764900005000)
    assert parse(scrape, "0.5.23") == pytest.approx({10: 5 / 6, 32: 1 / 6})
    odd = ('# a comment\n\n  sglang:num_running_reqs{model_name="odd}name, \\"quoted\\" \\\\",tp_rank="0",} '
           "7 -1764900000000\r\n"
           "sglang:num_running_reqs { model_name = \"m\" } 1.4e1\n"
           "sglang:num_running_reqs\t7.0\n")
    assert parse(odd, "odd") == pytest.approx({7: 2 / 3, 14: 1 / 3})


@pytest.mark.parametrize("text, says", [
    ('sglang:num_running_reqs{model_name="m} 4\n', "not a sample of the Prometheus text format"),
    ("sglang:num_running_reqs{a=\"1\",a=\"2\"} 4\n", "a label is given twice"),
    ("sglang:num_running_reqs 4 5 6\n", "not a sample"), ("sglang:num_running_reqs NaN\n", "not a finite number"),
    ("sglang:num_running_reqs -2\n", "out of range"),
    ("sglang:num_running_reqs 4\n[2026-12-05 10:00:00 TP0] Decode batch, #running-req: 3, ", "one or the other"),
    ("[2026-13-05 10:00:00 TP0] Decode batch, #running-req: 3, ", "not a date and time"),
    ('sglang:num_running_reqs{model_name="' + "m" * MAX_LINE + '"} 12\n', f"longer than {MAX_LINE} bytes"),
])
def test_a_sample_the_format_does_not_allow_or_a_mixed_file_is_refused(text, says):
    with pytest.raises(RigError, match=says):
        parse(text, "profile")


def test_a_json_histogram_is_told_by_its_content_and_its_weights_are_shares_in_any_unit():
    pretty = json.dumps({"histogram": {str(n): n for n in range(1, 1001)}})  # one line of 12 kB
    assert len(pretty) > MAX_LINE and parse("\n\n  " + pretty, "wide")[1000] == pytest.approx(1000 / 500500)
    assert parse('\ufeff\n{"histogram": {"4": 3}}\n', "bom") == {4: 1.0}
    nanoseconds = '{"histogram": {"1": 3.6e12, "64": 1.08e13, "8": 0}}'  # an hour and three; 8 never ran
    assert parse(nanoseconds, "ns") == {1: 0.25, 64: 0.75}
    assert parse('{"histogram": {"1": 1e300, "2": 1e300, "3": 1e300}}', "huge") == pytest.approx(
        {1: 1 / 3, 2: 1 / 3, 3: 1 / 3})
    # Docker's json-file log is JSON lines around SGLang's own: a log, not a histogram
    docker = "".join(json.dumps({"log": decode(t, 16, 1600) + "\n", "stream": "stderr"}) + "\n" for t in range(4))
    assert parse(docker, "docker") == {16: 1.0}


@pytest.mark.parametrize("text, says", [
    ("nothing here\n", "no busy sample"), ('{"histogram": [1, 2]}', "a JSON load profile is"),
    ('{"histogram": {"4": -1}}', "weight of 4"), ('{"histogram": {"x": 1}}', "running requests 'x'"),
    ('{"histogram": {"' + "9" * 5000 + '": 1}}', "rig reads none longer"),
    ('{"histogram": {"4": 1e301}}', "beyond"), ('{"histogram": {"4": 1', "as a JSON histogram: not valid JSON"),
    ('{"histogram": {"4": 1, "4": 2}}', "a key is given twice"), ('{"other": 1}', 'without "histogram"'),
])
def test_a_profile_without_a_busy_sample_or_with_bad_numbers_is_refused(text, says):
    with pytest.raises(RigError, match=says):
        parse(text, "profile")


class Zeros:
    """SIZE NUL bytes and no newline, then TAIL: a huge file made as it is read, one shared block at a time."""

    def __init__(self, size, tail=b""):
        self.left, self.tail, self.block = size, tail, bytes(BLOCK)

    def read(self, wanted):
        if self.left:
            size = min(wanted, self.left, BLOCK)
            self.left -= size
            return self.block if size == BLOCK else self.block[:size]
        tail, self.tail = self.tail[:wanted], self.tail[wanted:]
        return tail


def _peak(stream):
    tracemalloc.start()
    try:
        return read(stream, "huge"), tracemalloc.get_traced_memory()[1]
    except RigError as exc:
        return exc, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_line_of_gigabytes_streams_past_in_bounded_memory(tmp_path):
    # the 4 GiB profile with no newline was read as one line (MemoryError, exit 70)
    refused, peak = _peak(Zeros(4 << 30))
    assert isinstance(refused, RigError) and "no busy sample" in str(refused) and peak < 8 << 20
    log = "\n" + unstamped(LOG)  # after the long line, a log is read as ever
    shares, peak = _peak(Zeros(4 << 30, log.encode()))
    assert shares == pytest.approx({1: 1 / 3, 64: 2 / 3}) and peak < 8 << 20
    prompt = "Decode batch, #running-req: 999, " + "y" * MAX_LINE  # a logged prompt, say: no decode line
    assert parse(prompt + log, "prompt") == pytest.approx({1: 1 / 3, 64: 2 / 3})
    sparse = tmp_path / "sparse.log"  # a real file through load(): no block is written
    with sparse.open("wb") as handle:
        handle.truncate(64 << 20)
    with pytest.raises(RigError, match="no busy sample"):
        load(sparse)


def test_a_profile_is_bounded_by_its_line_count_and_its_size(monkeypatch):
    monkeypatch.setattr(load_profile, "MAX_LINES", 1000)
    assert parse("\n" * 999 + "sglang:num_running_reqs 4", "short") == {4: 1.0}
    with pytest.raises(RigError, match="more than 1000 lines"):
        parse("\n" * 1000 + "sglang:num_running_reqs 4\n", "long")
    monkeypatch.setattr(load_profile, "MAX_BYTES", 1 << 30)
    with pytest.raises(RigError, match="larger than 1 GiB"):
        read(Zeros((1 << 30) + 1), "big")


LINES = st.one_of(
    st.builds(lambda n, g: f"[t TP0] Decode batch. #running-req: {n}, #token: 9, gen throughput (token/s): {g}",
              st.integers(0, 10**9), st.one_of(st.integers(0, 10**12), st.floats(0, 1e12), st.just("nan"))),
    st.builds(lambda t, n: decode(t, n, 100), st.integers(0, 10**6), st.integers(0, 300)),
    st.builds(lambda d, n: f"[2026-{d} 10:00:00 TP0] Decode batch, #running-req: {n}, ",
              st.text("0123456789-", min_size=5, max_size=5), st.integers(0, 9)),
    st.builds(lambda n: f"sglang:num_running_reqs{{model_name=\"m\"}} {n}", st.one_of(
        st.integers(-5, 10**9), st.floats(allow_nan=True), st.text(max_size=8))),
    st.text(max_size=80))


@settings(max_examples=150, deadline=None)
@given(st.lists(LINES, max_size=12))
def test_any_log_is_a_profile_of_busy_shares_or_one_clear_error(lines):
    try:
        shares = parse("\n".join(lines), "fuzzed")
    except RigError:
        return
    assert shares and abs(sum(shares.values()) - 1) < 1e-9 and all(0 < r <= 1 << 20 for r in shares)


def _escaped(value):
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


LABELS = st.dictionaries(st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda name: name != "priority"), st.text(max_size=12), max_size=4)
SAMPLES = st.lists(st.tuples(
    LABELS, st.integers(0, 500), st.sampled_from(["{}", "{}.0", "{:e}", "+{}"]),
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), st.booleans(), st.sampled_from([" ", "\t", "  "])),
    min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(SAMPLES)
def test_any_exposition_sample_is_read_as_the_format_writes_it(samples):
    lines, counted = [HELP], Counter()
    for labels, running, shape, stamp, per_priority, blank in samples:
        pairs = [f'{name}="{_escaped(value)}"' for name, value in labels.items()]
        if per_priority:
            pairs.append('priority="1"')
        else:
            counted[running] += 1
        block = "{" + ",".join(pairs) + "}" if pairs else ""
        lines.append(f"sglang:num_running_reqs{block}{blank}{shape.format(running)}"
                     + ("" if stamp is None else f"{blank}{stamp}") + "\n")
        lines.append(f'sglang:num_queue_reqs{block} {running + 1}\n')  # another metric, never counted
    counted.pop(0, None)
    total = sum(counted.values())
    if not total:
        with pytest.raises(RigError, match="no busy sample"):
            parse("".join(lines), "fuzzed")
        return
    assert parse("".join(lines), "fuzzed") == pytest.approx({r: n / total for r, n in counted.items()})


def test_a_running_count_stands_at_the_measured_level_nearest_on_a_log_scale():
    assert [nearest(r, [1, 4, 16, 64]) for r in (1, 2, 3, 7, 9, 40, 500)] == [1, 1, 4, 4, 16, 64, 64]


M = "output_throughput"  # the metric the load's server is chosen by


def _measured(table):
    return {name: {level: {M: v} for level, v in levels.items()} for name, levels in table.items()}


def test_the_one_server_for_a_load_weighs_each_level_by_its_share_of_time():
    measured = _measured({"baseline": {"C=1": 100, "C=64": 1000}, "eagle3-3": {"C=1": 250, "C=64": 700}})
    levels = [Level(1), Level(64)]
    busy = for_load(measured, list(measured), levels, {1: 0.2, 60: 0.8}, M)  # mostly loaded: 820 against 610
    assert busy["chosen"] == "baseline" and busy["expected"]["baseline"] == pytest.approx(820)
    assert busy["ratios"] == {"C=1": 0.4, "C=64": 1.0} and busy["of_per_level_best"] == pytest.approx(820 / 850)
    quiet = for_load(measured, list(measured), levels, {1: 0.9, 64: 0.1}, M)  # mostly one stream: 295 against 190
    assert quiet["chosen"] == "eagle3-3" and quiet["weights"] == {"C=1": 0.9, "C=64": 0.1}
    partial = for_load(_measured({"baseline": {"C=1": 100}}), ["baseline"], levels, {64: 1.0}, M)
    assert partial["chosen"] is None and "every level" in partial["why"]


def test_a_decode_line_is_found_from_its_running_count_back_to_its_head():
    """A line of many `Decode batch` heads is one look back from its `#running-req: `, not a scan per head."""
    from rig.serving.load_profile import _decode

    line = "Decode batch " * 200 + "Decode batch, #running-req: 12, #token: 900, gen throughput (token/s): 50.0"
    assert _decode(line).group(1) == "12" and _decode("Decode batch " * 300) is None
    assert _decode("#running-req: 5 without its head") is None


def test_a_proc_file_is_read_for_what_it_holds_not_refused_by_its_seek():
    """/proc files are regular, say size 0 and cannot seek to their end: read as they stream."""
    with pytest.raises(RigError, match="no busy sample"):
        load_profile.load("/proc/self/status")
