"""The machine through a run, every 5 s until the run that started it is gone (killed outright too).
- RES/host.csv: how long one core takes for a fixed piece of Python (the host's pace, which a server bound by its
  host follows); what share of the CPUs' time since the last line was busy, stolen by the hypervisor (a virtual
  machine's CPUs shared with other guests: a slow probe beside a high steal is the host, not the server) or
  waiting on I/O; and the load average.
- RES/gpu.csv, where nvidia-smi is: the GPU's clocks, temperature, power, load, memory and throttle reasons (a
  server measured later on a slower clock shows there).
Usage: python3 -P watch.py RES (run.sh's pipeline starts it)."""
import os
import shutil
import subprocess
import sys
import time

GPU = ("timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu,memory.used,"
       "clocks_throttle_reasons.active")


def gpu_line(smi: str, header: bool) -> str:
    """nvidia-smi's reading now, its header first where HEADER; what it said instead where it failed (said, never
    fatal: the host's column goes on)."""
    try:
        done = subprocess.run([smi, f"--query-gpu={GPU}", "--format=csv" + ("" if header else ",noheader")],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:  # a hung or vanished nvidia-smi: said, the watch goes on
        return f"# nvidia-smi did not answer: {exc}\n"
    return done.stdout if done.returncode == 0 else f"# nvidia-smi exited {done.returncode}: {done.stderr.strip()}\n"


def cpu_times() -> list[int]:
    """The CPUs' time counters since boot (/proc/stat's first line: user nice system idle iowait irq softirq
    steal), or none where the kernel has no such file."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            return [int(n) for n in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return []


def cpu_shares(before: list[int], after: list[int]) -> str:
    """busy, steal and iowait as percent of the CPUs' time between two readings; empty where either is missing."""
    delta = [b - a for a, b in zip(before, after, strict=False)]  # none before: no shares
    total = sum(delta)
    # a counter that went back (iowait may; a CPU taken offline drops its counters from the sum) gives no share
    if len(delta) < 8 or total <= 0 or min(delta) < 0:
        return ",,"
    user, nice, system, _idle, iowait, irq, softirq, steal = delta
    return ",".join(f"{100 * part / total:.1f}" for part in (user + nice + system + irq + softirq, steal, iowait))


def load1() -> str:
    """The 1-minute load average, or empty where the kernel cannot say (no /proc): the probe's line goes on."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return ""


def main(res: str) -> None:
    parent, smi = os.getppid(), shutil.which("nvidia-smi")
    with open(os.path.join(res, "host.csv"), "w", buffering=1) as host, \
            open(os.path.join(res, "gpu.csv") if smi else os.devnull, "w", buffering=1) as gpu:
        host.write("time,python_ms,busy_pct,steal_pct,iowait_pct,load1\n")
        first, times = True, cpu_times()
        while os.getppid() == parent:  # the run's shell gone: this goes too
            start = time.perf_counter()
            sum(i * i for i in range(200_000))
            took, now = (time.perf_counter() - start) * 1000, cpu_times()
            host.write(f"{time.time():.3f},{took:.2f},{cpu_shares(times, now)},{load1()}\n")
            times = now
            if smi:
                gpu.write(gpu_line(smi, first))
                first = False
            time.sleep(5)


if __name__ == "__main__":
    main(sys.argv[1])
