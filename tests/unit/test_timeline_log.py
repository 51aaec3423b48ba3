"""docs/validation/real-cost-h200/timeline.py reads servers' logs: a hostile log (an impossible timestamp, a
number too long for int(), "accept len: 1.2.3", time running backwards, a gzip that is not one, a name that forges
a table row) is read as far as it is a log, or is one `timeline: error:` line, never a traceback."""
from __future__ import annotations

import gzip
import importlib.util
import os
import subprocess
import sys

import pytest
from harness.paths import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SCRIPT = REPO / "docs" / "validation" / "real-cost-h200" / "timeline.py"
spec = importlib.util.spec_from_file_location("timeline", SCRIPT)
timeline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(timeline)

GOOD = [f"[2026-01-01 00:00:0{i}.{j:03d}] Decode batch, #running-req: 16, accept len: 2.50, gen throughput: 1"
        for i in range(3) for j in range(0, 1000, 100)]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], check=False, capture_output=True, text=True, timeout=60)


def test_a_good_log_gives_its_row(tmp_path):
    log = tmp_path / "policy.log"
    log.write_text("\n".join(GOOD) + "\n")
    done = run(str(log), "--levels", "1,16")
    assert done.returncode == 0 and "| policy | C=16 | 2.90 | 0 (0.00) | 29 (2.90), 10.0 |" in done.stdout, done.stderr


@pytest.mark.parametrize("hostile", [
    "[2026-13-45 99:99:99.999] Decode batch, #running-req: 16, accept len: 2.50",  # no such time
    "[0001-01-01 00:00:00.000] Decode batch, #running-req: 16",  # before the epoch's range on some hosts
    f"[2026-01-01 00:00:03.000] Decode batch, #running-req: {'9' * 5000}",  # int() refuses 4300+ digits
    "[2026-01-01 00:00:03.000] Decode batch, #running-req: 16, accept len: 1.2.3",  # no float
    "[2025-01-01 00:00:00.000] Decode batch, #running-req: 16, accept len: 2.0",  # time running backwards
])
def test_a_hostile_line_is_skipped_not_a_traceback(tmp_path, hostile):
    log = tmp_path / "policy.log"
    log.write_text("\n".join([*GOOD[:15], hostile, *GOOD[15:]]) + "\n")
    done = run(str(log), "--levels", "1,16")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "| policy | C=16 |" in done.stdout and float(done.stdout.split("| C=16 | ")[1].split(" |")[0]) <= 2.9


