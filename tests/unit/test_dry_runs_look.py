"""--check runs the same preconditions as the real run, only the actions skipped (issue 73, mechanism 2): a dry
run that says "would run" where the run would fail on its input says nothing."""
from __future__ import annotations

import json

import pytest

from rig.core import RigError
from rig.serving import prove
from rig.stack.spec import validate

STACK = validate({"name": "t", "cuda": {"version": "13.0.2"}, "venv": "/nonexistent/venv",
                  "server": {"model": "/m", "draft_model": "/d", "tp": 2}})


@pytest.fixture
def no_servers(monkeypatch):
    """The servers' lines without a venv: what --check prints of them is not what these tests look at."""
    monkeypatch.setattr(prove, "plan", lambda *args: {})


def given(tmp_path, kind: str | None, heads: int = 8):
    """A model directory as rig's testmodel leaves it (its record and both trees), of KIND (None: no record)."""
    models = tmp_path / "models"
    for part in ("target", "draft"):
        (models / part).mkdir(parents=True)
    if kind:
        spec = {"kind": kind, "heads": heads, "draft": "x", "seed": 0}
        (models / "testmodel.json").write_text(json.dumps({"spec": spec}))
    return models


@pytest.mark.parametrize("kind, heads, said", [(None, 8, "no testmodel.json of rig's"),
                                               ("serving", 8, "says kind 'serving'"),
                                               ("numerics", 3, "heads do not split over TP 2")])
def test_prove_check_refuses_the_given_model_the_run_would_refuse(tmp_path, no_servers, kind, heads, said):
    models = given(tmp_path, kind, heads)
    with pytest.raises(RigError, match=said):
        prove.run(STACK, "stack.yml", "/nonexistent/venv", tmp_path / "out", None, ("testmodel",), models, check=True)
    assert not (tmp_path / "out").exists()


def test_prove_check_names_the_given_model_it_looked_at(tmp_path, no_servers):
    models = given(tmp_path, "numerics")
    done = prove.run(STACK, "stack.yml", "/nonexistent/venv", tmp_path / "out", None, ("testmodel",), models,
                     check=True)
    assert done["msg"].startswith(f"{models}: rig's numerics test model") and "would run" in done["msg"]


def test_prove_check_names_the_switches_every_server_would_inherit(tmp_path, no_servers, monkeypatch):
    monkeypatch.setenv("RIG_FREE_OFF_DRAFT", "extend")
    done = prove.run(STACK, "stack.yml", "/nonexistent/venv", tmp_path / "out", None, (), tmp_path / "m", check=True)
    assert done["inherited_env"] == {"RIG_FREE_OFF_DRAFT": "extend"}
    assert done["msg"].startswith("every server inherits RIG_FREE_OFF_DRAFT=extend from rig's own environment")
    monkeypatch.setenv("RIG_FREE_OFF_DRAFT", "Ingest")
    with pytest.raises(RigError, match="rig's own environment sets RIG_FREE_OFF_DRAFT: 'Ingest' is not one of"):
        prove.run(STACK, "stack.yml", "/nonexistent/venv", tmp_path / "out", None, (), tmp_path / "m", check=True)
    assert not (tmp_path / "out").exists() and not (tmp_path / "m").exists()


@pytest.mark.parametrize("value", ["yes", "true", "", " 1"])
def test_the_stack_takes_only_the_check_switchs_documented_values(value):
    """The patch reads RIG_FREE_OFF_CHECK == "1": any other value was a check the user asked for and never got."""
    with pytest.raises(RigError, match="RIG_FREE_OFF_CHECK: .* is not one of its values; give one of: 0, 1"):
        validate({"name": "t", "cuda": {"version": "13.0.2"}, "environment": {"vars": {"RIG_FREE_OFF_CHECK": value}}})


def test_an_inherited_value_forges_no_line(tmp_path, no_servers, monkeypatch):
    monkeypatch.setenv("RIG_FREE_OFF_DRAFT", "x\nrig: error: forged\x1b[2J")
    with pytest.raises(RigError) as refused:
        prove.run(STACK, "stack.yml", "/nonexistent/venv", tmp_path / "out", None, (), tmp_path / "m", check=True)
    said = str(refused.value)
    assert "RIG_FREE_OFF_DRAFT: 'x\\nrig: error: forged\\x1b[2J' is not one of its values" in said
    assert "\n" not in said and "\x1b" not in said
