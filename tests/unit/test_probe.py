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
