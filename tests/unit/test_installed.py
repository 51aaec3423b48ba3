"""rig installed from its wheel, away from the checkout: the patch set, the Dockerfile and the templates are
package data, so the engine bundle an installed rig builds carries the same patch set as the checkout's."""
import json
import subprocess
import sys
import zipfile

from harness.commands import rig, run
from harness.paths import REPO

PATCH_SET = sorted(p.stem for p in (REPO / "rig" / "patches" / "set").glob("*.yml"))


def test_an_installed_rig_builds_a_bundle_with_its_patch_set_and_reads_it(tmp_path):
    dist, site = tmp_path / "dist", tmp_path / "site"
    built = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)])
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = dist.glob("rig-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"rig/image/Dockerfile", "rig/templates/sitecustomize.py.j2", "rig/log_rules.yml"} <= set(names)
    # the scripts a venv's Python runs travel as package data (the patch status below runs one from the bundle)
    assert {f"rig/foreign/{p.name}" for p in (REPO / "rig" / "foreign").glob("*.py")} <= set(names)
    assert sorted(n.rsplit("/", 1)[1][:-4] for n in names if n.startswith("rig/patches/set/") and
                  n.endswith(".yml")) == PATCH_SET
    done = run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)])
    assert done.returncode == 0, done.stderr[-3000:]

    def installed(*args: str) -> subprocess.CompletedProcess:
        # the installed copy first on the path, the checkout's venv for the dependencies; run from elsewhere
        return run([sys.executable, *args], cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})

    where = installed("-c", "import rig; print(rig.__file__)")
    assert where.stdout.strip() == str(site / "rig" / "__init__.py"), where.stderr
    bundle = tmp_path / "rig.pyz"
    done = installed("-m", "rig", "plumbing", "bundle", "--json", "--output", str(bundle))
    assert done.returncode == 0 and json.loads(done.stdout)["changed"], done.stderr
    done = run([sys.executable, "-I", "-S", str(bundle), "patch", "status", "--json", "--python", sys.executable],
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(r["id"] for r in json.loads(done.stdout)["patches"]) == PATCH_SET


def test_an_empty_patch_set_is_an_error_that_names_the_fix(tmp_path):
    done = rig("patch", "status", "--python", sys.executable, "--patches", str(tmp_path))
    assert done.returncode == 2 and "a patch set is never empty" in done.stderr
