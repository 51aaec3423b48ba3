"""Where a decode step's time goes: SGLang's torch-profiler traces summed per CUDA kernel."""
import gzip
import json

import pytest

from rig.core import RigError
from rig.serving.measure.torch_profile import summarize, traces


def _trace(path, events):
    with gzip.open(path, "wt") as out:
        json.dump({"traceEvents": events}, out)
    return path


def test_kernels_are_summed_per_step_and_rank_the_largest_first(tmp_path):
    kernel = {"ph": "X", "cat": "kernel", "ts": 0}
    events = [{**kernel, "name": "attn", "dur": 3000}, {**kernel, "name": "gemm", "dur": 1000},
              {**kernel, "name": "attn", "dur": 3000}, {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 9e9},
              {**kernel, "name": "bad", "dur": "x"}, {**kernel, "name": "neg", "dur": -5}, "not an event"]
    ranks = [_trace(tmp_path / f"p-TP-{r}.trace.json.gz", events) for r in (0, 1)]
    found = summarize(ranks, steps=2)
    assert found["ranks"] == 2 and found["kernel_ms_per_step"] == 3.5  # (6 + 1) ms over 2 steps, per rank
    assert [(k["name"], k["ms_per_step"]) for k in found["kernels"]] == [("attn", 3.0), ("gemm", 0.5)]
    assert traces(tmp_path, "p", wait=3) == ranks and traces(tmp_path, "other", wait=1) == []


@pytest.mark.parametrize("content, says", [(b"not gzip", "not a whole gzip file"),
                                           (gzip.compress(b'{"other": 1}', mtime=0), "holds no traceEvents"),
                                           (gzip.compress(b"[1, 2", mtime=0), "profile trace")],
                         ids=["not-gzip", "no-events", "cut-short"])  # ids the same in every xdist worker
def test_a_trace_that_is_not_one_is_one_clear_error(tmp_path, content, says):
    path = tmp_path / "p-TP-0.trace.json.gz"
    path.write_bytes(content)
    with pytest.raises(RigError, match=says):
        summarize([path], 1)


# The head of a trace the torch profiler (Kineto) wrote on the lent H200 for SGLang 0.5.17: its header carries
# nanosecond epoch values and its events microsecond epoch timestamps; rig reads only the kernels' `dur`.
KINETO_HEAD = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109667328,
                                                         "computeMajor": 9, "computeMinor": 0}],
               "cupti_version": 26, "cuda_runtime_version": 13000, "cuda_driver_version": 13000,
               "trace_id": "C1D0E1B0A5A44A5D8F0D2D5A1E6F7A8B", "displayTimeUnit": "ms",
               "baseTimeNanoseconds": 1790857026000000000}


def test_a_real_trace_header_with_nanosecond_epochs_is_read(tmp_path):
    ts = 1790857026123456.5  # microseconds since the epoch, as Kineto writes them
    events = [{"ph": "X", "cat": "kernel", "name": "decode_attn", "pid": 0, "tid": 7, "ts": ts, "dur": 1500,
               "args": {"correlation": 1790857026000000001, "device": 0}},
              {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": ts + 1600, "dur": 500}]
    path = tmp_path / "baseline-C64-TP-0.trace.json.gz"
    with gzip.open(path, "wt") as out:
        json.dump({**KINETO_HEAD, "traceEvents": events}, out)
    found = summarize([path], steps=1)
    assert found["kernel_ms_per_step"] == 2.0 and found["kernels"][0]["name"] == "decode_attn"


def test_a_trace_that_cannot_be_read_is_a_note_not_the_end_of_the_run(tmp_path):
    from rig.serving.measure.torch_profile import read

    path = tmp_path / "p-TP-0.trace.json.gz"
    path.write_bytes(b"not gzip")
    assert "not a whole gzip file" in read([path], 1)["error"]


def test_a_trace_whose_compressed_bytes_are_damaged_is_one_clear_error(tmp_path):
    data = bytearray(gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "dur": 1}] * 200}).encode(),
                                   mtime=0))
    data[20:60] = bytes(40)  # zlib.error, not an OSError, from inside the deflate stream
    path = tmp_path / "p-TP-0.trace.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(RigError, match="not a whole gzip file"):
        summarize([path], 1)


def test_the_gpu_idle_share_is_the_span_the_kernels_leave_uncovered(tmp_path):
    """Two streams overlap (their union counts once), a gap between steps is the GPU waiting on the host."""
    kernel = {"ph": "X", "cat": "kernel", "name": "k"}
    step = [{**kernel, "ts": 100, "dur": 4000}, {**kernel, "ts": 1100, "dur": 1000, "tid": 9},  # inside the first
            {**kernel, "ts": 4100, "dur": 1000}]  # back to back: 100..5100 busy
    later = [{**kernel, "ts": 10100, "dur": 5000}]  # 5000 us idle before it
    found = summarize([_trace(tmp_path / "p-TP-0.trace.json.gz", step + later)], steps=2)
    assert found["kernel_ms_per_step"] == 5.5  # (4 + 1 + 1 + 5) ms over 2 steps
    assert found["gpu_busy_ms_per_step"] == 5.0 and found["span_ms_per_step"] == 7.5  # 10 ms busy of 15 ms
    assert found["gpu_idle_share"] == pytest.approx(1 / 3, abs=1e-4)


@pytest.mark.parametrize("unplaced", [{}, {"ts": -1}, {"ts": "0"}, {"ts": True}, {"ts": 1e19}],
                         ids=["none", "negative", "text", "bool", "huge"])
