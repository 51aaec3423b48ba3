"""The benchmarks behind docs/BENCHMARKS.md, one module per benchmark, each writing its own section of it.

`python scripts/bench.py NAME` runs one (`make bench` runs them all); common.py holds what they share.
"""
