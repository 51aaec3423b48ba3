"""docs/validation/real-cost-h200/watch.py's host line: the CPUs' shares between two /proc/stat readings, none where a
counter went back or a reading is missing, and a line that goes on where the kernel cannot give the load average."""
from __future__ import annotations

import importlib.util
import os

import pytest
from harness.paths import REPO

spec = importlib.util.spec_from_file_location("watch", REPO / "docs" / "validation" / "real-cost-h200" / "watch.py")
watch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(watch)


@pytest.mark.parametrize("before, after, shares", [
    ([0] * 8, [10, 0, 10, 70, 5, 0, 0, 5], "20.0,5.0,5.0"),  # busy = user + nice + system + irq + softirq
    ([100, 0, 100, 1000, 500, 0, 0, 10], [300, 0, 100, 1000, 490, 0, 0, 10], ",,"),  # iowait went back
    ([100, 0, 100, 1000, 0, 0, 0, 200], [150, 0, 110, 1100, 0, 0, 0, 100], ",,"),  # a CPU's counters left the sum
    ([], [1] * 8, ",,"),  # no reading before
    ([1] * 8, [1] * 8, ",,"),  # no time passed
])
def test_cpu_shares(before, after, shares):
    assert watch.cpu_shares(before, after) == shares


def test_a_load_average_the_kernel_cannot_give_is_an_empty_field(monkeypatch):
    assert float(watch.load1()) >= 0
    monkeypatch.setattr(os, "getloadavg", lambda: (_ for _ in ()).throw(OSError("Load averages are unobtainable")))
    assert watch.load1() == ""
