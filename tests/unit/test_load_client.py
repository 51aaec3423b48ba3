"""The request the box tests' load sends (tests/serving_boxes.py ONE_REQUEST), here against the stand-in: the
rollout tests' "no accepted request was cut short" holds only if a cut is seen as one."""
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from harness.standin import free_port
from serving_boxes import ONE_REQUEST


def outcome(url: str, tokens: int, wait: float = 1) -> dict:
    done = subprocess.run([sys.executable, "-c", ONE_REQUEST, str(tokens), url, str(wait)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_whole_stream_is_accepted_and_counted(serve):
    assert outcome(serve("--rate", "2000", "--accept-length", "2.5"), 300) == \
        {"accepted": True, "tokens": 300, "cut": None}


def test_a_server_that_dies_mid_stream_leaves_the_request_short(serve):
    # --die-after 1: the process exits after the first step of every request (the health check is none)
    cut = outcome(serve("--die-after", "1"), 300)
    assert cut["accepted"] and cut["tokens"] < 300


def test_a_server_that_answers_health_within_the_wait_gets_the_request(serve):
    # as a box's server does once its drain and restart are over: the request waits for it in its process
    url = serve("--start-delay", "8", "--rate", "2000")
    with pytest.raises(urllib.error.HTTPError, match="503"):  # still starting when the request begins
        urllib.request.urlopen(url + "/health", timeout=5)
    assert outcome(url, 10, wait=20) == {"accepted": True, "tokens": 10, "cut": None}


def test_a_server_still_starting_or_gone_refuses(serve):
    starting = outcome(serve("--start-delay", "600"), 10)
    assert not starting["accepted"] and "503" in starting["why"]
    assert not outcome(f"http://127.0.0.1:{free_port()}", 10)["accepted"]


def test_a_stream_that_ends_in_an_error_is_accepted_and_short(serve):
    # SGLang streams a request that does not fit its context as one error chunk
    refused = outcome(serve("--context-length", "50"), 300)
    assert refused["accepted"] and refused["tokens"] == 0


def test_a_held_request_stays_in_flight_until_the_drain_then_finishes_whole(tmp_path):
    """hold_until_drain: the box tests' way to have a request in flight when a drain begins, whatever the load."""
    import signal
    import time

    from harness.standin import STAND_IN

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, str(STAND_IN), "--port", str(port), "--rate", "2000"], stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        client = subprocess.Popen([sys.executable, "-c", ONE_REQUEST, "300", url, "30", "hold"],
                                  stdout=subprocess.PIPE, text=True)
        for _ in range(300):  # until its first step is out
            try:
                if json.load(urllib.request.urlopen(url + "/rig_test/stats", timeout=5))["tokens"] > 0:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        time.sleep(0.5)  # 300 tokens at 2000/s would be done by now: only the hold keeps it
        assert client.poll() is None
        server.send_signal(signal.SIGTERM)
        assert json.loads(client.communicate(timeout=60)[0]) == {"accepted": True, "tokens": 300, "cut": None}
        assert server.wait(timeout=60) == 0
    finally:
        server.kill()
    assert "Gracefully exiting... Remaining number of requests 1" in log.read_text()
