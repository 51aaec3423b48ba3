"""`rig tune --check` names the free-off switches every server would inherit from rig's own environment, and
refuses one the stack would refuse, as the run does (issue 73, mechanism 2: a dry run looks at what the run
needs)."""
from __future__ import annotations

import json

from harness.standin import MODEL, listening
from harness.tune import tune


def test_check_names_a_switch_every_server_would_inherit(tune_case):
    stack, env = tune_case(*MODEL)
    done = tune(stack, tune_case.dir / "out", {**env, "RIG_FREE_OFF_CHECK": "1", "RIG_FREE_OFF_HOLD": "9"},
                "--check")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["inherited_env"] == {"RIG_FREE_OFF_CHECK": "1", "RIG_FREE_OFF_HOLD": "9"}
    assert "every server inherits RIG_FREE_OFF_CHECK=1 RIG_FREE_OFF_HOLD=9 from rig's own environment" in plan["msg"]
    assert not listening(tune_case.port) and not (tune_case.dir / "out").exists()


def test_a_switch_the_stack_would_refuse_is_refused_in_rigs_environment_too(tune_case):
    stack, env = tune_case(*MODEL)
    for name, value in (("RIG_FREE_OFF", "off"), ("RIG_FREE_OFF_CHECK", "yes"), ("RIG_FREE_OFF_HOLD", "-1"),
                        ("RIG_FREE_OFF_HOLDS", "9")):  # a misspelt switch the patch would ignore
        for check in (("--check",), ()):
            done = tune(stack, tune_case.dir / "out", {**env, name: value}, *check)
            assert done.returncode == 2, done.stderr
            assert done.stderr.startswith(f"rig: error: rig's own environment sets {name}: ") and \
                f"unset {name}" in done.stderr and done.stderr.count("\n") == 1, done.stderr
            assert not listening(tune_case.port) and not (tune_case.dir / "out").exists()
