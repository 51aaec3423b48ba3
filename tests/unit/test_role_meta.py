"""A role's meta claims only the platforms the suite runs it on: Molecule and the boxes start from rig's base
image (scripts/base-image.sh), so that suite is the one platform claimed."""
import re

import yaml
from harness.paths import REPO


def test_every_role_claims_the_base_images_debian_suite_and_molecule_runs_that_image():
    suite = re.search(r"^SUITE=(\w+)$", (REPO / "scripts" / "base-image.sh").read_text(), re.M).group(1)
    roles = sorted(path.parent.parent.name for path in REPO.glob("roles/*/meta/main.yml"))
    claimed = {role: yaml.safe_load((REPO / "roles" / role / "meta" / "main.yml").read_text())["galaxy_info"]
               ["platforms"] for role in roles}
    assert claimed == {role: [{"name": "Debian", "versions": [suite]}] for role in roles}
    scenarios = sorted(REPO.glob("roles/*/molecule/*/molecule.yml"))
    assert scenarios, "no Molecule scenario found"
    images = {str(path.relative_to(REPO)): [p["image"] for p in yaml.safe_load(path.read_text())["platforms"]]
              for path in scenarios}
    assert images == {name: ["${RIG_BASE_IMAGE}"] for name in images}