def test_a_kernel_without_a_usable_timestamp_leaves_the_idle_share_unknown(tmp_path, unplaced):
    """Time that cannot be placed makes no idle share, on any rank: one rank fully timed, the other not."""
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "dur": 1000}
    timed = _trace(tmp_path / "p-TP-0.trace.json.gz", [{**kernel, "ts": 0}, {**kernel, "ts": 5000}])
    other = _trace(tmp_path / "p-TP-1.trace.json.gz", [{**kernel, "ts": 0}, {**kernel, **unplaced}])
    found = summarize([timed, other], steps=1)
    assert found["kernel_ms_per_step"] == 2.0  # still summed
    assert found["gpu_busy_ms_per_step"] is None and found["span_ms_per_step"] is None
    assert found["gpu_idle_share"] is None
    alone = summarize([timed], steps=1)
    assert (alone["gpu_busy_ms_per_step"], alone["span_ms_per_step"], alone["gpu_idle_share"]) == (2.0, 6.0, 0.6667)


def test_ranks_average_their_busy_time_and_span(tmp_path):
    kernel = {"ph": "X", "cat": "kernel", "name": "k"}
    ranks = [_trace(tmp_path / "p-TP-0.trace.json.gz", [{**kernel, "ts": 0, "dur": 2000}]),
             _trace(tmp_path / "p-TP-1.trace.json.gz", [{**kernel, "ts": 0, "dur": 1000},
                                                        {**kernel, "ts": 3000, "dur": 1000}])]
    found = summarize(ranks, steps=1)
    assert (found["gpu_busy_ms_per_step"], found["span_ms_per_step"]) == (2.0, 3.0)  # (2 + 2) / 2, (2 + 4) / 2
    assert found["gpu_idle_share"] == pytest.approx(1 / 3, abs=1e-4)


def test_the_hosts_cuda_calls_are_summed_per_step_the_longest_first(tmp_path):
    """Eager launches and a host waiting on the GPU, per step and rank; kernels stay kernels."""
    def call(name, dur, cat="cuda_runtime"):
        return {"ph": "X", "cat": cat, "name": name, "ts": 0, "dur": dur}
    events = [call("cudaLaunchKernel", 5)] * 40 + [
        call("cudaStreamSynchronize", 3000), call("cuLaunchKernel", 4, "cuda_driver"), call("cudaGraphLaunch", 20),
        call("cudaGraphLaunch", "x"), {"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 100}]
    ranks = [_trace(tmp_path / f"p-TP-{r}.trace.json.gz", events) for r in (0, 1)]
    found = summarize(ranks, steps=2)
    assert found["host_calls"] == [{"name": "cudaStreamSynchronize", "ms_per_step": 1.5, "calls_per_step": 0.5},
                                   {"name": "cudaLaunchKernel", "ms_per_step": 0.1, "calls_per_step": 20.0},
                                   {"name": "cudaGraphLaunch", "ms_per_step": 0.01, "calls_per_step": 0.5},
                                   {"name": "cuLaunchKernel", "ms_per_step": 0.002, "calls_per_step": 0.5}]
    assert [k["name"] for k in found["kernels"]] == ["k"] and found["kernel_ms_per_step"] == 0.05


def test_the_hosts_own_time_leaves_out_what_its_callees_took(tmp_path):
    """Nested calls on one thread; another thread on its own; a call that outlasts its caller is clipped to it (its
    sibling after it is the caller's callee, not its own); a profile of the GPU alone names no host functions."""
    def call(name, ts, dur, cat="python_function", tid=1):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 5, "tid": tid}
    site = "/root/venv/lib/python3.12/site-packages/"
    events = [call(site + "sglang/srt/managers/scheduler.py(10): run_batch", 0, 1000),
              call(site + "sglang/srt/model_executor/model_runner.py(20): forward", 100, 600),
              call("aten::copy_", 200, 300, "cpu_op"), call("cudaLaunchKernel", 250, 50, "cuda_runtime"),
              call("cudaStreamSynchronize", 800, 100, "cuda_runtime"),
              call("other.py(1): loop", 0, 400, tid=2), call("other.py(2): step", 300, 500, tid=2),
              call("other.py(3): wait", 0, 1000, tid=3), call("f", 0, 10, tid=3), call("g", 5, 6, tid=3),
              call("h", 10.5, 80, tid=3),
              {"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 900}]
    found = summarize([_trace(tmp_path / "p-TP-0.trace.json.gz", events)], steps=1, host_code=True)
    assert {c["name"]: c["ms_per_step"] for c in found["host_own"]} == {
        "sglang/srt/managers/scheduler.py(10): run_batch": 0.3,  # 1000 less forward's 600 and the sync's 100
        "sglang/srt/model_executor/model_runner.py(20): forward": 0.3, "aten::copy_": 0.25,
        "cudaLaunchKernel": 0.05, "cudaStreamSynchronize": 0.1,
        "other.py(1): loop": 0.3, "other.py(2): step": 0.1,  # the step outlasts the loop: clipped at 400
        "other.py(3): wait": 0.91, "f": 0.005, "g": 0.005, "h": 0.08}  # g outlasts f; h is wait's, not g's
    gpu_only = [e for e in events if e["cat"] in ("kernel", "cuda_runtime")]
    assert summarize([_trace(tmp_path / "q-TP-0.trace.json.gz", gpu_only)], steps=1)["host_own"] is None
    assert summarize([_trace(tmp_path / "r-TP-0.trace.json.gz", events)], steps=1)["host_own"] is None  # not asked
