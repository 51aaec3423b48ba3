"""A TEST STAND-IN for the sglang package: see tests/data/sglang_standin/README.md."""
