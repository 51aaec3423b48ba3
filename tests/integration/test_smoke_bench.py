"""`rig smoke` and `rig bench`, end to end, against the SGLang API stand-in (tests/sglang_api_server.py).

Each test starts real server processes and runs the real rig CLI against them
over HTTP. The servers are shaped like the seeds' measurements: EAGLE-3 faster
for one stream, the baseline faster under load, so the crossover has a known place.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.commands import rig
from harness.paths import BIN
from harness.standin import STAND_IN, free_port

PNG = b"\x89PNG\r\n\x1a\n"
# Seeds' shape, four times as fast: EAGLE-3 serves one stream at 560 tok/s against 400,
# but all streams together at 1440 against 3200. Total tok/s min(560C, 1440) vs
# min(400C, 3200): EAGLE-3 wins at C=1..3 (1440 > 1200) and loses from C=4 on.
EAGLE = ["--rate", "560", "--capacity", "1440", "--accept-length", "2.5"]
BASELINE = ["--rate", "400", "--capacity", "3200"]
QUICK = ["--max-tokens", "24", "--serial-runs", "3", "--serial-tokens", "48"]
# The crossover test's requests: twice as long, so that a request's fixed costs (a connection, the first
# chunk), which grow on a loaded machine, stay small beside the 20% that separates the servers at C=3
# (24-token requests there once left a round within the noise tolerance, and C=3 unjudged)
CROSSOVER_TOKENS = 48


def bench(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # a hang is a failure, never a stuck test run
    return rig("bench", "--json", *args, timeout=300, env=env)


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


# ------------------------------------------------------------------ smoke

def test_smoke_waits_through_503_then_reads_the_accept_length(serve):
    url = serve(*EAGLE, "--start-delay", "3")
    done = rig("smoke", "--url", url, "--timeout", "60", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["health_wait_s"] >= 2
    assert len(report["requests"]) == 3 and all(r["completion_tokens"] == 64 for r in report["requests"])
    assert report["speculation"]["source"] == "meta_info"
    assert report["speculation"]["accept_length"] == pytest.approx(2.5, abs=0.15)


@pytest.mark.parametrize("spec_meta, source", [("verify-only", "meta_info"), ("none", "/server_info")])
def test_smoke_accept_length_from_older_builds(serve, spec_meta, source):
    """spec_verify_ct alone (accept = completion_tokens / spec_verify_ct), or only /server_info's average."""
    url = serve(*EAGLE, "--spec-meta", spec_meta)
    report = json.loads(rig("smoke", "--url", url, "--json").stdout)
    assert report["ok"], report["problems"]
    assert report["speculation"] == {"accept_length": pytest.approx(2.5, abs=0.15), "source": source}


def test_smoke_fails_when_no_speculation_happened(serve):
    url = serve(*BASELINE)
    plain = rig("smoke", "--url", url, "--json")
    assert plain.returncode == 0 and json.loads(plain.stdout)["speculation"] is None
    required = rig("smoke", "--url", url, "--speculation", "--json")
    assert required.returncode == 1
    assert "no request was speculative" in json.loads(required.stdout)["msg"]


