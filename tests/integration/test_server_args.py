"""rig server args: one stack, rendered for sglang 0.5.9 and 0.5.23 and parsed by each one's own parser."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from harness.commands import rig
from harness.paths import CACHE, REPO

from rig.core import RigError
from rig.serving.server import close_parsers, render
from rig.stack.spec import load

pytestmark = pytest.mark.venv

SERVER = {"model": "/models/target", "draft_model": "/models/eagle3", "tp": 8, "mem_fraction_static": 0.85,
          "flashinfer_allreduce_fusion": True, "torch_symm_mem": True}
# what the parser made of each argv: the values sglang will run with (one process: importing sglang's parser
# takes 10-15 CPU-seconds)
PARSED = """
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
keys = ("model_path", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
        "speculative_eagle_topk", "speculative_num_draft_tokens", "tp_size", "cuda_graph_max_bs",
        "cuda_graph_max_bs_decode", "enable_flashinfer_allreduce_fusion", "enable_torch_symm_mem",
        "mem_fraction_static", "host", "port", "api_key")
seen = []
for argv in json.loads(sys.argv[1]):
    p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)
    a = vars(p.parse_args(argv))
    a["tp_size"] = a.get("tp_size") or a.get("tensor_parallel_size")  # 0.5.9's dest; from_cli_args maps it the same
    seen.append({k: a.get(k) for k in keys})
print(json.dumps(seen))
"""


def stack_file(tmp_path: Path, **server) -> Path:
    data = yaml.safe_load((REPO / "stacks" / "default.yml").read_text())
    data["server"].update(SERVER, **server)
    path = tmp_path / "stack.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def args(venv: Path, stack: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return rig("server", "args", "--stack", str(stack), "--venv", str(venv), *extra, env=env)


@pytest.fixture(scope="module", autouse=True)
def parsers():
    """The tests render in this process where the CLI is not their subject: each venv's sglang loads once here
    (12.5 CPU-seconds each time), and its parser stops with the module."""
    yield
    close_parsers()


def refusal(venv: Path, stack: Path) -> str:
    """Why VENV's sglang refuses STACK's server line."""
    with pytest.raises(RigError) as refused:
        render(load(stack), venv)
    return str(refused.value)


def parsed(venv: Path, *argvs: list[str]) -> list[dict]:
    """What VENV's sglang parser makes of each of ARGVS (rig's argv: the parser reads what follows the module)."""
    done = subprocess.run([str(venv / "bin" / "python"), "-c", PARSED, json.dumps([argv[3:] for argv in argvs])],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.parametrize("version, graph_flag", [("v9", "--cuda-graph-max-bs"), ("v23", "--cuda-graph-max-bs-decode")])
def test_the_stack_is_spelled_for_each_version_and_means_the_same(lab, tmp_path, version, graph_flag):
    venv = lab[version]
    unset = render(load(stack_file(tmp_path)), venv)["argv"]
    assert graph_flag not in unset  # no graph in the stack: SGLang's own, whatever a bench measures
    done = args(venv, stack_file(tmp_path, cuda_graph_max_bs=250), "--json")  # the command, once
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    argv = out["argv"]
    assert out["sglang"] == ("0.5.9" if version == "v9" else "0.5.23")
    assert argv[:3] == [str(venv / "bin" / "python"), "-m", "sglang.launch_server"]
    assert argv[argv.index(graph_flag) + 1] == "250"
    baseline = render(load(stack_file(tmp_path, cuda_graph_max_bs=250)), venv, baseline=True)["argv"]
    seen, seen_baseline = parsed(venv, argv, baseline)
    assert seen["cuda_graph_max_bs" if version == "v9" else "cuda_graph_max_bs_decode"] == 250
    assert {k: seen[k] for k in ("model_path", "speculative_algorithm", "speculative_draft_model_path",
                                 "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                                 "tp_size", "enable_flashinfer_allreduce_fusion", "enable_torch_symm_mem",
                                 "mem_fraction_static", "host", "port")} == {
        "model_path": "/models/target", "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "/models/eagle3", "speculative_num_steps": 2, "speculative_eagle_topk": 4,
        "speculative_num_draft_tokens": 8, "tp_size": 8, "enable_flashinfer_allreduce_fusion": True,
        "enable_torch_symm_mem": True, "mem_fraction_static": 0.85, "host": "127.0.0.1", "port": 30000}
    assert not [a for a in baseline if a.startswith("--speculative")]
    assert [a for a in argv if not a.startswith("--speculative") and a not in
            ("EAGLE3", "/models/eagle3", "2", "4", "8")] == [a for a in baseline if a not in ("2", "4", "8")]
    assert seen_baseline["speculative_algorithm"] is None


def test_the_seeds_flag_is_named_with_the_version_that_rejects_it(lab, tmp_path):
    stack = stack_file(tmp_path, extra_args=["--cuda-graph-max-bs", "256"])
    assert "sglang 0.5.23 rejects the server command line: ambiguous option: --cuda-graph-max-bs" in \
        refusal(lab["v23"], stack)
    assert render(load(stack), lab["v9"])["argv"][-2:] == ["--cuda-graph-max-bs", "256"]


def test_an_unknown_flag_and_an_abbreviation_are_refused(lab, tmp_path):
    unknown = refusal(lab["v9"], stack_file(tmp_path, extra_args=["--no-such-flag"]))
    assert "sglang 0.5.9 rejects" in unknown and "--no-such-flag" in unknown
    short = refusal(lab["v9"], stack_file(tmp_path, extra_args=["--tp", "8"]))
    assert "sglang 0.5.9 takes --tp only as an abbreviation" in short
    assert "invalid int value: 'eight'" in refusal(lab["v23"], stack_file(tmp_path, extra_args=["--tp-size", "eight"]))


def test_the_api_key_is_a_reference_never_its_value(lab, tmp_path):
    env = {**os.environ, "SGLANG_API_KEY": "sk-secret-42"}
    shell = args(lab["v23"], stack_file(tmp_path), env=env)
    assert shell.returncode == 0, shell.stderr
    assert '--api-key "${SGLANG_API_KEY}"' in shell.stdout and "sk-secret-42" not in shell.stdout + shell.stderr
    argv = json.loads(args(lab["v23"], stack_file(tmp_path), "--json", env=env).stdout)["argv"]
    assert argv[-2:] == ["--api-key", "${SGLANG_API_KEY}"]
    # the shell line runs: bash expands the reference into the argv sglang parses
    expanded = subprocess.run(["bash", "-c", "printf '%s\\n' " + shell.stdout.split("launch_server", 1)[1]],
                              capture_output=True, text=True, env=env, check=False).stdout.split("\n")
    assert "sk-secret-42" in expanded and "/models/target" in expanded
    plain = json.loads(args(lab["v23"], stack_file(tmp_path), "--json").stdout)
    assert "--api-key" not in plain["argv"] and plain["api_key_env"] is None


H200_LOCK = REPO / "stacks" / "h200-sglang-0.5.17.lock"
# what sglang 0.5.17 needs beside the lab's 0.5.23 packages to import its argument handling (0.5.17 crashes at
# import with a transformers newer than its pin: DESIGN.md)
V17_WHEELS = ("sglang", "transformers", "tokenizers", "huggingface-hub")


@pytest.fixture(scope="module")
def v17(lab, tmp_path_factory) -> Path:
    """sglang 0.5.17 from the H200 stack's lock over the lab's packages: its wheels (built for Python 3.12) unpacked
    into a directory that a .pth file puts before the lab's site-packages, as the H200's venv sits over its machine's."""
    import zipfile

    from rig.python.lock import read
    from rig.python.wheelhouse import cached_path, fetch

    lock = read(H200_LOCK)
    wanted = [w for w in lock["wheels"] if w["name"] in V17_WHEELS]
    fetch({**lock, "wheels": wanted}, Path(CACHE))
    root = tmp_path_factory.mktemp("v17")
    unpacked = root / "site-0.5.17"
    for w in wanted:
        with zipfile.ZipFile(cached_path(Path(CACHE), w)) as wheel:
            wheel.extractall(unpacked)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    lab_site = next((lab["v23"] / "lib").glob("python3*/site-packages"))
    (site / "zz-over-lab.pth").write_text(f"{unpacked}\n{lab_site}\n")
    return venv