@pytest.mark.parametrize("setup, args, said", [
    (lambda p: None, ["--levels", "1,16"], "cannot read"),  # no such file
    (lambda p: p.with_suffix(".gz").write_bytes(b"not gzip"), ["--levels", "1"], "Not a gzipped file"),
    (lambda p: p.write_text("x\n"), ["--levels", "1,x"], "--levels"),
    (lambda p: p.write_text("x\n"), ["--levels", "16,1"], "--levels"),
    (lambda p: p.write_text("x\n"), ["--levels", "0"], "--levels"),
    (lambda p: os.mkfifo(p), ["--levels", "1"], "is not a regular file"),  # a FIFO: refused, never waited on
])
def test_bad_input_is_one_error_line(tmp_path, setup, args, said):
    log = tmp_path / "policy.log"
    setup(log)
    target = log.with_suffix(".gz") if "gzip" in said.lower() else log
    done = run(str(target), *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert said in done.stderr.splitlines()[-1] and done.stderr.splitlines()[-1].startswith("timeline"), done.stderr


def test_a_log_name_cannot_forge_a_table_row(tmp_path):
    log = tmp_path / "a|b\n| forged | C=1 |.log"
    log.write_text("\n".join(GOOD) + "\n")
    done = run(str(log), "--levels", "1,16")
    assert done.returncode == 0, done.stderr
    row = done.stdout.splitlines()[2]
    assert len(done.stdout.splitlines()) == 3 and row.startswith("| a\\|b\\n\\| forged \\| C=1 \\| | C=16 |"), row


@given(st.lists(st.one_of(st.sampled_from(GOOD), st.text(max_size=80),
                          st.builds(lambda t, k, r, a: f"[{t}] {k} batch, #running-req: {r}, accept len: {a}",
                                    st.from_regex(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", fullmatch=True),
                                    st.sampled_from(["Decode", "Prefill"]),
                                    st.text("0123456789.", max_size=12), st.text("0123456789.e-", max_size=8))),
                max_size=40))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_log_is_read_without_an_exception(tmp_path, text):
    log = tmp_path / "any.log"
    log.write_text("\n".join(text), errors="surrogateescape")
    timeline.table([log], [1, 16, 64])
    gz = tmp_path / "any.log.gz"
    gz.write_bytes(gzip.compress(log.read_bytes()))
    timeline.table([gz], [1, 16])


def stamp(seconds: float) -> str:
    """A log line's time: SECONDS after 2026-01-01 00:00:00 UTC."""
    return f"2026-01-01 00:00:{int(seconds):02d}.{round(seconds % 1 * 1000):03d}"


T = 1767225600  # 2026-01-01 00:00:00 UTC in host.csv's epoch seconds
# C=1 busy from 0.0 to 0.9 s; idle; C=16 busy from its prefill at 10.0 s to 11.0 s, then (the client's pause between
# two of its rounds) from 11.6 to 12.0 s
TWO_LEVELS = ([f"[{stamp(i / 10)}] Decode batch, #running-req: 1, accept len: 1.00" for i in range(10)]
              + [f"[{stamp(10.0)}] Prefill batch, #new-seq: 16, #running-req: 0"]
              + [f"[{stamp(10 + i / 10)}] Decode batch, #running-req: 16, accept len: 1.00"
                 for i in [*range(1, 11), *range(16, 21)]])
HOST_LINES = [
    (-5, 999, 99),  # the first line: no stretch before it, never counted
    (0.5, 9, 1), (0.7, 100, 40), (5.0, 10, 2),  # C=1's (the last covers 0.7-5.0 s, which meets 0.7-0.9)
    (9.9, 500, 90),  # covers 5.0-9.9 s: idle, neither level's
    (10.0, 20, 3), (11.0, 30, 4),  # C=16's first stretch (the first line on its start)
    (11.5, 1000, 5),  # covers 11.0-11.5 s: C=16's pause, not its
    (17.0, 26, 6),  # covers 11.5-17 s: C=16's second stretch
    (22.0, 700, 80)]  # covers 17-22 s: after the run


def host_text(shift: float = 0, hostile: tuple[str, ...] = ()) -> str:
    """watch.py's host.csv beside TWO_LEVELS, its clock SHIFT seconds off the log's; HOSTILE lines inside C=16's
    first stretch, where a line read would count."""
    lines = [f"{T + shift + at:.3f},{ms:.2f},50.0,{steal:.1f},0.0,1.00" for at, ms, steal in HOST_LINES]
    return "\n".join(["time,python_ms,busy_pct,steal_pct,iowait_pct,load1", *lines[:6], *hostile, *lines[6:]]) + "\n"


def test_host_csv_gives_each_level_the_host_lines_that_met_its_busy_time(tmp_path):
    log = tmp_path / "policy.log"
    log.write_text("\n".join(TWO_LEVELS) + "\n")
    host = tmp_path / "host.csv"
    host.write_text(host_text(hostile=(
        f"{T + 10.2:.3f},-5.00,50.0,1.0,0.0,1.00", f"{T + 10.3:.3f},1e3,50.0,1.0,0.0,1.00",
        f"{T + 10.4:.3f},40.00,50.0,150.0,0.0,1.00", f"{T + 10.45:.3f},40.00", "9" * 70_000,
        f"{T + 10.48:.3f},inf,50.0,1.0,0.0,1.00")))
    done = run(str(log), "--levels", "1,16", "--host", str(host))
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()[2:]
    assert rows[0].startswith("| policy | C=1 |") and rows[0].endswith("| 10.0 ms (3), steal 2.0 % |"), rows
    assert rows[1].startswith("| policy | C=16 |") and rows[1].endswith("| 26.0 ms (3), steal 4.0 % |"), rows
    # a file before the steal column: the probe alone
    host.write_text("time,python_ms\n" + "".join(f"{T + at},{ms}\n" for at, ms in [(-5, 1), (0.9, 9), (9.9, 500), (11, 30)]))
    rows = run(str(log), "--levels", "1,16", "--host", str(host)).stdout.splitlines()[2:]
    assert rows[0].endswith("| 9.0 ms (1) |") and rows[1].endswith("| 30.0 ms (1) |"), rows


@pytest.mark.parametrize("text", ["time,python_ms,busy_pct,steal_pct,iowait_pct,load1\n",  # no line at all
                                  host_text(shift=3600)])  # another run's, or a log not in UTC
def test_a_host_csv_that_meets_no_level_is_one_error(tmp_path, text):
    log = tmp_path / "policy.log"
    log.write_text("\n".join(TWO_LEVELS) + "\n")
    host = tmp_path / "machine.csv"
    host.write_text(text)
    done = run(str(log), "--levels", "1,16", "--host", str(host))
    assert done.returncode == 2 and done.stderr.splitlines()[-1].startswith("timeline: error: no line of host.csv")
    os.remove(host)
    os.mkfifo(host)  # refused, never waited on
    refused = run(str(log), "--levels", "1,16", "--host", str(host))
    assert refused.returncode == 2 and "is not a regular file" in refused.stderr, refused.stderr
    assert refused.stderr.strip().endswith("give watch.py's host.csv from the same run"), refused.stderr
