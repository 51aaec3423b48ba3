"""The GPU runbooks under docs/validation, rehearsed on the CPU: each script runs as written against the SGLang
stand-in, with the venv layout the lent H200 has (the machine's python3 is itself a venv; the runbook's venv sits
over it through a .pth file) and the runbook's own stack files, only their paths pointed into a scratch directory,
their port made free and their test model made tiny (the 8b one is 16 GB). A GPU run then spends its minutes
measuring, not debugging: the four defects that stopped the first real-cost run (a backend found only by globbing,
a real trace's nanosecond header refused, a step-0 line sglang refuses at start, a doubly escaped report) would each
have failed here.

The torch the test models are written with is the lab's (the default stack's, on the CPU), so these run with the
lab's tests.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from harness.paths import REPO
from harness.standin import MODEL, STANDIN, free_port, servers_running

pytestmark = pytest.mark.venv
REAL_COST = REPO / "docs" / "validation" / "real-cost-h200"


def standin_wheel(into: Path, version: str = "0.5.17+standin", real: dict[str, bytes] | None = None) -> Path:
    """The stand-in sglang package as a wheel (what carry.py stages is wheels; pip installs them there), with REAL
    sglang files ({path in the wheel: bytes}) beside its own."""
    dist = f"sglang-{version}.dist-info"
    files = {str(p.relative_to(STANDIN)): p.read_bytes() for p in sorted((STANDIN / "sglang").rglob("*.py"))}
    files.update(real or {})
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n".encode()
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: rig-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{name},sha256={digest(data)},{len(data)}\n" for name, data in files.items())
    files[f"{dist}/RECORD"] = (record + f"{dist}/RECORD,,\n").encode()
    into.mkdir(parents=True, exist_ok=True)
    wheel = into / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return wheel


def machine_python(root: Path, lab: dict) -> Path:
    """A python3 that is itself a venv, as the H200's is: rig's own packages, the lab's torch and transformers,
    and the stand-in's server module reach it through a .pth file of its own."""
    venv = root / "machine"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    ours = [p for p in sys.path if p.endswith("site-packages")]
    lab_site = next((lab["v23"] / "lib").glob("python3*/site-packages"))
    (site / "machine.pth").write_text("\n".join([*ours, str(lab_site), str(REPO / "tests")]) + "\n")
    return venv / "bin"


def rehearsal_stack(source: Path, into: Path, venv: Path, models: Path, port: int) -> Path:
    """SOURCE as the rehearsal runs it: its paths and port here, its test model tiny, its requests short, one round
    a level and profiles of 5 steps (512 requests of 128 tokens at C=256 are minutes of two CPUs' time); its levels,
    variants, step 0, profiled levels and server line as they are."""
    data = yaml.safe_load(source.read_text())
    data["venv"] = str(venv)
    data["server"].update(testmodel_dir=str(models), testmodel_shape="tiny", port=port)
    data["bench"].update(max_tokens=16, rounds=1, min_seconds=0)
    data["tune"]["profile_steps"] = 5  # a full batch's 16-token requests decode 5 steps and more (PROFILE_AT too)
    path = into / source.name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def free_off_targets() -> dict[str, bytes]:
    """The files rig's free-off patches change, from the locked sglang 0.5.17 wheel of the H200's stack (fetched
    into rig's cache and checked against the lock's hash)."""
    from harness.paths import CACHE

    from rig.patches.patchset import load
    from rig.python.lock import read
    from rig.python.wheelhouse import cached_path, fetch

    lock = read(REPO / "stacks" / "h200-sglang-0.5.17.lock")
    wheel = [w for w in lock["wheels"] if w["name"] == "sglang"]
    fetch({**lock, "wheels": wheel}, CACHE)
    with zipfile.ZipFile(cached_path(CACHE, wheel[0])) as archive:
        return {p.file: archive.read(p.file) for p in load() if p.opt_in == "free-off" and p.needs("0.5.17")}


