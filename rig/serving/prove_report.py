"""rig prove's report: report.md from prove.json, and prove.png, each server's throughput at the bench levels."""
from __future__ import annotations

from rig.core.markdown import cell, table
from rig.serving.measure.plan import Level

BENCH_LEVELS = [Level(1), Level(8)]  # what each server of the numerics model is benchmarked at


def report_markdown(result: dict) -> str:
    v = result.get("versions", {})
    lines = [f"# rig prove: {result['stack']}", "",
             f"{'PASSED' if result['ok'] else 'FAILED'}: {sum(s['status'] == 'pass' for s in result['steps'])} "
             f"passed, {sum(s['status'] == 'fail' for s in result['steps'])} failed, "
             f"{sum(s['status'] == 'skip' for s in result['steps'])} skipped; TP sizes {result['tp_sizes']}, "
             f"{result['gpus']} GPU(s) visible.", "",
             *table(("versions", ""), [*((k, v.get(k)) for k in ("torch", "torch_cuda", "nccl", "sglang", "kernel",
                                                                  "flashinfer", "transformers")),
                                       ("driver", result.get("driver") or None)]),
             "", *table(("step", "verdict", "s", "detail"),
                        ((s["name"], s["status"], f"{s['seconds']:g}", s["detail"][:400]) for s in result["steps"]))]
    if result.get("stopped"):
        lines += ["", f"Stopped early: {cell(result['stopped'])}"]
    return "\n".join(lines) + "\n"


def figures(result: dict) -> dict:
    """prove.png: each server's throughput at the bench levels (none when no bench passed)."""
    benches = {s["name"].rsplit(":", 1)[0]: s["data"] for s in result["steps"]
               if s["name"].endswith(": bench") and s["status"] == "pass"}
    if not benches:
        return {}
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    names = [lv.name for lv in BENCH_LEVELS]
    width = 0.8 / len(benches)
    for i, (label, data) in enumerate(benches.items()):
        ax.bar([x + i * width for x in range(len(names))],
               [(data.get(n) or {}).get("output_throughput") or 0 for n in names], width, label=label)
    ax.set_xticks([x + width * (len(benches) - 1) / 2 for x in range(len(names))], names)
    ax.set_ylabel("output tok/s (numerics model)")
    ax.legend(fontsize=8)
    return {"prove.png": fig}
