"""rig machine probe's arithmetic and advice, on the all-reduce recorded on the lent 2-GPU H200
(docs/validation/serving-h200/results/probe-2gpu/probe.json) and on a PCIe-shaped variant."""
import json
from pathlib import Path

import pytest

from rig.machine import probe

RECORDED = Path(__file__).parents[2] / "docs" / "validation" / "serving-h200" / "results" / "probe-2gpu" / "probe.json"


def raw(world: int, seconds_at_256mb: float) -> dict:
    rows = [{"bytes": size, "iters": 10, "seconds": 40e-6 + size / (seconds_at_256mb and (256 << 20) / seconds_at_256mb),
             "correct": True} for size in probe.SIZES]
    return {"world_size": world, "torch": "2.11.0", "nccl": "2.28.9", "device": "GPU", "rows": rows}


def test_the_recorded_h200_is_nvlink_and_busbw_follows_nccl_tests():
    recorded = json.loads(RECORDED.read_text())
    again = probe.analyse({k: recorded[k] for k in ("world_size", "torch", "nccl", "device")} |
                          {"rows": [{k: r[k] for k in ("bytes", "iters", "seconds", "correct")} for r in recorded["rows"]]})
    last = again["rows"][-1]
    assert last["bytes"] == 256 << 20
    assert last["algbw_gbps"] == pytest.approx((256 << 20) / last["seconds"] / 1e9)
    assert last["busbw_gbps"] == pytest.approx(last["algbw_gbps"] * 2 * (2 - 1) / 2)
    assert again["link_class"] == "NVLink" and again["peak_busbw_gbps"] > 200
    assert again["correct"] and "nccl_pcie_only false" in again["advice"][0]


def test_eight_gpus_on_pcie_get_the_pcie_advice(tmp_path):
    result = probe.analyse(raw(8, (256 << 20) / 25e9))  # ~25 GB/s algbw: PCIe gen4/gen5 class
    assert result["link_class"] == "PCIe"
    assert result["rows"][-1]["busbw_gbps"] == pytest.approx(result["rows"][-1]["algbw_gbps"] * 14 / 8)
    assert any("nccl_pcie_only: true" in a for a in result["advice"])
    assert any("low concurrency only" in a for a in result["advice"])
    files = probe.write(result, tmp_path / "out")
    assert [Path(f).name for f in files] == ["probe.json", "probe.md", "probe.png"]
    assert (tmp_path / "out" / "probe.png").read_bytes()[:4] == b"\x89PNG"
    assert "**PCIe**" in (tmp_path / "out" / "probe.md").read_text()


def test_one_gpu_has_nothing_to_reduce():
    result = probe.analyse(raw(1, 0.001))
    assert result["link_class"] == "single GPU" and result["rows"][0]["busbw_gbps"] == 0.0


# Stand-ins for rig/foreign/peer_worker.py, run as the worker is (python -c CODE SPEC): they answer as a pair of
# GPUs would, or hang as a peer copy under a translating IOMMU with ACS redirect can.
ANSWER = """
import json, sys
spec = json.loads(sys.argv[1])
bad = {bad}
print(json.dumps({{"a": spec["a"], "b": spec["b"], "offered": spec["b"] != {unoffered},
                   "directions": [{{"from": s, "to": d, "correct": (s, d) not in bad, "gbps": 25.0}}
                                  for s, d in ((spec["a"], spec["b"]), (spec["b"], spec["a"]))]}}))
"""
HANGS_ON_PAIR_0_2 = """
import json, sys, time
spec = json.loads(sys.argv[1])
if (spec["a"], spec["b"]) == (0, 2):
    time.sleep(3600)
print(json.dumps({"a": spec["a"], "b": spec["b"], "offered": True,
                  "directions": [{"from": spec["a"], "to": spec["b"], "correct": True, "gbps": 25.0},
                                 {"from": spec["b"], "to": spec["a"], "correct": True, "gbps": 25.0}]}))
"""


