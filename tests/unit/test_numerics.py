"""The numerics rule (rig/serving/numerics.py) and how rig prove reads a server's answer to it."""
from __future__ import annotations

import http.server
import json
import math
import threading

import pytest

from rig.core import RigError
from rig.serving import numerics
from rig.serving.measure.verdict import margin_problem
from rig.serving.prove import _margin, check_numerics, greedy_tokens


def test_every_prompt_has_its_own_highest_rank_and_the_continuation_never_passes_it():
    prompts = numerics.prompts()
    highest = [max(numerics.rank_of(t) for t in p) for p in prompts]
    assert highest == [4, 8, 12, 16, 20, 24, 28, 32]
    for prompt, top in zip(prompts, highest, strict=True):
        ranks = [numerics.rank_of(t) for t in numerics.continuation(prompt)]
        assert len(ranks) == numerics.NEW_TOKENS and all(1 <= r <= top for r in ranks)
    # the next token depends on both the current token and the highest one
    assert numerics.next_rank(3, 8) != numerics.next_rank(3, 16) and numerics.next_rank(3, 8) != numerics.next_rank(4, 8)


def test_the_table_the_builder_takes_is_the_rule_itself():
    table = numerics.table()
    assert table["ids"] == [numerics.token(r) for r in range(1, numerics.RANKS + 1)]
    assert not set(table["decoys"]) & set(table["ids"])
    for top in range(1, numerics.RANKS + 1):
        for cur in range(1, top + 1):
            assert table["next"][top - 1][cur - 1] == numerics.next_rank(cur, top)


def test_a_prompt_with_a_token_outside_the_rule_is_refused():
    with pytest.raises(ValueError, match="rule tokens only"):
        numerics.continuation([numerics.token(1), 3])


@pytest.mark.parametrize("position, margin", [
    ([[-0.001, 5, None], [-8.001, 6, None]], 8.0), ([[-0.1, 5, None]], None), ([[None, 0, None], [None, 1, None]], None),
    ([[float("nan"), 5, None], [-8.0, 6, None]], "nan"), ("not a list", None),
    ([[True, 5, None], [-1.0, 6, None]], None)])
def test_a_margin_is_read_only_from_two_logprobs_and_nan_is_never_not_given(position, margin):
    """NaN logprobs are broken logits: a margin that is not a number, which fails the numerics (issue 49)."""
    got = _margin(position)
    if margin == "nan":
        assert got is not None and math.isnan(got)
        assert "not finite" in margin_problem([8.0, got])
    else:
        assert (got is None) if margin is None else got == pytest.approx(margin)


class Answers(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("body, error", [
    (b"<html>", "the answer is not JSON"), (b'{"text": "x"}', "no output_ids"),
    (b'{"output_ids": [1, true]}', "no output_ids"), (b'{"output_ids": "512"}', "no output_ids"),
    (b"[1, 2]", "not a JSON object")])
def test_a_server_answer_that_is_not_token_ids_is_one_clear_error(server, body, error):
    Answers.body = body
    with pytest.raises(RigError, match=error):
        greedy_tokens(f"http://127.0.0.1:{server.server_port}", [numerics.token(1)], 4, "RIG_TEST_NO_KEY")


def test_the_first_difference_is_named_with_the_prompt_and_the_position(server):
    want = [numerics.continuation(p) for p in numerics.prompts()]
    wrong = list(want[0])
    wrong[5] = numerics.DECOYS[0]
    Answers.body = json.dumps({"output_ids": wrong, "meta_info": {}}).encode()
    result = check_numerics(f"http://127.0.0.1:{server.server_port}", "RIG_TEST_NO_KEY", [want[0]] * 8)
    assert result["matched"] == 0 and result["first_difference"]["position"] == 5
    assert result["first_difference"]["got"][0] == numerics.DECOYS[0] and result["min_margin"] is None


@pytest.mark.parametrize("body", [b"<html>", b'{"output_ids": [512.0, 513.0]}'])
def test_a_baseline_whose_numerics_gave_no_answer_is_no_reference_and_never_a_crash(server, monkeypatch, tmp_path,
                                                                                      body):
    """HTML or float token ids fail the baseline's numerics step; its bench step still runs, and the serving-size
    step read the failed check's empty answer (KeyError: 'matched', exit 70). EAGLE-3 is skipped, with why."""
    import contextlib

    from rig.core.check import Runner
    from rig.serving import prove

    class Measured:  # what the brief bench measured: one level that served
        def __init__(self, *_):
            self.run = {"levels": [{"level": "c1", "output_throughput": 10.0, "median_ttft_ms": 1.0,
                                    "median_itl_ms": 1.0, "server_accept_length": None, "failed": 0}]}

    @contextlib.contextmanager
    def serving(_servers, _label, _argv, _url, _log, data, _eagle):
        data["smoke"] = "answered"
        yield

    monkeypatch.setattr(prove, "serving", serving)
    monkeypatch.setattr(prove, "Server", Measured)
    monkeypatch.setattr(prove, "measured", lambda *_: None)
    Answers.body = body
    report = Runner("prove")
    lines = {"baseline tp1": ["base"], "eagle3 tp1": ["eagle"]}
    prove._serve_size(None, report, lines, f"http://127.0.0.1:{server.server_port}", 1, 1, tmp_path,
                      "RIG_TEST_NO_KEY", {})
    steps = {c.name: (c.status, c.detail) for c in report.checks}
    assert steps["baseline tp1: numerics"][0] == "fail" and steps["baseline tp1: bench"][0] == "pass"
    assert steps["eagle3 tp1"] == ("skip", "the baseline's numerics gave no answer, so there is no reference")