def test_smoke_fails_a_draft_the_target_almost_never_accepts(serve):
    """As the H200 showed with rig testmodel's random draft: accept length 1.02."""
    done = rig("smoke", "--url", serve(*BASELINE, "--accept-length", "1.02"), "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert "(below 1.1): the target accepted almost no draft token" in report["msg"]


def test_smoke_where_nothing_listens_says_so_not_that_a_model_is_loading():
    url = f"http://127.0.0.1:{free_port()}"
    done = rig("smoke", "--url", url, "--timeout", "2", timeout=60)
    assert done.returncode == 2 and f"nothing answered at {url} within 2 s" in done.stderr, done.stderr
    assert "start the server, or give the --url it listens on" in done.stderr and "10 minutes" not in done.stderr


def test_smoke_times_out_with_the_log_tail(serve, tmp_path):
    url = serve("--start-delay", "600")
    log = tmp_path / "server.log"
    log.write_text("".join(f"loading shard {i}\n" for i in range(40)) + "CUDA out of memory\n")
    started = time.monotonic()
    done = rig("smoke", "--url", url, "--timeout", "3", "--log", str(log), timeout=60)
    assert done.returncode == 2
    assert "not healthy within 3 s: last HTTP 503" in done.stderr
    assert "CUDA out of memory" in done.stderr and "loading shard 39" in done.stderr
    assert "loading shard 10" not in done.stderr  # a tail, not the whole log
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("bad, says", [("bytes", "byte 0xc3 at character 256"),
                                       ("surrogate", "'\\ud800' at character 256")])
def test_smoke_fails_a_completion_that_is_not_utf8(serve, bad, says):
    """Bytes no UTF-8 decoder takes (or a lone surrogate escaped in the JSON) after 64 good tokens: each completion
    fails, saying so, where U+FFFD once stood in for them and the completion passed."""
    done = rig("smoke", "--url", serve(*BASELINE, "--bad-text", bad), "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert not report["ok"] and [r["ok"] for r in report["requests"]] == [False] * 3
    assert [p.split(": ", 1)[1] for p in report["problems"]] == [f"the completion is not valid UTF-8 ({says})"] * 3
    assert all(r["text"].startswith("tok tok ") for r in report["requests"])  # shown, escaped


def test_smoke_against_a_server_that_dies(serve):
    url = serve(*BASELINE, "--die-after", "1")
    done = rig("smoke", "--url", url, "--timeout", "10", timeout=60)
    assert done.returncode == 2
    assert "POST " + url + "/generate: HTTP no answer" in done.stderr


def test_smoke_sends_the_api_key_from_the_environment(serve):
    url = serve(*BASELINE, "--api-key", "k-123")
    denied = rig("smoke", "--url", url, "--timeout", "10")
    assert denied.returncode == 2 and "HTTP 401" in denied.stderr
    allowed = rig("smoke", "--url", url, "--json", env={**os.environ, "SGLANG_API_KEY": "k-123"})
    assert allowed.returncode == 0, allowed.stderr
    assert "k-123" not in allowed.stdout + allowed.stderr


# ------------------------------------------------------------------ bench

def test_bench_finds_the_crossover_where_it_is(serve, tmp_path):
    eagle, baseline = serve(*EAGLE), serve(*BASELINE)
    out = tmp_path / "run"
    done = bench("--url", eagle, "--baseline-url", baseline, "--concurrency", "1,2,3,5,10", *QUICK,
                 "--max-tokens", str(CROSSOVER_TOKENS), "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["crossover"]["highest_winning_concurrency"] == 3
    assert "up to concurrency 3" in summary["crossover"]["recommendation"]
    data = results(out)
    mine, theirs = data["runs"]
    assert data["format"] == 1 and [lv["max_concurrency"] for lv in mine["levels"]] == [1, 2, 3, 5, 10]
    # the mean in flight (sglang.bench_serving's `concurrency`) stays at or below the level's C
    assert all(0 < lv["concurrency"] <= lv["max_concurrency"] + 1e-6 for lv in mine["levels"])
    assert [lv["requests"] for lv in mine["levels"]] == [90] * 5  # 3 rounds of 30
    assert all(len(lv["round_output_throughput"]) == 3 for lv in mine["levels"] + theirs["levels"])
    assert [r["verdict"] for r in summary["crossover"]["levels"]] == ["won", "won", "won", "lost", "lost"]
    for level in mine["levels"] + theirs["levels"]:
        assert level["failed"] == 0 and level["total_output_tokens"] == level["requests"] * CROSSOVER_TOKENS
        for metric in ("ttft", "tpot", "itl", "e2e_latency"):  # sglang.bench_serving's names, each number once
            assert level[f"median_{metric}_ms"] <= level[f"p90_{metric}_ms"] <= level[f"p99_{metric}_ms"]
        assert level["per_request_speed"]["p50"] <= level["per_request_speed"]["p90"]
        assert not {"throughput", "ttft_s", "tpot_s", "e2e_s", "value", "round_values", "in_flight"} & set(level)
    assert all(lv["accept_length"] == pytest.approx(2.5, abs=0.15) for lv in mine["levels"])
    assert all(lv["accept_length"] is None for lv in theirs["levels"])
    # per-request speed falls under load only where the capacity is shared out
    assert mine["levels"][-1]["per_request_speed"]["p50"] < 0.5 * mine["levels"][0]["per_request_speed"]["p50"]
    serial = mine["serial"]
    assert serial["requests"] == serial["completed"] == 3 and "tok_s" not in serial
    assert min(serial["round_output_throughput"]) <= serial["output_throughput"] <= max(serial["round_output_throughput"])
    assert serial["output_throughput"] > theirs["serial"]["output_throughput"]
    report = (out / "report.md").read_text()
    assert "Highest concurrency where EAGLE-3 still wins: 3" in report
    for png in ("throughput.png", "per_request.png"):
        assert (out / png).read_bytes()[:8] == PNG


def test_bench_compares_with_an_earlier_baseline_run(serve, tmp_path):
    """On one box the two servers cannot run at once: the baseline's results.json stands in for its URL."""
    # a quarter of the usual rates: the two runs are measured apart, so the tokens/s each can reach must stay well
    # below what a loaded 2-core machine streams, or CPU contention during one run decides the comparison
    slow_baseline, slow_eagle = ["--rate", "100", "--capacity", "800"], ["--rate", "140", "--capacity", "360",
                                                                         "--accept-length", "2.5"]
    first = tmp_path / "baseline"
    assert bench("--url", serve(*slow_baseline), "--concurrency", "1,5", *QUICK, "--min-seconds", "1", "--rounds", "1",
                 "--out", str(first)).returncode == 0
    second = tmp_path / "eagle"
    done = bench("--url", serve(*slow_eagle), "--baseline-results", str(first / "results.json"),
                 "--concurrency", "1,5", *QUICK, "--min-seconds", "1", "--rounds", "1", "--out", str(second))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["crossover"]["highest_winning_concurrency"] == 1


def test_bench_records_malformed_chunks_as_failed_requests(serve, tmp_path):
    url = serve(*BASELINE, "--malformed-every", "5")
    done = bench("--url", url, "--concurrency", "2", *QUICK, "--out", str(tmp_path))
    assert done.returncode == 1
    level = results(tmp_path)["runs"][0]["levels"][0]
    assert level["failed"] >= 5 and level["completed"] == level["requests"] - level["failed"] > 0
    assert any(e.startswith("malformed chunk") for e in level["errors"])
    assert "request(s) failed" in json.loads(done.stdout)["msg"]


def test_bench_stops_when_the_server_dies_and_keeps_what_it_measured(serve, tmp_path):
    url = serve(*BASELINE, "--die-after", "50")  # dies in the second level
    done = bench("--url", url, "--concurrency", "1,4,8", *QUICK, "--rounds", "1", "--out", str(tmp_path))
    assert done.returncode == 1
    run = results(tmp_path)["runs"][0]
    assert "stopped answering" in run["stopped"]
    assert run["levels"][0]["failed"] == 0 and run["levels"][0]["output_throughput"] > 0
    assert len(run["levels"]) == 2 and run["levels"][1]["failed"] > 0
    assert (tmp_path / "report.md").read_text().count("Stopped early") == 1


def test_bench_goes_on_when_the_server_refuses_by_context_length(serve, tmp_path):
    """A build whose /server_info does not say its context length: the serial runs are refused, as SGLang
    refuses them inside a 200 stream, and the sweep still runs."""
    url = serve(*BASELINE, "--context-length", "200", "--hide-context")
    done = bench("--url", url, "--concurrency", "1,2", "--max-tokens", "24", "--serial-runs", "2",
                 "--serial-tokens", "400", "--rounds", "1", "--out", str(tmp_path))
    assert done.returncode == 1, done.stderr
    run = results(tmp_path)["runs"][0]
    assert run["stopped"] is None and run["serial"]["completed"] == 0 and run["serial"]["failed"] == 2
    assert run["serial"]["errors"][0].startswith("refused (HTTP 200): Requested token count exceeds the model's "
                                                 "maximum context length of 200 tokens")
    assert [lv["failed"] for lv in run["levels"]] == [0, 0] and run["levels"][1]["output_throughput"] > 0
    assert "gives no context length" in results(tmp_path)["notes"][0]


def test_bench_refuses_a_plan_that_cannot_fit_the_context(serve, tmp_path):
    url = serve(*BASELINE, "--context-length", "300")
    done = bench("--url", url, "--concurrency", "1", "--max-tokens", "24", "--serial-tokens", "290", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "the plan asks for 290 output tokens (serial_tokens)" in done.stderr
    assert "context length is 300 tokens: lower bench.serial_tokens (or --serial-tokens) to at most" in done.stderr
    assert not (tmp_path / "results.json").exists()


def test_smoke_reports_a_refused_request_with_sglangs_reason(serve):
    url = serve(*BASELINE, "--context-length", "50")
    done = rig("smoke", "--url", url, "--max-tokens", "64", "--timeout", "10")
    assert done.returncode == 2
    assert "HTTP 400" in done.stderr and "maximum context length of 50 tokens" in done.stderr


def test_smoke_stops_waiting_when_the_server_process_exits(tmp_path):
    port = free_port()
    server = subprocess.Popen([sys.executable, str(STAND_IN), "--port", str(port), "--start-delay", "600"])
    log = tmp_path / "server.log"
    log.write_text("RuntimeError: Loaded weights leave no GPU memory for the KV cache\n")
    killer = subprocess.Popen(["bash", "-c", f"sleep 3; kill {server.pid}"])
    try:
        started = time.monotonic()
        done = rig("smoke", "--url", f"http://127.0.0.1:{port}", "--timeout", "120", "--pid", str(server.pid),
                   "--log", str(log), timeout=100)
        took = time.monotonic() - started
    finally:
        server.kill()
        server.wait()
        killer.wait()
    assert done.returncode == 2
    assert f"the server (process {server.pid}) exited" in done.stderr and "no GPU memory" in done.stderr
    assert took < 60  # not the 120 s timeout


def test_bench_outside_a_checkout_takes_the_schema_plan_the_default_url_and_a_prompt_file(serve, tmp_path):
    url = serve(*BASELINE)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "one two three", "max_tokens": 5}\n{"prompt": "four five six", "max_tokens": 5}\n')
    env = {k: v for k, v in os.environ.items() if k != "RIG_STACK"}
    done = subprocess.run([str(BIN / "rig"), "bench", "--url", url, "--prompts", str(prompts), "--concurrency", "1",
                           "--serial-runs", "1", "--serial-tokens", "24", "--rounds", "1", "--min-requests", "2",
                           "--out", str(tmp_path / "out"), "--json"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    level = results(tmp_path / "out")["runs"][0]["levels"][0]
    assert level["requests"] == level["completed"] == 2 and level["total_output_tokens"] == 10  # the file's 5 each
    shown = " ".join(subprocess.run([str(BIN / "rig"), "bench", "--help"], cwd=tmp_path, env=env,
                                    capture_output=True, text=True, check=False).stdout.split())
    assert "default: http://127.0.0.1:30000" in shown and "none found: the schema's defaults" in shown


def test_bench_refuses_bad_input(tmp_path):
    bad = rig("bench", "--url", "http://127.0.0.1:9", "--concurrency", "1,two", "--out", str(tmp_path))
    assert bad.returncode == 2 and "--concurrency '1,two'" in bad.stderr
    for option, value, says in (("--concurrency", "0", "concurrency[0]: 0 is out of range"),
                                ("--concurrency", "", "--concurrency ''"), ("--rounds", "0", "rounds: 0 is out of range"),
                                ("--serial-tokens", "-5", "serial_tokens: -5 is out of range"),
                                ("--temperature", "nan", "temperature: nan"),
                                ("--top-p", "0", "top_p: must be above 0, at most 1")):
        bad = rig("bench", "--url", "http://127.0.0.1:9", option, value, "--out", str(tmp_path))
        assert bad.returncode == 2 and says in bad.stderr, (option, value, bad.stderr)
    # one plan, one set of words: tune refuses the same options as bench, before it looks for a venv
    for option, value in (("--max-tokens", "0"), ("--concurrency", "1,x"), ("--temperature", "3")):
        said = [rig(command, option, value, "--out", str(tmp_path), *extra).stderr
                for command, extra in (("bench", ["--url", "http://127.0.0.1:9"]), ("tune", ["--venv", "/nonexistent"]))]
        assert said[0] == said[1] and said[0].startswith("rig: error:"), said
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    bad = rig("bench", "--url", "http://127.0.0.1:9", "--out", str(a_file))
    assert bad.returncode == 2 and "is a file" in bad.stderr
    bad = rig("bench", "--url", "http://127.0.0.1:9", "--baseline-results", str(a_file), "--out", str(tmp_path))
    assert bad.returncode == 2 and "not a results.json of rig bench" in bad.stderr
    assert not (tmp_path / "results.json").exists()


def test_a_server_that_never_ends_a_request_is_held_to_a_deadline_by_smoke_and_bench(serve, tmp_path):
    """A chunk every 0.2 s past max_new_tokens never trips a read timeout: bench fails the request at its chunk
    limit (it asked for 8 tokens), and at its whole-request deadline when the chunks stay within it; smoke's
    non-streamed request ends at its own deadline (issue 49: every request gets a deadline)."""
    url = serve("--stream-forever")
    began = time.monotonic()
    done = bench("--url", url, "--concurrency", "1", "--max-tokens", "8", "--serial-runs", "1",
                 "--serial-tokens", "8", "--rounds", "1", "--min-requests", "1", "--warmup", "0",
                 "--read-timeout", "5", "--out", str(tmp_path / "chunks"))
    assert done.returncode == 1, done.stderr[-2000:]
    level = results(tmp_path / "chunks")["runs"][0]["levels"][0]
    assert level["failed"] == level["requests"] and "went on past the request's end" in level["errors"][0]
    done = bench("--url", url, "--concurrency", "1", "--max-tokens", "500", "--serial-runs", "1",
                 "--serial-tokens", "500", "--rounds", "1", "--min-requests", "1", "--warmup", "0",
                 "--request-timeout", "2", "--out", str(tmp_path / "deadline"))
    assert done.returncode == 1
    assert "longer than the request timeout (2 s)" in results(tmp_path / "deadline")["runs"][0]["levels"][0]["errors"][0]
    smoked = rig("smoke", "--url", url, "--timeout", "20", "--request-timeout", "2", "--json", timeout=120)
    assert smoked.returncode != 0
    assert time.monotonic() - began < 60  # every one of them ended on its own limits, not the test's
