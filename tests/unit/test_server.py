"""What the stack asks of the server, before any sglang is asked how to spell it."""
from __future__ import annotations

import pytest

from conftest import REPO, rig
from rig import RigError
from rig.server import shell_line, wants
from rig.stack import load


def stack(**server) -> dict:
    data = load(REPO / "stacks" / "default.yml")
    data["server"].update({"model": "/m", "draft_model": "/d", **server})
    return data


def test_the_cuda_graph_batch_follows_the_largest_bench_concurrency():
    data = stack()
    data["bench"]["concurrency"] = [1, 4, 64]
    assert ("cuda_graph_max_bs", "64") in wants(data, baseline=False)
    assert ("cuda_graph_max_bs", "128") in wants({**data, "server": {**data["server"], "cuda_graph_max_bs": 128}}, False)
    with pytest.raises(RigError, match="cuda_graph_max_bs 32 is below the largest bench concurrency 64"):
        wants({**data, "server": {**data["server"], "cuda_graph_max_bs": 32}}, False)


def test_missing_models_are_named():
    with pytest.raises(RigError, match="no server.model"):
        wants(stack(model=""), False)
    with pytest.raises(RigError, match="no server.draft_model for EAGLE-3"):
        wants(stack(draft_model=""), False)
    assert not [w for w, _ in wants(stack(draft_model=""), True) if w.startswith("--speculative")]


def test_the_shell_line_quotes_values_and_leaves_the_key_to_the_shell():
    line = shell_line(["/v/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/a b",
                       "--enable-torch-symm-mem", "--api-key", "${K}"], "K")
    assert line.splitlines() == ["/v/bin/python -m sglang.launch_server \\", "    --model-path '/models/a b' \\",
                                 "    --enable-torch-symm-mem \\", '    --api-key "${K}"']


def test_cli_errors_without_a_venv(tmp_path):
    done = rig("server", "args", "--venv", str(tmp_path))
    assert done.returncode == 2 and "no server.model" in done.stderr
    bad = rig("server", "args", "--stack-json", "{not json")
    assert bad.returncode == 2 and "--stack-json is not JSON" in bad.stderr
