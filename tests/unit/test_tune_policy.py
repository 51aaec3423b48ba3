"""rig tune's choices and SGLang's adaptive config, without servers: routing, slot keys, the choice rule, and the
SGLang stand-in's own reading of the config (its routing and EMA, which the end-to-end tune tests rely on)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import sglang_api_server as standin

from rig.core import RigError
from rig.serving import adaptive
from rig.serving.measure.plan import Level
from rig.serving.measure.verdict import choose
from rig.serving.tune.choose import policy, slot_config
from rig.serving.tune.measure import graph_sizes
from rig.serving.tune.propose import fallback
from rig.serving.tune.variants import Variant

GRAPHS = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 40, 44, 48]  # 0.5.17's, max 48


def test_routing_pads_to_the_graph_size_then_takes_the_largest_key_below():
    keys = [1, 8, 32]
    assert adaptive.route(keys, 1, GRAPHS) == 1
    assert adaptive.route(keys, 9, GRAPHS) == 8  # 9 pads to 10
    assert adaptive.route(keys, 31, GRAPHS) == 32  # 31 pads to 32
    assert adaptive.route([4, 32], 2, GRAPHS) == 4  # below every key: the smallest
    assert adaptive.route(keys, 100, GRAPHS) == 32 and adaptive.route(keys, 31, None) == 8


@pytest.mark.parametrize("config, says", [
    ([], "is a JSON object"), ({}, "no batch-size key"), ({"ema_alpha": 0.1}, "no batch-size key"),
    ({"1": {"candidate_steps": []}}, "non-empty list"), ({"1": {"candidate_steps": [-1]}}, "non-empty list"),
    ({"1": {"candidate_steps": [True]}}, "non-empty list"), ({"1": {"candidate_steps": [1]}, "ema_alpha": "x"},
                                                             "ema_alpha must be a number"),
    ({"0": {"candidate_steps": [1]}}, "neither a batch size"), ({"٣": {"candidate_steps": [1]}}, "neither"),
    ({"1": {"candidate_steps": [1]}, "update_interval": 2.5}, "update_interval must be a whole number"),
])
def test_configs_sglang_would_refuse_are_refused(config, says):
    with pytest.raises(RigError, match=says):
        adaptive.slots(config, "adaptive.json")


@pytest.mark.parametrize("slot, says", [
    ({"update_interval": 0}, "batch size 8: update_interval must be a whole number from 1"),
    ({"ema_alpha": "fast"}, "batch size 8: ema_alpha must be a number"),
    ({"warmup_batches": 2.5}, "batch size 8: warmup_batches must be a whole number"),
    ({"down_hysteresis": float("nan")}, "batch size 8: down_hysteresis must be a number"),
    ({"ema_aplha": 0.5}, "batch size 8: 'ema_aplha' is neither candidate_steps nor one of SGLang's knobs"),
])
def test_a_slots_own_knobs_are_checked_as_the_top_levels_are(slot, says):
    """SGLang gives each slot {**config, **slot}: a slot's knob overrides the top level's, so it is held to the
    same rule (a top-level update_interval 0 was refused, a slot's passed and reached the server)."""
    config = {"update_interval": 5, "ema_alpha": 0.2, "1": {"candidate_steps": [1, 3]},
              "8": {"candidate_steps": [0, 1], **slot}}
    with pytest.raises(RigError, match=says):
        adaptive.slots(config, "adaptive.json")
    good = {**config, "8": {"candidate_steps": [0, 1], "update_interval": 2, "ema_alpha": 1.0, "up_hysteresis": 0.0}}
    assert adaptive.slots(good, "adaptive.json") == {1: [1, 3], 8: [0, 1]}


def test_render_is_read_back_as_written():
    text = adaptive.render({1: 3, 48: 0})
    assert adaptive.parse(text, "x") == {1: [3], 48: [0]}
    assert json.loads(text) == {"1": {"candidate_steps": [3]}, "48": {"candidate_steps": [0]}}


def test_refusals_name_sglangs_reason():
    server = {"speculative_eagle_topk": 4, "extra_args": []}
    assert "only topk=1" in adaptive.unsupported_reason(server)
    assert "attention DP" in adaptive.unsupported_reason({"speculative_eagle_topk": 1,
                                                          "extra_args": ["--enable-dp-attention"]})
    assert adaptive.unsupported_reason({"speculative_eagle_topk": 1, "extra_args": ["--enable-dp-attention-x"]}) is None


M = "output_throughput"  # the metric these tables are judged by


def _measured(table: dict[str, dict[str, list[float]]]) -> dict:
    """Run-record levels from per-round values: each the median of its rounds, no mean in flight measured."""
    return {name: {level: {M: sorted(v)[len(v) // 2], f"round_{M}": v, "concurrency": None}
                   for level, v in levels.items()} for name, levels in table.items()}


VARIANTS = [Variant("baseline", 0, {}, "baseline"), Variant("eagle3-1", 1, {}), Variant("eagle3-3", 3, {})]


def test_ties_go_to_the_simpler_variant_and_clear_wins_to_the_best():
    measured = _measured({"baseline": {"C=1": [100, 101, 99], "C=64": [1000, 990, 1010]},
                          "eagle3-1": {"C=1": [150, 140, 160], "C=64": [1005, 1020, 980]},
                          "eagle3-3": {"C=1": [200, 210, 190], "C=64": [700, 710, 690]}})
    rows = choose(measured, VARIANTS, [Level(1), Level(64)], M, 48)
    assert [(r["level"], r["best"], r["chosen"], r["batch"]) for r in rows] == [
        ("C=1", "eagle3-3", "eagle3-3", 1), ("C=64", "eagle3-1", "baseline", 48)]
    kind = policy(rows, GRAPHS)
    assert kind == {"kind": "adaptive", "slots": {"1": 3, "48": 0}, "steps": 3, "notes": []}


def test_one_choice_everywhere_is_served_as_it_is():
    rows = [{"level": "C=1", "batch": 1, "steps": 0}, {"level": "C=8", "batch": 8, "steps": 0}]
    assert policy(rows, GRAPHS)["kind"] == "baseline"
    assert policy([{**r, "steps": 2} for r in rows], GRAPHS) == {"kind": "fixed", "steps": 2, "notes": []}


def test_levels_that_pad_to_one_slot_are_merged_with_a_note():
    rows = [{"level": "C=1", "batch": 1, "steps": 3}, {"level": "C=9", "batch": 9, "steps": 1},
            {"level": "C=10", "batch": 10, "steps": 0}, {"level": "C=40", "batch": 40, "steps": 0}]
    config, notes = slot_config(rows, GRAPHS)
    assert config == {1: 3, 10: 1, 40: 0}  # 9 and 10 both pad to 10: the lower level keeps the slot
    assert notes and "C=10" in notes[0]


def test_graph_sizes_come_from_either_spelling_and_garbage_is_ignored():
    assert graph_sizes({"cuda_graph_bs": [4, 1, 2]}) == [1, 2, 4]
    assert graph_sizes({"cuda_graph_config": {"decode": {"bs": [1, 8]}}}) == [1, 8]
    assert graph_sizes({"cuda_graph_bs": ["1"], "cuda_graph_config": {"decode": {"bs": [True]}}}) is None


def test_the_fallback_names_a_threshold_only_where_one_separates_the_choices():
    rows = [{"level": "C=1", "batch": 1, "steps": 3, "chosen": "eagle3-3", "best_value": 200},
            {"level": "C=64", "batch": 48, "steps": 0, "chosen": "baseline", "best_value": 1000}]
    assert "at or below 1 requests in flight" in fallback(rows, {}, M)
    mixed = [{**rows[0]}, {"level": "C=4", "batch": 4, "steps": 0, "chosen": "baseline", "best_value": 400},
             {"level": "C=64", "batch": 48, "steps": 3, "chosen": "eagle3-3", "best_value": 1000}]
    measured = _measured({"baseline": {"C=1": [100], "C=4": [400], "C=64": [800]},
                          "eagle3-3": {"C=1": [200], "C=4": [300], "C=64": [1000]}})
    said = fallback(mixed, measured, M)
    assert "no single load threshold" in said and "eagle3-3 comes closest" in said


def test_the_standin_routes_and_moves_between_candidates_as_sglang_does(tmp_path):
    config = tmp_path / "a.json"
    config.write_text(json.dumps({"warmup_batches": 0, "update_interval": 1, "1": {"candidate_steps": [0, 1, 3]},
                                  "8": {"candidate_steps": [0]}}))
    sim = standin.Adaptive(str(config), [1, 2, 4, 8, 16], initial=3)
    assert sim.slot(1).steps == 3 and sim.slot(5).steps == 0 and sim.slot(3) is sim.slot(1)
    slot = sim.slot(1)
    for _ in range(20):  # nothing accepted: the EMA falls, the slot steps down to 0
        slot.observe([0, 0])
    assert slot.steps == 0
    slot.observe([0])  # after a step-0 interval it probes the next candidate up
    assert slot.steps == 1
    for _ in range(20):  # every draft accepted: it climbs back to 3
        slot.observe([3])
    assert slot.steps == 3


@pytest.mark.parametrize("config, says", [
    ({"1": {"candidate_steps": [1]}, "01": {"candidate_steps": [0]}}, "without leading zeros"),
    ({"1": {"candidate_steps": [1]}, "ema_alpha": float("nan")}, "ema_alpha must be a number"),
    ({"1": {"candidate_steps": [1]}, "ema_alpha": float("inf")}, "ema_alpha must be a number"),
    ({"1": {"candidate_steps": [1]}, "update_interval": 0}, "update_interval must be a whole number"),
    ({"1": {"candidate_steps": [1]}, "strategy": "throughput_aware"}, "only \"ema\""),
])
def test_knobs_and_keys_sglang_would_misread_are_refused(config, says):
    with pytest.raises(RigError, match=says):
        adaptive.slots(config, "adaptive.json")


def test_the_files_writer_puts_the_record_first_replaces_links_and_leaves_out_plots_it_cannot_draw(tmp_path):
    """rig.core.outdir, the one writer of probe, bench, tune and prove: a link where a file goes is replaced,
    never written through; a plot that cannot be drawn leaves the record and the report written."""
    from matplotlib.figure import Figure

    from rig.core import outdir

    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "tune.png").symlink_to(victim)
    (tmp_path / "tune.json").symlink_to(victim)
    files = outdir.write(tmp_path, {"tune.json": outdir.record({"a": 1}), "report.md": "# r\n"},
                         lambda: {"tune.png": Figure()})
    assert [Path(f).name for f in files] == ["tune.json", "report.md", "tune.png"]
    assert victim.read_text() == "keep me" and not (tmp_path / "tune.png").is_symlink()
    assert json.loads((tmp_path / "tune.json").read_text()) == {"a": 1}
    assert (tmp_path / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def no_matplotlib():
        raise ImportError("No module named 'matplotlib'", name="matplotlib")

    assert [Path(f).name for f in outdir.write(tmp_path / "host", {"prove.json": "{}\n"}, no_matplotlib)] == \
        ["prove.json"]
    assert (tmp_path / "tune.png").read_bytes().startswith(b"\x89PNG")


def test_prompts_hold_any_text_but_a_lone_surrogate(tmp_path):
    from rig.serving.workload import load

    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt": "one\u2028two\u0085three"}, ensure_ascii=False) + "\n")
    assert load(good, 8)[0].text == "one\u2028two\u0085three"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a\\ud800b"}\n')
    with pytest.raises(RigError, match="line 1: the prompt holds"):
        load(bad, 8)


def test_server_answers_nested_absurdly_deep_are_an_error_not_a_crash():
    from rig.serving.sglang_api import expect_json

    with pytest.raises(RigError, match="not JSON"):
        expect_json(200, b"[" * 200_000, "GET /server_info")


def test_a_context_too_small_for_any_plan_says_so():
    from rig.serving.measure.plan import check_fits, plan_from

    with pytest.raises(RigError, match="too small for rig's prompts"):
        check_fits(plan_from(), "baseline", {"context_length": 1})


def test_the_plan_carries_the_levels_and_its_record_keeps_the_bench_keys():
    """rig tune's levels are the plan's (each concurrency closed-loop, then each rate at the largest concurrency);
    tune.json and results.json record the plan as before the rates were in it: the bench section's keys."""
    from rig.serving.measure.plan import plan_from
    from rig.stack.spec import SCHEMA

    plan = plan_from({"concurrency": [1, 64]}, request_rates=[2, 0.5], rounds=2)
    assert [(lv.name, lv.concurrency) for lv in plan.levels] == [("C=1", 1), ("C=64", 64), ("R=2/s", 64),
                                                                 ("R=0.5/s", 64)]
    assert set(plan.record()) == set(SCHEMA["bench"].fields) and plan.record()["rounds"] == 2
    assert [lv.name for lv in plan_from({"concurrency": [8]}).levels] == ["C=8"]


def test_an_open_loop_round_sends_ten_seconds_of_arrivals_at_most_two_waves_of_its_cap():
    from rig.serving.measure.plan import Level, plan_from

    plan = plan_from({"concurrency": [1, 256], "min_requests": 16}, request_rates=[20, 80, 0.5])
    assert [plan.requests_at(lv) for lv in plan.levels] == [16, 512, 200, 512, 16]
    assert plan.requests_at(Level(8, 20.0)) == 16  # two waves of a cap of 8: a level no larger than min_requests


def test_booleans_are_refused_where_a_number_is_wanted():
    from rig.stack.spec import validate

    with pytest.raises(RigError, match="got a boolean"):
        validate({"name": "x", "cuda": {"version": "13.0.2"}, "tune": {"request_rates": [True]}})
    with pytest.raises(RigError, match="got a boolean"):
        validate({"name": "x", "cuda": {"version": "13.0.2"}, "bench": {"min_seconds": True}})


def test_a_round_that_measured_zero_is_a_measurement_and_a_missing_one_is_not():
    from rig.serving.measure.stats import median
    from rig.serving.measure.verdict import ratios, within_range

    assert median([0, 0, 50]) == 0 and median([None, 40]) == 40 and median([None]) is None
    assert ratios([0, 0, 50], [40, 40, 40]) == [0, 0, 1.25] and within_range(ratios([0, 0, 50], [40, 40, 40])) \
        == "within noise"
    assert ratios([10], [0]) == [] and ratios([None], [10]) == []


def test_a_speculative_server_capped_below_its_graph_gets_an_uncapped_twin_once():
    from rig.serving.tune.variants import uncapped

    stack = {"server": {"cuda_graph_max_bs": 256}, "bench": {"concurrency": [1, 64, 256]}}  # as rig tune sizes it
    eagle = Variant("eagle3-3", 3, stack, "eagle", "triton")
    twin = uncapped(eagle, {"max_running_requests": 48, "cuda_graph_bs": [1, 64, 256]})
    assert twin and twin.name == "eagle3-3-uncapped" and twin.family == "triton/uncapped"
    assert twin.stack["server"]["max_running_requests"] == 256
    assert uncapped(twin, {"max_running_requests": 256}) is None  # its twin is not lifted again
    assert uncapped(eagle, {"max_running_requests": 256, "cuda_graph_bs": [256]}) is None
    assert uncapped(Variant("baseline", 0, stack, "baseline"), {"max_running_requests": 48}) is None
    # no graph sizes in /server_info: the graph rig asked for (the largest level)
    lifted = uncapped(eagle, {"max_running_requests": 48})
    assert lifted and lifted.stack["server"]["max_running_requests"] == 256


def test_step_0_priced_as_measured_turns_a_switching_family_into_one_server_that_must_hold_up():
    """The baseline wins at C=64 and EAGLE-3 at C=1, but SGLang's step 0 runs far below the baseline: priced by
    its own server, step 0 loses C=64 to EAGLE-3, so the family serves fixed EAGLE-3, which confirmation holds
    to the baseline at C=64 (and loses); the fallback reads the choices with the baseline for step 0."""
    from rig.serving.measure.verdict import confirm
    from rig.serving.tune.choose import family_choice, policy
    from rig.serving.tune.propose import recommend

    stack = {"server": {"attention_backends": [], "max_running_requests": 0}}
    found = [Variant("baseline", 0, stack, "baseline", ""), Variant("eagle3-3", 3, stack, "eagle", ""),
             Variant("step0", 0, stack, "step0", "")]
    measured = _measured({"baseline": {"C=1": [100, 101, 99], "C=64": [1000, 990, 1010]},
                        "eagle3-3": {"C=1": [250, 251, 249], "C=64": [700, 710, 690]},
                        "step0": {"C=1": [95, 96, 94], "C=64": [380, 385, 375]}})
    records = {name: {"max_running_requests": 48 if name != "baseline" else None} for name in measured}
    chosen = family_choice(measured, found, [Level(1), Level(64)], records, M)
    rows, plain = chosen.rows, chosen.plain
    assert [r["chosen"] for r in plain] == ["eagle3-3", "baseline"] and chosen.step0 == "step0"
    assert [r["chosen"] for r in rows] == ["eagle3-3", "eagle3-3"] and rows[1]["best"] == "baseline"
    assert chosen.max_running_requests == 48 and chosen.baseline == "baseline"
    kind = policy(rows, GRAPHS)
    assert kind == {"kind": "fixed", "steps": 3, "notes": []}
    confirmation = confirm(measured, rows, "eagle3-3", "baseline", M)
    assert not confirmation["confirmed"] and confirmation["levels"][1]["verdict"] == "lost"
    said = recommend(kind, rows, confirmation, None, measured, plain, M)
    assert said.startswith("no single server holds the per-level best") and "at C=64 it ran 0.70 of baseline" in said
    assert "run eagle3-3 where load stays at or below 1 requests in flight" in said


def test_confirmation_with_several_backends_holds_the_policy_to_its_familys_baseline():
    from rig.serving.measure.verdict import confirm

    measured = _measured({"baseline@fa3": {"C=64": [1000, 1000]}, "policy": {"C=64": [380, 380]}})
    rows = [{"level": "C=64", "best": "baseline@fa3", "best_value": 1000, "steps": 0}]
    table = confirm(measured, rows, "policy", "baseline@fa3", M)["levels"][0]
    assert table["ratio_baseline"] == 0.38 and table["vs_baseline"] == "lost"


def test_a_family_missing_a_level_is_never_preferred_for_skipping_it():
    from rig.serving.measure.verdict import closeness

    best = {"C=1": 200.0, "C=64": 1000.0}
    assert closeness({"C=1": 200.0}, best) == 0.0
    assert closeness({"C=1": 100.0, "C=64": 1000.0}, best) == pytest.approx(0.5 ** 0.5)


def test_a_multi_line_stop_reason_reaches_the_report_as_one_cell_with_line_breaks():
    """A server that exits at start says why with its log's last lines (rig.serving.smoke.log_tail): in report.md
    each line is kept, joined by <br>, never a literal backslash-n (the H200 run's report showed `\\\\n`)."""
    from rig.serving.tune.report import report_markdown

    reason = ("the server exited (status 1) before it answered; its log says why\nlast 2 lines of /x/step0.log:\n"
              "ValueError: --speculative-num-steps=1 is not in the adaptive config candidate_steps [0] | see")
    result = {"stack": "s.yml", "plan": {"rounds": 1}, "metric": "output_throughput", "levels": ["C=64"], "choices": [],
              "variants": {"step0": {"stopped": reason, "levels": {}}}, "policy": {"kind": "none", "notes": []},
              "confirmation": None, "recommendation": "nothing was measured: no recommendation"}
    text = report_markdown(result)
    line = next(x for x in text.splitlines() if x.startswith("- step0: "))
    assert "\\n" not in text and "log says why<br>last 2 lines of /x/step0.log:<br>ValueError" in line
    assert "candidate_steps \\[0\\] \\| see" in line  # still one cell: no bare | or [


def test_below_the_first_step_0_level_the_baseline_still_stands_for_no_drafting():
    """Step-0 servers run batches of two and more at step 0 (a lone request drafts one step), so they are measured
    from C=2: at C=1 "no drafting" is the family's baseline, which may win there."""
    from rig.serving.tune.choose import family_choice

    stack = {"server": {"attention_backends": [], "max_running_requests": 0}}
    found = [Variant("baseline", 0, stack, "baseline", ""), Variant("eagle3-3", 3, stack, "eagle", ""),
             Variant("step0", 0, stack, "step0", "")]
    measured = _measured({"baseline": {"C=1": [100, 100], "C=16": [900, 900], "C=256": [1000, 1000]},
                        "eagle3-3": {"C=1": [60, 60], "C=16": [1500, 1500], "C=256": [700, 700]},
                        "step0": {"C=16": [850, 850], "C=256": [900, 900]}})
    records = {name: {"max_running_requests": None} for name in measured}
    chosen = family_choice(measured, found, [Level(1), Level(16), Level(256)], records, M)
    assert [(r["level"], r["chosen"]) for r in chosen.rows] == [("C=1", "baseline"), ("C=16", "eagle3-3"),
                                                                  ("C=256", "step0")], chosen.rows


def test_a_launch_step_outside_the_candidates_is_refused_in_sglangs_words():
    assert adaptive.launch_problem({1: [1], 2: [0]}, 1) is None
    said = adaptive.launch_problem({1: [0]}, 1)
    assert said and said.startswith("--speculative-num-steps=1 is not in the adaptive config candidate_steps [0]")


def test_the_policy_is_proposed_with_the_environment_its_server_was_confirmed_with(tmp_path):
    """An adaptive policy whose step-0 slots ran on a server with switches in its environment (free-off's draft
    sync): the proposed stack carries them in environment.vars beside the user's own, every comment kept, and the
    recommendation says them."""
    import yaml

    from rig.serving.tune.propose import proposed_stack, recommend

    stack = tmp_path / "stack.yml"
    stack.write_text("name: s  # mine\nenvironment:\n  vars: {HF_HOME: /data/hf}  # the cache\nserver:\n"
                     "  model: m\n")
    kind = {"kind": "adaptive", "steps": 3, "slots": {"1": 3, "256": 0}}
    env = {"RIG_FREE_OFF": "1", "RIG_FREE_OFF_DRAFT": "ingest"}
    text, diff = proposed_stack(str(stack), kind, "/srv/adaptive.json", None, 0, {"HF_HOME": "/data/hf", **env})
    proposed = yaml.safe_load(text)
    assert proposed["environment"]["vars"] == {"HF_HOME": "/data/hf", **env}
    assert proposed["server"]["speculative_adaptive_config"] == "/srv/adaptive.json"
    assert "# mine" in text and "# the cache" in text and "+  vars:" in diff
    assert yaml.safe_load(proposed_stack(str(stack), kind, "/srv/adaptive.json")[0])["environment"]["vars"] == {
        "HF_HOME": "/data/hf"}  # nothing to add: the user's line stays
    said = recommend(kind, [], {"confirmed": True, "levels": []}, "/srv/adaptive.json", {}, [], M, env)
    assert "RIG_FREE_OFF=1, RIG_FREE_OFF_DRAFT=ingest in environment.vars" in said


@pytest.mark.parametrize("rounds, confirmed, verdict, rule", [
    # issue 71's C=256: one round at 0.98 made 0.89 "within noise", and the policy "confirmed"
    ([870, 890, 980], False, "median below", "median 0.89 below 0.95 of the best"),
    ([940, 930, 920], False, "lost", "every round below 0.95 of the best"),
    ([950, 900, 990], True, "within noise", "median 0.95 at least 0.95"),
    ([1100, 1080, 1200], True, "won", "median 1.10 at least 0.95"),
])
def test_one_lucky_round_cannot_confirm_a_level_its_median_lost(rounds, confirmed, verdict, rule):
    from rig.serving.measure.verdict import confirm
    from rig.serving.tune.propose import recommend

    measured = _measured({"baseline": {"C=256": [1000, 1000, 1000]}, "policy": {"C=256": rounds}})
    rows = [{"level": "C=256", "best": "baseline", "best_value": 1000, "steps": 0, "chosen": "baseline", "batch": 256}]
    result = confirm(measured, rows, "policy", "baseline", M)
    level = result["levels"][0]
    assert (result["confirmed"], level["confirmed"], level["verdict"]) == (confirmed, confirmed, verdict)
    assert level["rule"].startswith(rule)
    said = recommend({"kind": "adaptive", "slots": {"1": 3}}, rows, result, "adaptive.json", measured, rows, M)
    assert said.startswith("serve with the adaptive policy") == confirmed
    if not confirmed:
        assert f"at C=256 it ran {level['ratio_best']:.2f} of baseline ({level['rule']})" in said


def test_a_confirmation_written_before_the_median_rule_still_reads():
    """tune.json files from before issue 71 have no `confirmed` per level: their verdict decides, as it did."""
    from rig.serving.tune.propose import recommend

    old = {"confirmed": False, "levels": [{"level": "C=64", "verdict": "lost", "ratio_best": 0.7, "best": "baseline",
                                           "steps": 0, "vs_baseline": "lost", "ratio_baseline": 0.7}]}
    rows = [{"level": "C=64", "chosen": "step0", "steps": 0, "batch": 64, "kind": "step0"}]
    said = recommend({"kind": "adaptive", "slots": {"1": 3, "64": 0}}, rows, old, "a.json", {}, rows, M)
    assert "at C=64 it ran 0.70 of baseline (lost)" in said


def test_an_open_loop_level_is_judged_by_each_requests_speed_not_the_arrival_rates_throughput():
    """issue 71's R=20/s on the H100 (run 16): every server kept up, so each made the arrival rate's 2.3k tok/s, and
    throughput chose the baseline; EAGLE-3 gave the median request 207 tok/s against 133 (965 ms -> 618 ms)."""
    from rig.serving.measure.record import judged, value_of
    from rig.serving.measure.verdict import confirm

    def level(throughputs, speeds, rate, in_flight):
        return {M: sorted(throughputs)[1], f"round_{M}": throughputs, "request_speed": sorted(speeds)[1],
                "round_request_speed": speeds, "rate": rate, "concurrency": in_flight}

    measured = {"baseline": {"C=128": level([13084, 12316, 12623], [105, 104, 106], None, 122),
                             "R=20/s": level([2278, 2277, 2278], [133, 132, 133], 20.0, 17),
                             "R=80/s": level([8297, 8359, 8368], [85, 86, 84], 80.0, 97)},
                "eagle3-3": {"C=128": level([7799, 8694, 8736], [74, 73, 75], None, 114),
                             "R=20/s": level([2343, 2344, 2346], [207, 206, 208], 20.0, 11),
                             "R=80/s": level([6872, 6917, 7226], [66, 65, 67], 80.0, 101)}}
    assert judged(measured["baseline"]["R=20/s"], M) == "request_speed"
    assert judged(measured["baseline"]["C=128"], M) == M and judged(measured["baseline"]["R=20/s"], "goodput") \
        == "goodput"
    assert value_of(measured["eagle3-3"]["R=20/s"], M) == 207 and value_of(None, M) is None
    levels = [Level(128), Level(128, 20.0), Level(128, 80.0)]
    rows = choose(measured, VARIANTS[::2], levels, M, 256)
    assert [(r["level"], r["chosen"], r["batch"]) for r in rows] == [
        ("C=128", "baseline", 128), ("R=20/s", "eagle3-3", 11), ("R=80/s", "baseline", 97)]
    assert policy(rows, list(range(1, 257)))["slots"] == {"1": 3, "97": 0}
    # the policy that served each level as chosen is confirmed by the same judged values
    mine = {"policy": {name: measured[row["chosen"]][name] for row in rows for name in [row["level"]]}}
    table = confirm({**measured, **mine}, rows, "policy", "baseline", M)
    assert table["confirmed"] and [round(t["ratio_baseline"], 2) for t in table["levels"]] == [1.0, 1.56, 1.0]


def test_each_round_and_level_carries_the_median_requests_speed():
    from rig.serving.measure.plan import plan_from
    from rig.serving.measure.stats import aggregate

    def request(start, e2e, tokens):
        return {"ok": True, "start": start, "end": start + e2e, "e2e": e2e, "ttft": 0.01, "tpot": 0.001,
                "tokens": tokens, "speed": tokens / e2e, "accept_length": None}

    failed = {"ok": False, "error": "timed out", "start": 0, "end": 9.0}
    rounds = [[request(0, 1.0, 100), request(0, 2.0, 100), request(0, 4.0, 100)], [request(0, 1.0, 50)],
              [request(0, 1.0, 100), failed, failed]]  # a failed request got nothing: it counts at 0
    level = aggregate(rounds, 8, plan_from(), [None, None, None])
    assert level["round_request_speed"] == [50.0, 50.0, 0.0] and level["request_speed"] == 50.0
    assert level["round_output_throughput"] == [75.0, 50.0, 100.0]


def test_a_record_made_before_request_speed_keeps_the_throughput_it_was_judged_by():
    """Run 16's tune.json (H100, before the open-loop rule): its request-rate cells and choices still read as
    measured, by output throughput."""
    from harness.paths import REPO

    from rig.serving.tune.report import read_tune, report_markdown

    record = read_tune(REPO / "docs/validation/real-cost-h200/runs/free-off-16-h100-poisson-t1/tune-free-off-policy"
                       "/tune.json")
    report = report_markdown(record)
    assert "| R=20/s | 2277.8 (2277.4-2277.9) | 2344.4 (2343.3-2345.6) acc 2.54 |" in report
    assert "at each request rate" not in report
