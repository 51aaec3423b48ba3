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


def test_host_csv_gives_each_level_the_hosts_pace_and_steal_in_its_span(tmp_path):
    log = tmp_path / "policy.log"
    log.write_text("\n".join(GOOD) + "\n")
    start = 1767225600  # 2026-01-01 00:00:00 UTC, the log's first line
    host = tmp_path / "host.csv"
    host.write_text("time,python_ms,busy_pct,steal_pct,iowait_pct,load1\n"
                    f"{start - 60},99.0,1.0,50.0,0.0,0.1\n"  # before the level: not its
                    f"{start + 1},9.0,80.0,2.0,0.0,3.0\n{start + 2},17.0,80.0,4.0,0.0,3.0\n"
                    f"{start + 2.5},nan,80.0,9.0,0.0,3.0\nno host's line\n{start + 2.6},13.0\n")  # skipped; an old file's
    done = run(str(log), "--levels", "1,16", "--host", str(host))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[2].endswith("| 13.0 ms (3), steal 3.0 % |"), done.stdout
    host.write_text("time,python_ms\n")  # nothing in the span: said, not a number
    assert run(str(log), "--levels", "1,16", "--host", str(host)).stdout.splitlines()[2].endswith("| - |")
    host.unlink()
    os.mkfifo(host)  # refused, never waited on
    refused = run(str(log), "--levels", "1,16", "--host", str(host))
    assert refused.returncode == 2 and "is not a regular file" in refused.stderr and "host.csv" in refused.stderr
