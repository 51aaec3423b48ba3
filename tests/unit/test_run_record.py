"""The run record: one shape in sglang.bench_serving's names, checked when written and read through the same
fields; rig's older files (committed under docs/validation) still read, converted in one place, and said."""
import json

import pytest
from harness.paths import REPO

from rig.core import RigError
from rig.core.schema import validate
from rig.serving import bench
from rig.serving.measure import record
from rig.serving.measure.plan import plan_from
from rig.serving.measure.stats import aggregate
from rig.serving.tune import report

VALIDATION = REPO / "docs" / "validation"
OLDEST_BENCH = VALIDATION / "serving-h200" / "results" / "tp1-graphs-on-bench" / "results.json"  # throughput, ttft_s
TUNE_1 = VALIDATION / "tune-h200" / "results" / "tune-agree-3" / "tune.json"  # schema_version 1: both spellings
TUNE_2 = VALIDATION / "real-cost-h200" / "runs" / "free-off-8-h100-policy" / "tune-free-off-policy" / "tune.json"


def _request(i: int, ok: bool = True) -> dict:
    """One streamed request as the load client reports it: 10 tokens in 0.5 s, started 0.1 s after the last."""
    start = 0.1 * i
    return {"ok": ok, "error": None if ok else "refused (HTTP 500)", "start": start, "end": start + 0.5,
            "tokens": 10, "prompt_tokens": 4, "tpot": 0.05, "e2e": 0.5, "ttft": 0.05, "itl": [0.05] * 9,
            "speed": 20.0, "accept_length": None}


def test_a_level_is_written_in_sglangs_names_one_field_per_number_and_reads_back_through_the_same_fields():
    plan = plan_from(None, concurrency=[4], slo_ttft_ms=100)  # an SLO: goodput is the metric, judged per round
    level = aggregate([[_request(i) for i in range(8)], [_request(i) for i in range(6)] + [_request(6, False)]], 4,
                      plan, [None, None])
    assert validate(level, record.LEVEL, "a level") == {**{k: None for k in record.LEVEL.fields}, **level}
    assert (level["max_concurrency"], level["requests"], level["completed"], level["failed"]) == (4, 15, 14, 1)
    # each round's requests over its span (0.7 s of starts + 0.5 s; 0.5 + 0.5), and the median of the two
    assert level["total_output_tokens"] == 140 and level["round_output_throughput"] == pytest.approx([80 / 1.2, 60])
    assert level["output_throughput"] == pytest.approx((80 / 1.2 + 60) / 2)
    assert record.rounds_of(level, "goodput") == pytest.approx([8 / 1.2, 6]) and level["goodput"] == pytest.approx(
        (8 / 1.2 + 6) / 2)  # every request within the 100 ms TTFT
    assert not {"value", "round_values", "in_flight", "capped_at", "ok", "duration_s", "output_tokens"} & set(level)
    with pytest.raises(RigError, match="unknown key 'value'"):  # the writer cannot add a second name for a number
        validate({**level, "value": 1.0}, record.LEVEL, "a level")


def test_a_run_is_written_held_to_its_schema_and_read_back_without_a_word(tmp_path, capsys):
    level = aggregate([[_request(i) for i in range(4)]], 2, plan_from(None, concurrency=[2]), [None])
    result = {"plan": {}, "runs": [{"url": "http://x", "label": "EAGLE-3", "max_running_requests": 48,
                                    "serial": None, "levels": [{**level, "level": "C=2", "rate": None}]}]}
    with record.recorded(tmp_path, result, "results.json", bench.RESULTS, lambda r: "report\n"):
        pass
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["format"] == record.FORMAT == 1
    assert bench._earlier(str(tmp_path / "results.json"))["levels"][0]["max_concurrency"] == 2
    assert capsys.readouterr().err == ""  # its own format: nothing to say


def test_a_record_off_its_schema_is_still_written_then_the_error_said(tmp_path):
    result = {"plan": {}, "runs": [{"url": "http://x", "levels": [{"max_concurrency": 1, "tok_s": [1.0]}]}]}
    with pytest.raises(RigError, match="unknown key 'tok_s'"):
        with record.recorded(tmp_path, result, "results.json", bench.RESULTS, lambda r: "report\n"):
            pass
    assert json.loads((tmp_path / "results.json").read_text())["runs"][0]["levels"][0]["tok_s"] == [1.0]