def test_the_real_cost_runbook_runs_end_to_end_against_the_standin(lab, tmp_path):
    """The phases, free-off's too: its patches go onto the real 0.5.17 files the stand-in wheel carries; every stack
    served with flashinfer (BACKEND), as run 15's was, its draft with triton (DRAFT_BACKEND), as run 20 asks."""
    bin_dir = machine_python(tmp_path, lab)
    wheels = tmp_path / "wheels"
    standin_wheel(wheels / "p1", real=free_off_targets())
    stacks, port = tmp_path / "stacks", free_port()
    stacks.mkdir()
    venv, res = tmp_path / "venv", tmp_path / "results"
    for name in ("stack-t1.yml", "stack-greedy.yml", "stack-free-off-t1.yml", "stack-free-off-greedy.yml",
                 "stack-free-off-policy.yml", "stack-free-off-prove.yml"):
        rehearsal_stack(REAL_COST / name, stacks, venv, tmp_path / "models-8b", port)
    faults = tmp_path / "faults.json"
    # the batched scheduler's costs; the acceptance is the test model's own (the stand-in reads its record)
    costs = MODEL[:MODEL.index("--accept-rate")]
    faults.write_text(json.dumps({"args": [*costs, "--extend-ms", "0.02"]}))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "VENV": str(venv), "RES": str(res),
           "SRC": str(tmp_path / "src"), "STAGE": str(tmp_path / "stage"), "OUT": str(tmp_path / "out"),
           "STACKS": str(stacks), "WHEELS": str(wheels), "WAIT_S": "1500", "PROVE_ARGS": "--skip doctor",
           "SGLANG_STANDIN_FAULTS": str(faults), "GPUS": "2", "BACKEND": "flashinfer", "DRAFT_BACKEND": "triton",
           "PROFILE_AT": "64", "PROFILE_HOST": "1",
           # free-off-greedy and free-off-prove are left out: the same lines as free-off's and free-off-tp's prove
           # with other arguments (a minute of the suite's CPU)
           "PHASES": "prove tune-t1 tune-greedy free-off free-off-tp"}
    script = REAL_COST / "run.sh"
    staged = subprocess.run(["bash", str(script), "stage", "1"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert staged.returncode == 0 and staged.stdout.strip() == "1", staged.stderr
    done = subprocess.run(["bash", str(script), "all"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1600, check=False)
    log = (res / "all.log").read_text() if (res / "all.log").exists() else ""
    assert done.returncode == 0 and "the run exited 0" in done.stdout, done.stdout + done.stderr + log[-3000:]
    phases = (res / "phases.txt").read_text()
    rcs = {name: (res / f"{name}.rc").read_text().strip() for name in (
        "env-install", "prove", "tune-t1", "tune-greedy", "patch-free-off", "tune-free-off-t1", "prove-tp2",
        "tune-free-off-tp2")}
    assert rcs["env-install"] == "0" and rcs["prove"] == "0", phases + (res / "prove.err").read_text()[-3000:]
    # the venv over the machine's Python: sglang from the staged wheel, torch from the machine's site
    seen = subprocess.run([str(venv / "bin" / "python"), "-c", "import sglang, torch; print(sglang.__file__)"],
                          capture_output=True, text=True, check=True).stdout
    assert seen.startswith(str(venv))
    # rig tune measured every variant, step 0 included (only where a batch runs at it), with kernel profiles
    for name, temperature in (("tune-t1", 1.0), ("tune-greedy", 0.0), ("tune-free-off-t1", 1.0)):
        assert rcs[name] in ("0", "1"), phases + (res / f"{name}.err").read_text()[-3000:]
        result = json.loads((res / name / "tune.json").read_text())
        assert result["plan"]["temperature"] == temperature
        stopped = {n: v["stopped"] for n, v in result["variants"].items() if v.get("stopped")}
        assert not stopped, stopped
        assert "\\n" not in (res / name / "report.md").read_text()
    # BACKEND: every stack served with flashinfer, from its copies
    assert sorted(p.name for p in (res / "stacks").iterdir()) == sorted(p.name for p in stacks.iterdir())
    t1 = json.loads((res / "tune-t1" / "tune.json").read_text())
    assert all("--attention-backend flashinfer" in " ".join(v["argv"]) for v in t1["variants"].values())
    # DRAFT_BACKEND: the draft's attention on triton, the target's on flashinfer (run 20's suspect), in every line
    assert all(" ".join(v["argv"]).count("--speculative-draft-attention-backend triton") == 1
               for v in t1["variants"].values())
    # the host beside the GPU: its kernel (the runtime) and CPUs, after the GPU's line
    versions = (res / "versions.txt").read_text()
    assert f"kernel {os.uname().release}\ncpus {len(os.sched_getaffinity(0))}\n" in versions, versions
    # the host's speed through the run, a line every 5 s from the pipeline's start to its end
    # and the CPUs' busy, stolen and I/O-waiting shares between lines (a virtual machine's steal beside a slow probe)
    host = [line.split(",") for line in (res / "host.csv").read_text().splitlines()]
    assert host[0] == ["time", "python_ms", "busy_pct", "steal_pct", "iowait_pct", "load1"] and len(host) > 10
    assert all(float(row[1]) > 0 and float(row[5]) >= 0 for row in host[1:]), host
    assert all(0 <= float(share) <= 100 for row in host[2:] for share in row[2:5]), host
    assert max(float(row[2]) for row in host[2:]) > 0, host  # the run's own work shows as busy
    with pytest.raises(ProcessLookupError):  # stopped with the pipeline
        os.killpg(int((res / "watch.pid").read_text()), 0)
    assert (res / "stacks.txt").read_text().startswith(
        "BACKEND=flashinfer DRAFT_BACKEND=triton PROFILE_AT=64 PROFILE_HOST=1 ")
    # PROFILE_AT: each tune profiles C=64 alone (stack-t1.yml's own [64, 256] replaced), free-off's step 0 too
    assert sorted(lv for lv, m in t1["variants"]["baseline"]["levels"].items() if m.get("profile")) == ["C=64"]
    assert list(t1["variants"])[:3] == ["baseline", "step0", "eagle3-3"]  # step 0 before EAGLE-3
    assert sorted(t1["variants"]["step0"]["levels"]) == ["C=16", "C=256", "C=64"]
    assert t1["variants"]["step0"]["levels"]["C=64"]["profile"]["kernel_ms_per_step"] > 0
    assert t1["variants"]["step0"]["levels"]["C=64"]["profile"]["host_own"]  # PROFILE_HOST: the host's Python too
    # free-off: applied to the real files by rig's engine, then step 0 measured both ways
    patched = json.loads((res / "patch-free-off.json").read_text())
    assert rcs["patch-free-off"] == "0" and {r["id"]: r["status"] for r in patched["patches"]} == {
        "sglang-free-off-graphs": "applied", "sglang-free-off-worker-0517": "applied",
        "sglang-free-off-worker-0523": "not-applicable",
        "sglang-free-off-check": "opt-in"}, (res / "patch-free-off.err").read_text()[-3000:]
    free = json.loads((res / "tune-free-off-t1" / "tune.json").read_text())["variants"]
    assert "step0" not in free  # SGLang's own: the table has it
    assert free["step0-plain"]["env"] == {"RIG_FREE_OFF": "1", "RIG_FREE_OFF_DRAFT": "extend"}
    assert free["step0-plain-ingest"]["env"] == {"RIG_FREE_OFF": "1", "RIG_FREE_OFF_DRAFT": "ingest"}  # read: applied
    assert free["step0-plain"]["levels"]["C=64"]["output_throughput"] > 0
    assert free["step0-plain-ingest"]["levels"]["C=64"]["profile"]["gpu_busy_ms_per_step"] > 0  # PROFILE_AT
    prove = json.loads((res / "prove" / "prove.json").read_text())
    assert prove["ok"] and {s["name"]: s["status"] for s in prove["steps"]}["agree: acceptance"] == "pass"
    # free-off-tp (issues 71, 76): prove's free-off steps on the patched files at TP 2 (no GPU here: the switches
    # run at TP 1, the TP-2 servers are skipped) with a tune of the policy stack
    assert rcs["prove-tp2"] == "0", phases + (res / "prove-tp2.err").read_text()[-3000:]
    found = {s["name"]: s for s in json.loads((res / "prove-tp2" / "prove.json").read_text())["steps"]}
    assert found["free-off: switches tp1"]["status"] == "pass", found["free-off: switches tp1"]
    assert found["free-off: switches tp1"]["data"]["switches"][:2] == ["3 -> 0", "0 -> 3"]
    assert found["free-off: accept after off"]["status"] == "pass", found["free-off: accept after off"]
    assert found["free-off: fallbacks"]["status"] == "pass", found["free-off: fallbacks"]
    assert set(found["free-off: fallbacks"]["data"]["fallbacks_logged"]) == {"grammar", "logprobs", "penalties"}
    assert "TP 2 needs 2 GPUs; 0 visible" in found["tp2"]["detail"]
    assert rcs["tune-free-off-tp2"] in ("0", "1"), phases + (res / "tune-free-off-tp2.err").read_text()[-3000:]
    at_tp2 = json.loads((res / "tune-free-off-tp2" / "tune.json").read_text())["variants"]
    assert not {n: v["stopped"] for n, v in at_tp2.items() if v.get("stopped")}
    assert all("--tp-size 2" in " ".join(v["argv"]) for v in at_tp2.values()), {n: v["argv"] for n, v in at_tp2.items()}
    assert (tmp_path / "out" / "results.tgz").stat().st_size > 0
    with tarfile.open(tmp_path / "out" / "traces.tar") as traces:  # the profiler's traces beside it, to read again
        names = traces.getnames()
    assert "results/tune-t1/profiles/baseline/baseline-C64-TP-0.trace.json.gz" in names, names
    assert not servers_running(venv)


@pytest.mark.parametrize("settings, says", [
    ({"PHASES": "tune-t1 warp"}, "unknown phase warp in PHASES"),
    ({"BACKEND": "cutlass"}, "unknown BACKEND cutlass"),
    ({"DRAFT_BACKEND": "triton"}, "DRAFT_BACKEND needs BACKEND"),
    ({"PROFILE_AT": "256;rm -rf /"}, "PROFILE_AT=256;rm -rf / is not a comma-separated list of concurrencies"),
    ({"PROFILE_AT": "0"}, "is not a comma-separated list"),
    ({"PROFILE_AT": "64,64"}, "PROFILE_AT=64,64 lists a level twice"),
    ({"PROFILE_AT": "64", "PROFILE_HOST": "yes"}, "PROFILE_HOST=yes is neither 1 nor 0"),
    ({"PROFILE_HOST": "1"}, "PROFILE_HOST=1 needs PROFILE_AT (the levels)"),
    ({"PROFILE_AT": "2"}, "stack-free-off-0523.yml's tunes measure no level 2 (they measure 1,16,64,256)"),
    ({"PROFILE_AT": "1", "TUNE_ARGS": "--temperature 0 --concurrency 16,256"},
     "tunes measure no level 1 (they measure 16,256)"),
], ids=["phase", "backend", "draft-alone", "profile-pasted", "profile-zero", "profile-twice", "host-not-a-flag",
        "host-without-levels", "profile-unmeasured", "profile-not-in-tune-args"])
def test_a_runbook_setting_it_cannot_use_is_refused_before_anything_starts(tmp_path, settings, says):
    res, src = tmp_path / "results", tmp_path / "src"
    env = {**os.environ, "RES": str(res), "SRC": str(src), "VENV": str(tmp_path / "venv"), "OUT": str(tmp_path / "out"),
           "STAGE": str(tmp_path / "stage"), "PHASES": "tune-t1", **settings}
    done = subprocess.run(["bash", str(REAL_COST / "run.sh"), "all"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and says in done.stderr, done.stdout + done.stderr
    assert not src.exists() and not (tmp_path / "venv").exists() and not list(res.iterdir())
