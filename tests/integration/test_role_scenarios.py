"""Each role's Molecule scenario: check, converge, idempotence, verify (testinfra)."""
import subprocess

import pytest
from harness.paths import BIN, REPO
from harness.plays import ansible_env

pytestmark = pytest.mark.box

ROLES = sorted(p.parents[2].name for p in (REPO / "roles").glob("*/molecule/default/molecule.yml"))


@pytest.mark.parametrize("role", ROLES)
def test_molecule_scenario(role, base_image):
    env = {**ansible_env(), "RIG_BASE_IMAGE": base_image, "PY_COLORS": "0", "NO_COLOR": "1"}
    done = subprocess.run([str(BIN / "molecule"), "test"], cwd=REPO / "roles" / role, env=env,
                          capture_output=True, text=True, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-8000:]
    # idempotence is a step of its own: a second converge must change nothing
    assert "idempotence" in out and "failed=1" not in out