@pytest.mark.parametrize("version", ["v17", "v23"])
def test_every_adaptive_line_passes_sglangs_own_start_up_check_and_tunes_step_0_line_does(lab, v17, tmp_path,
                                                                                          version):
    """sglang refuses at start (not in its parser) a launch step outside the adaptive config's candidates: the H200's
    step-0 servers never started with {"1": [0]} at 1 step. rig runs that start-up hook of the installed sglang on
    every line it renders; tune's step-0 config passes it."""
    from rig.serving import adaptive
    from rig.serving.tune.variants import STEP0_SLOTS, eagle

    venv = v17 if version == "v17" else lab["v23"]
    stack = load(stack_file(tmp_path, tp=1, speculative_eagle_topk=1, flashinfer_allreduce_fusion=False,
                            torch_symm_mem=False))
    config = tmp_path / "step0.json"
    config.write_text(adaptive.render(STEP0_SLOTS))
    argv = render(eagle(stack, 1, str(config)), venv)["argv"]
    assert argv[argv.index("--speculative-num-steps") + 1] == "1" and "--speculative-adaptive" in argv
    config.write_text(adaptive.render({1: 0}))  # what the H200 run launched
    with pytest.raises(RigError, match=r"--speculative-num-steps=1 is not in the adaptive config candidate_steps "
                                       r"\[0\]"):
        render(eagle(stack, 1, str(config)), venv)
