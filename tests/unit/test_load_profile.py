"""rig tune --load-profile: a server's load read from its log, a metrics scrape or a histogram, and the one
server that pays best for it."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rig.core import RigError
from rig.serving.load_profile import load, nearest, parse
from rig.serving.measure.sweep import Level
from rig.serving.measure.verdict import for_load

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


def test_a_log_a_scrape_and_a_histogram_give_shares_of_busy_time(tmp_path):
    # each decode line stands for the same steps: 64 running at 6400 tok/s is 0.01 s a step, 1 at 100 tok/s too;
    # the idle line is no load, the prefill line's 3 no decode
    assert parse(LOG.splitlines(), "log") == pytest.approx({1: 1 / 3, 64: 2 / 3})
    slow = LOG.replace("gen throughput (token/s): 100.00", "gen throughput (token/s): 25.00")  # 0.04 s a step
    assert parse(slow.splitlines(), "log") == pytest.approx({1: 2 / 3, 64: 1 / 3})
    log = tmp_path / "server.log"
    log.write_bytes(LOG.encode() + b"\xff\xfe not UTF-8\n")  # a real log is read whole, odd bytes and all
    assert load(log) == pytest.approx({1: 1 / 3, 64: 2 / 3})
    assert parse(SCRAPE.splitlines(), "scrape") == pytest.approx({3: 1 / 3, 12: 2 / 3})
    assert parse(['{"histogram": {"4": 3, "256": 1}}'], "json") == {4: 0.75, 256: 0.25}


@pytest.mark.parametrize("text, says", [
    ("nothing here\n", "no busy sample"), ('{"histogram": [1, 2]}', "a JSON load profile is"),
    ('{"histogram": {"4": -1}}', "weight of 4"), ('{"histogram": {"x": 1}}', "running requests 'x'"),
    ('{"histogram": {"' + "9" * 5000 + '": 1}}', "rig reads none longer"),
])
def test_a_profile_without_a_busy_sample_or_with_bad_numbers_is_refused(text, says):
    with pytest.raises(RigError, match=says):
        parse(text.splitlines(), "profile")


LINES = st.one_of(
    st.builds(lambda n, g: f"[t TP0] Decode batch. #running-req: {n}, #token: 9, gen throughput (token/s): {g}",
              st.integers(0, 10**9), st.one_of(st.integers(0, 10**12), st.floats(0, 1e12), st.just("nan"))),
    st.builds(lambda n: f"sglang:num_running_reqs{{model_name=\"m\"}} {n}", st.one_of(
        st.integers(-5, 10**9), st.floats(allow_nan=True), st.text(max_size=8))),
    st.text(max_size=80))


@settings(max_examples=150, deadline=None)
@given(st.lists(LINES, max_size=12))
def test_any_log_is_a_profile_of_busy_shares_or_one_clear_error(lines):
    try:
        shares = parse(lines, "fuzzed")
    except RigError:
        return
    assert shares and abs(sum(shares.values()) - 1) < 1e-9 and all(0 < r <= 1 << 20 for r in shares)


def test_a_running_count_stands_at_the_measured_level_nearest_on_a_log_scale():
    assert [nearest(r, [1, 4, 16, 64]) for r in (1, 2, 3, 7, 9, 40, 500)] == [1, 1, 4, 4, 16, 64, 64]


def _measured(table):
    return {name: {level: {"value": v} for level, v in levels.items()} for name, levels in table.items()}


def test_the_one_server_for_a_load_weighs_each_level_by_its_share_of_time():
    measured = _measured({"baseline": {"C=1": 100, "C=64": 1000}, "eagle3-3": {"C=1": 250, "C=64": 700}})
    levels = [Level(1), Level(64)]
    busy = for_load(measured, list(measured), levels, {1: 0.2, 60: 0.8})  # mostly loaded: 820 against 610
    assert busy["chosen"] == "baseline" and busy["expected"]["baseline"] == pytest.approx(820)
    assert busy["ratios"] == {"C=1": 0.4, "C=64": 1.0} and busy["of_per_level_best"] == pytest.approx(820 / 850)
    quiet = for_load(measured, list(measured), levels, {1: 0.9, 64: 0.1})  # mostly one stream: 295 against 190
    assert quiet["chosen"] == "eagle3-3" and quiet["weights"] == {"C=1": 0.9, "C=64": 0.1}
    partial = for_load(_measured({"baseline": {"C=1": 100}}), ["baseline"], levels, {64: 1.0})
    assert partial["chosen"] is None and "every level" in partial["why"]
