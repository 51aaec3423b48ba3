"""The one measuring engine under `rig bench`, `rig tune` and `rig prove`.

plan: what to measure, built from the stack's bench section (its defaults and limits, the options over them);
client: the streaming HTTP client and the load generators (closed loop, Poisson), each request with a deadline;
stats: one round's and one level's numbers; sweep: every level in rounds on servers interleaved, with each
round's server-side accept length; verdict: ratios, noise, crossover, the per-level choice and its
confirmation, and the failures of measuring nothing; record: the run record's one shape (sglang.bench_serving's
names), written into --out however the run ends and read back, rig's older formats converted;
torch_profile: SGLang's torch profiler over a level's full batch, its traces summed per kernel.
"""