def test_a_checkpoint_says_the_run_was_still_going_and_the_end_replaces_it(tmp_path, capsys):
    result = {"plan": {}, "runs": []}
    with record.recorded(tmp_path, result, "results.json", bench.RESULTS, lambda r: "report\n") as written:
        result["runs"].append({"url": "http://x", "levels": []})
        written.checkpoint()
        mid = json.loads((tmp_path / "results.json").read_text())
        assert mid["stopped"] == record.STILL_RUNNING and len(mid["runs"]) == 1
        assert not (tmp_path / "report.md").exists() and list(written) == []  # the report and the paths: the end's
        result["runs"][0]["levels"].append({"max_concurrency": 1, "tok_s": [1.0]})  # off the schema, mid-run
        written.checkpoint()  # written all the same, and said; the run goes on
        assert "a checkpoint of results.json: " in capsys.readouterr().err
        result["runs"][0]["levels"].clear()
    end = json.loads((tmp_path / "results.json").read_text())
    assert end["stopped"] is None and (tmp_path / "report.md").read_text() == "report\n"
    assert sorted(written) == [str(tmp_path / "report.md"), str(tmp_path / "results.json")]


def test_a_checkpoint_that_cannot_be_written_is_said_and_the_run_goes_on(tmp_path, capsys):
    (tmp_path / "results.json").mkdir()  # where the record goes: a directory
    with pytest.raises(IsADirectoryError):  # the end's write fails as it always has (rig refuses such an --out first)
        with record.recorded(tmp_path, {"plan": {}, "runs": []}, "results.json", bench.RESULTS,
                             lambda r: "report\n") as written:
            written.checkpoint()
            assert "could not write a checkpoint of results.json into" in capsys.readouterr().err


def test_the_oldest_bench_results_read_as_format_1_and_say_so(capsys):
    raw = json.loads(OLDEST_BENCH.read_text())["runs"][0]
    run = bench._earlier(str(OLDEST_BENCH))
    assert f"read results.json in rig's pre-1 format ({OLDEST_BENCH})" in capsys.readouterr().err
    old, new = raw["levels"][0], run["levels"][0]
    assert (new["max_concurrency"], new["completed"], new["duration"], new["total_output_tokens"]) == (
        old["concurrency"], old["ok"], old["duration_s"], old["output_tokens"])
    assert (new["output_throughput"], new["round_output_throughput"]) == (old["throughput"], old["round_throughput"])
    assert new["median_ttft_ms"] == old["ttft_s"]["p50"] * 1000 and new["p99_e2e_latency_ms"] == old["e2e_s"]["p99"] * 1000
    assert run["serial"] == {"requests": raw["serial"]["runs"], "completed": raw["serial"]["ok"], "failed": 0,
                             "errors": [], "output_throughput": raw["serial"]["median"],
                             "round_output_throughput": raw["serial"]["tok_s"]}
    # the report of an earlier run renders from it, numbers and all
    shown = bench.report_markdown({"plan": {"rounds": 3}, "runs": [run], "crossover": None})
    assert f"median {raw['serial']['median']:.1f} tok/s" in shown and f"{old['throughput']:.1f}" in shown


@pytest.mark.parametrize("path", [TUNE_1, TUNE_2], ids=["schema_version-1", "schema_version-2"])
def test_older_tune_json_reads_as_format_1_its_report_renders_and_says_so(path, capsys):
    raw = json.loads(path.read_text())
    tune = report.read_tune(path)
    assert f"read tune.json in rig's pre-1 format ({path})" in capsys.readouterr().err
    assert tune["max_running_requests"] == raw["running_cap"] and "running_cap" not in tune
    name, variant = next((n, v) for n, v in raw["variants"].items() if v.get("levels"))
    old, new = next(iter(variant["levels"].values())), next(iter(tune["variants"][name]["levels"].values()))
    assert (new["max_concurrency"], new["concurrency"], new["completed"]) == (old["concurrency"], old["in_flight"],
                                                                             old["ok"])
    assert (new["output_throughput"], new["round_output_throughput"]) == (old["value"], old["round_values"])
    assert not {"value", "round_values", "in_flight", "capped_at", "throughput", "ttft_s"} & set(new)
    assert f"{old['value']:.1f} ({min(old['round_values']):.1f}-" in report.report_markdown(tune)


def test_a_file_of_a_newer_format_is_refused_by_name(tmp_path):
    newer = tmp_path / "tune.json"
    newer.write_text(json.dumps({"format": 2, "variants": {}}))
    with pytest.raises(RigError, match=r"format 2: this rig reads tune.json of format 1 and rig's older ones"):
        report.read_tune(newer)


@pytest.mark.parametrize("path", sorted(VALIDATION.glob("**/tune.json")) + sorted(VALIDATION.glob("**/results.json")),
                         ids=lambda p: str(p.relative_to(VALIDATION)))
def test_every_committed_run_reads_with_each_level_kept(path):
    raw = json.loads(path.read_text())
    if path.name == "tune.json":
        read = report.read_tune(path)
        pairs = [(len(v.get("levels") or {}), len(read["variants"][n]["levels"])) for n, v in raw["variants"].items()]
    else:
        read = record.read(path, "results.json", bench.RESULTS)
        pairs = [(len(run["levels"]), len(new["levels"])) for run, new in zip(raw["runs"], read["runs"], strict=True)]
    assert read["format"] == 1 and pairs and all(old == new for old, new in pairs)
