"""rig testmodel refuses bad input before it writes anything."""
import sys
from pathlib import Path

import pytest
from conftest import rig


@pytest.mark.parametrize("args, says", [
    (["--tp", "3"], "--tp 3: give a power of two"),
    (["--context", "10"], "--context 10: give a context length"),
    (["--python", "/nonexistent/python"], "/nonexistent/python does not exist"),
])
def test_bad_options_are_refused(tmp_path, args, says):
    done = rig("testmodel", "--out", str(tmp_path / "m"), "--python", sys.executable, *args)
    assert done.returncode == 2 and says in done.stderr
    assert not (tmp_path / "m").exists()


def test_a_directory_of_other_files_is_never_overwritten(tmp_path):
    (tmp_path / "weights.bin").write_text("someone's model")
    done = rig("testmodel", "--out", str(tmp_path), "--python", sys.executable)
    assert done.returncode == 2 and "not a rig test model" in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["weights.bin"]
    a_file = tmp_path / "weights.bin"
    assert "is a file" in rig("testmodel", "--out", str(a_file), "--python", sys.executable).stderr


def test_an_interpreter_without_torch_fails_cleanly_and_leaves_nothing(tmp_path):
    """rig's own interpreter has no torch: one clean error, no scratch directory left beside --out."""
    done = rig("testmodel", "--out", str(tmp_path / "m"), "--python", sys.executable)
    assert done.returncode == 2
    assert "rig testmodel:" in done.stderr and "No module named 'torch'" in done.stderr
    assert "Traceback" not in done.stderr.split("rig: error:")[0]
    assert list(Path(tmp_path).iterdir()) == []


@pytest.mark.parametrize("marker", ["", "{}", '{"spec": "x"}', "[1]"])
def test_a_testmodel_json_rig_did_not_write_does_not_make_the_directory_rigs(tmp_path, marker):
    """Replacing a test model replaces the whole tree: an empty or foreign testmodel.json beside someone's
    files must not pass for rig's record (the attack's case: their files were deleted)."""
    (tmp_path / "weights.bin").write_text("someone's model")
    (tmp_path / "testmodel.json").write_text(marker)
    done = rig("testmodel", "--out", str(tmp_path), "--python", sys.executable)
    assert done.returncode == 2 and "not a rig test model" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["testmodel.json", "weights.bin"]


@pytest.mark.parametrize("spec, says", [
    ({"draft": "x", "seed": 0, "heads": 4}, "says kind None"),  # rig's record in shape, but no kind
    ({"kind": "serving", "draft": "agree", "seed": 0, "heads": 8}, "says kind 'serving'"),
    ({"kind": "numerics"}, "no testmodel.json of rig's")])  # not rig's record: no draft, seed, heads
def test_prove_takes_a_given_model_only_when_rigs_record_says_numerics(tmp_path, spec, says):
    import json

    from rig.core import RigError
    from rig.serving.prove import Step, _given_model

    for part in ("target", "draft"):
        (tmp_path / part).mkdir()
    (tmp_path / "testmodel.json").write_text(json.dumps({"spec": spec}))
    with pytest.raises(RigError, match="holds no numerics test model") as refused:
        _given_model(tmp_path, [1], Step("testmodel (given)"))
    assert says in str(refused.value)
