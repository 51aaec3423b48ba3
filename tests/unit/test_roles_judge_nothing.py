"""Roles judge nothing: where a role needs an engine document read or a verdict on the host, the engine gives
it (behind the rig action), so that the judgement is made once, in rig, and tested there."""
import re

from conftest import REPO

# what a role must not do itself, and what answers it instead: the loader cache read and matched in Jinja; a
# lock read as plain JSON (which skips the check of its hash)
JUDGED_IN_RIG = {r"ldconfig -p": "rig doctor --layer libraries",
                 r"lookup\([^)]*file[^)]*\)\s*\|\s*from_json": "rig wheelhouse show: a lock read with its hash checked"}


def test_no_role_reads_the_loader_cache_or_a_lock_itself():
    found = [f"{path.relative_to(REPO)}: {pattern} ({instead})" for path in sorted((REPO / "roles").rglob("*.yml"))
             for pattern, instead in JUDGED_IN_RIG.items() if re.search(pattern, path.read_text())]
    assert found == []


def test_doctors_libraries_layer_alone_is_the_roles_verdict_and_says_it_in_one_line(tmp_path):
    import json

    from conftest import rig

    done = rig("doctor", "--cuda", "13.0.2", "--prefix", str(tmp_path), "--layer", "libraries", "--json")
    report = json.loads(done.stdout)
    assert {c["layer"] for c in report["checks"]} == {"libraries"}
    assert [c["name"] for c in report["checks"]] == ["libcudart.so.13", "libnvrtc.so.13", "libnvrtc-builtins.so.13.0"]
    assert report["ok"] == (done.returncode == 0) == all(c["status"] == "pass" for c in report["checks"])
    if not report["ok"]:  # the rig action's message of a failed task: each missing soname and its fix
        assert done.returncode == 1 and "libraries libnvrtc.so.13: libnvrtc.so.13 is not in the ldconfig cache" \
            in report["msg"] and "cuda_ldconfig role" in report["msg"]