def test_every_pair_is_copied_both_ways_and_a_wrong_copy_fails_its_pair_with_the_fix(tmp_path):
    import sys

    good = probe.measure_peers(Path(sys.executable), 3, worker=ANSWER.format(bad="set()", unoffered=-1))
    assert [(p["a"], p["b"]) for p in good["pairs"]] == [(0, 1), (0, 2), (1, 2)]
    assert good["ok"] and good["advice"] == ["all 3 pair(s) copy correctly both ways"]
    bad = probe.measure_peers(Path(sys.executable), 3, worker=ANSWER.format(bad="{(2, 1)}", unoffered=2))
    assert not bad["ok"] and [p["ok"] for p in bad["pairs"]] == [True, True, False]
    assert bad["pairs"][2]["error"] == "the copy 2->1 arrived with wrong values"
    assert "failed between GPUs 1<->2" in bad["advice"][0] and "NCCL_P2P_DISABLE" in bad["advice"][0]
    assert "no peer access between GPUs 0<->2" in bad["advice"][1]
    report = probe.report_markdown({**probe.analyse(raw(3, (256 << 20) / 25e9)), "peers": bad})
    assert r"| 1\<->2 | False | 1->2 25.0, 2->1 25.0 WRONG | FAILED: the copy 2->1 arrived with wrong values |" in report


def test_a_pair_that_never_completes_fails_within_its_deadline_and_the_others_are_measured():
    import sys
    import time

    started = time.monotonic()
    found = probe.measure_peers(Path(sys.executable), 3, deadline=3, worker=HANGS_ON_PAIR_0_2)
    assert time.monotonic() - started < 60  # bounded by the deadline, not the child's hour of sleep
    assert [p["ok"] for p in found["pairs"]] == [True, False, True]
    assert found["pairs"][1]["error"] == "the copy did not complete within 3 s (a hung peer-to-peer transfer)"
    assert not found["ok"]


def reply(directions: str, offered: str = "True") -> str:
    return f"import json; print(json.dumps({{'offered': {offered}, 'directions': {directions}}}))"


GOOD_WAY = "{'from': 0, 'to': 1, 'correct': True, 'gbps': 25.0}"


@pytest.mark.parametrize("script, error", [
    ("print('not json')", "an answer rig cannot read"),
    (reply("[{'from': 0}]"), "an answer rig cannot read"),
    ("print('[' * 100000)", "an answer rig cannot read"),  # nested past what the parser takes
    (reply(f"[{GOOD_WAY}, {GOOD_WAY}]"), "an answer rig cannot read: it reports [(0, 1), (0, 1)]"),  # one way twice
    (reply(f"[{GOOD_WAY}, {{'from': True, 'to': 0, 'correct': True, 'gbps': 25.0}}]"), "an answer rig cannot read"),
    (reply(f"[{GOOD_WAY}, {{'from': 1, 'to': 0, 'correct': True, 'gbps': float('nan')}}]"), "an answer rig cannot"),
    (reply(f"[{GOOD_WAY}, {{'from': 1, 'to': 0, 'correct': True, 'gbps': float('inf')}}]"), "an answer rig cannot"),
    (reply(f"[{GOOD_WAY}, {{'from': 1, 'to': 0, 'correct': 1, 'gbps': 2.0}}]"), "an answer rig cannot read"),
    (reply(f"[{GOOD_WAY}, {{'from': 1, 'to': 0, 'correct': True, 'gbps': 2.0}}]", offered="1"), "an answer rig"),
    ("raise SystemExit('CUDA error: peer access is not supported')", "exited 1: CUDA error: peer access")])
def test_an_answer_that_is_not_a_pairs_report_fails_that_pair(script, error):
    import sys

    found = probe.measure_peers(Path(sys.executable), 2, worker=script)
    assert not found["ok"] and found["pairs"][0]["error"].startswith(error), found


def test_a_hung_copy_in_a_grandchild_is_killed_with_its_pair_within_the_deadline(tmp_path):
    import sys
    import time

    script = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(100)']); " \
             "import time; time.sleep(100)"
    started = time.monotonic()
    found = probe.measure_peers(Path(sys.executable), 2, deadline=2, worker=script)
    assert time.monotonic() - started < 30 and not found["ok"]  # the grandchild held the pipes: killed with it
    assert "did not complete within 2 s" in found["pairs"][0]["error"]


def test_one_gpu_has_nothing_to_pair():
    assert probe.measure_peers(Path("/nonexistent/python"), 1) == {"pairs": [], "ok": True,
                                                                   "advice": ["one GPU: nothing to pair"]}
