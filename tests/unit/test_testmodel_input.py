"""rig testmodel refuses bad input before it writes anything."""
import sys
from pathlib import Path

import pytest
from harness.commands import rig


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
    from rig.serving.prove import given_model

    for part in ("target", "draft"):
        (tmp_path / part).mkdir()
    (tmp_path / "testmodel.json").write_text(json.dumps({"spec": spec}))
    with pytest.raises(RigError, match="holds no numerics test model") as refused:
        given_model(tmp_path, [1])
    assert says in str(refused.value)


@pytest.mark.parametrize("args, says", [
    (["--accept", "0"], "--accept 0.0: give the probability"),
    (["--accept", "1.5"], "--accept 1.5: give the probability"),
    (["--accept", "nan"], "--accept nan: give the probability"),
    (["--accept", "0.0001"], "below 0.001 the draft's token would no longer be the greedy one"),
    (["--accept", "0.5", "--draft", "random"], "--accept is for --kind serving with --draft agree"),
    (["--shape", "8b", "--kind", "numerics"], "--shape 8b is for --kind serving"),
    (["--shape", "8b", "--tp", "16"], "the 8b shape has 8 KV heads"),
])
def test_bad_shapes_and_acceptance_are_refused_before_anything_runs(tmp_path, args, says):
    done = rig("testmodel", "--out", str(tmp_path / "m"), "--python", sys.executable, *args)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert not (tmp_path / "m").exists()


def test_expected_accept_lengths_are_the_geometric_sums():
    from rig.serving.testmodel import expected_accept_lengths

    lengths = expected_accept_lengths(0.7)
    assert lengths["1"] == 1.7 and lengths["3"] == pytest.approx(1 + 0.7 + 0.49 + 0.343, abs=1e-4)
    assert expected_accept_lengths(1.0)["5"] == 6  # every draft accepted: steps + 1
    assert [lengths[str(k)] for k in range(1, 9)] == sorted(lengths[str(k)] for k in range(1, 9))


def test_a_builder_answer_without_its_keys_is_refused_before_out_is_touched(tmp_path):
    """Another Python may answer anything: rig checks the answer before it replaces --out (round two)."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho '{\"greedy_text\": 3}'\n")
    fake.chmod(0o755)
    out = tmp_path / "m"
    done = rig("testmodel", "--out", str(out), "--python", str(fake))
    assert done.returncode == 2 and "writing the test model" in done.stderr and "bytes" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


def test_tune_keeps_the_test_model_rigs_record_says_is_the_one_asked_for_and_writes_another(tmp_path):
    """An 8B shape is not rewritten to be compared: rig's record decides; another shape or acceptance is written."""
    import json

    from rig.serving.testmodel import ensure

    root = tmp_path / "testmodel"
    for part in ("target", "draft"):
        (root / part).mkdir(parents=True)
    spec = {"kind": "serving", "draft": "agree", "seed": 0, "heads": 32, "shape_name": "8b", "accept": 0.7}
    (root / "testmodel.json").write_text(json.dumps({"spec": spec, "shape": "8b", "accept": 0.7}))
    server = {"model": "testmodel", "testmodel_dir": str(root), "testmodel_shape": "8b", "testmodel_accept": 0.7,
              "tp": 1}
    kept = ensure(server, sys.executable)
    assert kept["changed"] is False and kept["shape"] == "8b" and kept["accept"] == 0.7
    assert ensure({**server, "model": "/models/llama"}, sys.executable) is None
    assert ensure({**server, "testmodel_accept": 0.5}, sys.executable, check=True)["changed"]
    assert "would write the 1b test model" in ensure({**server, "testmodel_shape": "1b"}, sys.executable, check=True)["msg"]


FAKE_BUILDER = """#!{python}
import json, os, sys
from pathlib import Path
out = Path(json.loads(sys.argv[-1])["out"])
for part in ("target", "draft"):
    (out / part).mkdir(parents=True)
    (out / part / "config.json").write_text("{{}}")
print(os.environ["FAKE_ANSWER"])
"""


@pytest.mark.parametrize("answer, says", [
    ({"t_probability": None}, "t_probability: is required"),  # was: moved into --out, then a TypeError
    ({"t_probability": 1.5}, "t_probability: 1.5 is out of range"),
])
def test_a_builder_answer_the_message_cannot_use_is_refused_before_out_is_touched(tmp_path, answer, says):
    """The builder wrote a model, but its answer lacks what rig reads: one clean error, --out as it was."""
    import json
    import os

    fake = tmp_path / "python"
    fake.write_text(FAKE_BUILDER.format(python=sys.executable))
    fake.chmod(0o755)
    out = tmp_path / "m"
    answer = {"bytes": 1000, "greedy_text": " the", "greedy_token": 5, **answer}
    done = rig("testmodel", "--out", str(out), "--python", str(fake), "--accept", "0.5",
               env={**os.environ, "FAKE_ANSWER": json.dumps(answer)})
    assert done.returncode == 2 and says in done.stderr and "writing the test model" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["python"]  # nothing staged is left


def test_a_whole_builder_answer_is_installed_and_rigs_record_stays_rigs(tmp_path):
    """The same fake builder with a whole answer: the model is moved into --out; a "spec" in the answer does not
    replace rig's own record (which decides whether the directory is rig's to replace)."""
    import json
    import os

    from rig.serving.testmodel import made_by_rig

    fake = tmp_path / "python"
    fake.write_text(FAKE_BUILDER.format(python=sys.executable))
    fake.chmod(0o755)
    out = tmp_path / "m"
    answer = {"bytes": 1000, "greedy_text": " the", "greedy_token": 5, "t_probability": 0.5012, "spec": "theirs"}
    done = rig("testmodel", "--out", str(out), "--python", str(fake), "--accept", "0.5", "--json",
               env={**os.environ, "FAKE_ANSWER": json.dumps(answer)})
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["changed"] is True and "probability 0.501 (asked 0.5)" in said["msg"]
    assert made_by_rig(out)["accept"] == 0.5 and sorted(p.name for p in out.iterdir()) == \
        ["draft", "target", "testmodel.json"]
