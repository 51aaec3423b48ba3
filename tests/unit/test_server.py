"""What the stack asks of the server, before any sglang is asked how to spell it."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.commands import rig
from harness.paths import REPO

from rig.core import RigError
from rig.core.escape import unit_exec
from rig.serving.server import health_gate, models, render, shell_line, wants
from rig.stack.derive import sized_for, with_server
from rig.stack.spec import load


def verify(unit) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, check=False)


def stack(**server) -> dict:
    data = load(REPO / "stacks" / "default.yml")
    data["server"].update({"model": "/m", "draft_model": "/d", **server})
    return data


def test_the_cuda_graph_is_the_servers_own_and_a_measuring_run_gives_it_explicitly():
    data = stack()
    data["bench"]["concurrency"] = [1, 4, 64]
    assert "cuda_graph_max_bs" not in dict(wants(data, baseline=False))  # the bench plan does not shape the line
    assert ("cuda_graph_max_bs", "128") in wants({**data, "server": {**data["server"], "cuda_graph_max_bs": 128}}, False)
    measured = sized_for(data, [1, 4, 64])
    assert ("cuda_graph_max_bs", "64") in wants(measured, False) and data["server"]["cuda_graph_max_bs"] == 0
    assert sized_for(with_server(data, cuda_graph_max_bs=128), [64])["server"]["cuda_graph_max_bs"] == 128
    with pytest.raises(RigError, match="cuda_graph_max_bs 32 is below the largest concurrency measured, 64"):
        sized_for(with_server(data, cuda_graph_max_bs=32), [1, 64])
    with pytest.raises(RigError, match="measure at 4096 or less"):  # no graph a stack could be proposed
        sized_for(data, [1, 5000])


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


HOSTILE = ["/models/100%Zfoo", "a b\"c\\d", "$HOME", "${PATH}", "100%", "x;y", "--flag=it's"]


def test_the_unit_line_is_serialized_by_systemds_rules(tmp_path):
    line = unit_exec(["/bin/echo", "--model-path", *HOSTILE, "--api-key", "${SGLANG_API_KEY}"], "argv",
                     {"${SGLANG_API_KEY}"})
    assert "%Z" not in line.replace("%%", "") and "$HOME" not in line.replace("$$", "")
    assert line.endswith("--api-key ${SGLANG_API_KEY}")  # the one reference systemd must expand
    assert '"a b\\"c\\\\d"' in line
    if shutil.which("systemd-analyze"):  # systemd's own parser: an unescaped %Z is an unknown specifier
        unit = tmp_path / "rig-test.service"
        unit.write_text(f"[Service]\nType=exec\nExecStart={line}\n")
        done = verify(unit)
        assert done.returncode == 0, done.stderr
        unit.write_text("[Service]\nType=exec\nExecStart=/bin/echo /models/100%Zfoo\n")
        bad = verify(unit)
        assert bad.returncode != 0  # the same path unescaped is refused: the escaping is what makes it valid


@pytest.mark.parametrize("value", ["127.0.0.1\n--api-key x", "m\rExecStartPre=+/bin/sh -c id", "a\0b"])
def test_a_control_character_never_reaches_the_unit(value):
    with pytest.raises(RigError, match="control character"):
        unit_exec(["/bin/echo", "--host", value], "argv")


def test_testmodel_names_the_generated_pair():
    assert models(stack(model="testmodel", draft_model="testmodel")["server"]) == (
        "/var/lib/rig/testmodel/target", "/var/lib/rig/testmodel/draft")
    with pytest.raises(RigError, match="drafts for the generated target only"):
        models(stack(model="/models/real", draft_model="testmodel")["server"])


def test_the_health_gate_is_serialized_like_the_command_line(tmp_path):
    gate = health_gate(stack(host="::", port=30001), "/opt/rig/rig.pyz", "/usr/bin/python3", "/var/log/100%Z.log", 1200)
    assert gate["exec_start_post"] == ("/usr/bin/python3 /opt/rig/rig.pyz smoke --health-only --url "
                                       "http://127.0.0.1:30001 --pid $MAINPID --start-timeout 1170 --log "
                                       '"/var/log/100%%Z.log" --api-key-env SGLANG_API_KEY')
    assert gate["standard_output"] == "append:/var/log/100%%Z.log"
    assert health_gate(stack(host="fd00::1"), "/e", "/p", "/l", 100)["health_url"] == "http://[fd00::1]:30000"
    if shutil.which("systemd-analyze"):
        unit = tmp_path / "rig-gate.service"
        unit.write_text(f"[Service]\nType=exec\nExecStart=/bin/true\nExecStartPost={gate['exec_start_post']}\n"
                        f"StandardOutput={gate['standard_output']}\n")
        done = verify(unit)
        assert "Unknown specifier" not in done.stderr and "%Z" not in done.stderr, done.stderr


@pytest.mark.parametrize("log, says", [("logs/x.log", "absolute path"), ("/var/log/a b.log", "without spaces"),
                                       ("/var/log/x\nExecStartPre=+/bin/id", "without spaces")])
def test_a_gate_path_systemd_would_misread_is_refused(log, says):
    with pytest.raises(RigError, match=says):
        health_gate(stack(), "/opt/rig/rig.pyz", "/usr/bin/python3", log, 1200)


def test_a_gate_python_may_be_a_program_systemd_finds():
    """python_stack points the engine at python3.12 on hosts that got the stack's Python from a repository."""
    gate = health_gate(stack(), "/opt/rig/rig.pyz", "python3.12", "/var/log/rig/s.log", 1200)
    assert gate["exec_start_post"].startswith("python3.12 /opt/rig/rig.pyz smoke --health-only")


def standin_venv(venv, sglang: bool = True, tree=REPO / "tests" / "data" / "sglang_standin"):
    """A venv whose sglang is the stand-in's (tests/data/sglang_standin, or a copy at TREE), or none."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    ours = [p for p in sys.path if p.endswith("site-packages")]
    (site / "standin.pth").write_text("\n".join([str(tree)] * sglang + ours))
    return venv


@pytest.fixture
def parsers():
    """The render's parser processes, stopped after the test (their venvs go with its tmp_path)."""
    from rig.serving import server

    yield server._PARSERS
    server.close_parsers()


def test_one_parser_process_renders_every_line_and_one_that_ended_is_started_again(tmp_path, parsers):
    """sglang loads once a process (12.5 CPU-seconds for 0.5.23), however many lines tune and prove render."""
    from rig.serving import server

    venv = standin_venv(tmp_path / "venv")
    python = venv / "bin" / "python"
    eagle = server.render(stack(), venv)
    first = server._PARSERS[python].proc
    baseline = server.render(stack(), venv, baseline=True)
    assert server._PARSERS[python].proc is first and first.poll() is None
    assert "--speculative-algorithm" in eagle["argv"] and "--speculative-algorithm" not in baseline["argv"]
    first.kill()
    first.wait()
    assert server.render(stack(), venv) == eagle and server._PARSERS[python].proc is not first


def test_what_the_parser_prints_is_never_taken_for_its_answer(tmp_path, parsers):
    """-h has argparse print its help where the answer was read: the help is not the answer (it is refused as
    a line sglang rejects), and the next render is answered with its own."""
    venv = standin_venv(tmp_path / "venv")
    with pytest.raises(RigError, match="rejects the server command line"):
        render(stack(extra_args=["-h"]), venv)
    argv = render(stack(), venv)["argv"]
    assert "--speculative-algorithm" in argv and "-h" not in argv


def test_the_parser_never_runs_sglangs_package_init(tmp_path, parsers):
    """sglang's __init__ is its frontend's API and transformers' patches (8 of the 11 CPU-seconds 0.5.23's
    server_args takes to import): the parser reads server_args without it."""
    tree = tmp_path / "standin"
    shutil.copytree(REPO / "tests" / "data" / "sglang_standin", tree, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "sglang" / "__init__.py").write_text("raise RuntimeError('the package init ran')\n")
    argv = render(stack(), standin_venv(tmp_path / "venv", tree=tree))["argv"]
    assert "--speculative-algorithm" in argv


def test_an_sglang_imported_at_start_up_is_kept_whole(tmp_path):
    from rig.core.proc import script

    venv = standin_venv(tmp_path / "venv")
    (next((venv / "lib").glob("python3*/site-packages")) / "zz-import.pth").write_text("import sglang\n")
    # the bare module sglang_bare makes has no docstring; the one imported whole has
    probe = script("sglang_bare") + "\nimport sys\nprint(sys.modules['sglang'].__doc__ is not None)\n"
    done = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"


def test_a_parser_that_cannot_load_says_why(tmp_path, parsers):
    venv = standin_venv(tmp_path / "venv", sglang=False)
    with pytest.raises(RigError, match=r"sglang's argument parser did not load in .*: ModuleNotFoundError: No "
                                       r"module named 'sglang'"):
        render(stack(), venv)


def adaptive_stack(config: Path) -> dict:
    return stack(speculative_eagle_topk=1, speculative_num_steps=3, speculative_num_draft_tokens=4,
                 speculative_adaptive_config=str(config))


def test_a_line_is_rendered_from_its_adaptive_configs_text_naming_the_path_it_will_have(tmp_path, parsers):
    """The sglang_server role renders the line before it copies the adaptive config to the host: the text is
    checked from a scratch copy (rig's reading, then sglang's own loader), the line names the host's path, and
    nothing is written there; a refusal names that path too."""
    from rig.serving import adaptive

    venv = standin_venv(tmp_path / "venv")
    host = tmp_path / "etc" / "sglang-server.adaptive.json"
    line = render(adaptive_stack(host), venv, config_text=adaptive.render({1: 3, 64: 0}))
    assert line["argv"][line["argv"].index("--speculative-adaptive-config") + 1] == str(host)
    assert f"--speculative-adaptive-config {host} " in line["exec_start"] and not host.parent.exists()
    with pytest.raises(RigError, match=rf"with {host}: --speculative-num-steps=3 is not in the adaptive config "
                                       r"candidate_steps \[0, 2\]"):
        render(adaptive_stack(host), venv, config_text=adaptive.render({1: 2, 64: 0}))
    with pytest.raises(RigError, match=rf"^{host}: not valid JSON"):
        render(adaptive_stack(host), venv, config_text="{not json")
    assert not host.parent.exists()


def test_server_adaptive_gives_a_regular_files_text_or_one_error_naming_it(tmp_path):
    """What the sglang_server role asks on the controller before it changes anything."""
    from rig.serving import adaptive

    config = tmp_path / "adaptive.json"
    config.write_text(adaptive.render({1: 3, 64: 0}))
    done = rig("server", "adaptive", str(config), "--steps", "3", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["text"] == config.read_text()
    assert json.loads(done.stdout)["slots"] == {"1": [3], "64": [0]}
    (tmp_path / "link.json").symlink_to(config)
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1]")
    for argv, says in [([str(tmp_path / "link.json")], "it is a link, and a link there is never followed"),
                       ([str(tmp_path / "bad.json")], "bad.json: not valid JSON"),
                       ([str(tmp_path / "list.json")], "an adaptive speculation config is a JSON object, got list"),
                       ([str(config), "--steps", "2"], "--speculative-num-steps=2 is not in the adaptive config "
                                                       "candidate_steps [0, 3]")]:
        refused = rig("server", "adaptive", *argv)
        assert refused.returncode == 2 and says in refused.stderr and refused.stdout == "", refused.stderr


def standin_with(tmp_path, server_args: str):
    """A stand-in venv whose server_args module runs SERVER_ARGS first (a banner, a hang)."""
    tree = tmp_path / "standin"
    shutil.copytree(REPO / "tests" / "data" / "sglang_standin", tree, ignore=shutil.ignore_patterns("__pycache__"))
    module = tree / "sglang" / "srt" / "server_args.py"
    head, future, rest = module.read_text().partition("from __future__ import annotations\n")
    module.write_text(head + future + server_args + "\n" + rest)
    return standin_venv(tmp_path / "venv", tree=tree)


def test_a_banner_printed_on_import_is_not_the_answer(tmp_path, parsers):
    """Packages print banners on import: the answer is read from a pipe of its own, never stdout."""
    venv = standin_with(tmp_path, "print('Welcome to sglang!', flush=True)")
    assert "--speculative-algorithm" in render(stack(), venv)["argv"]


def test_a_parser_that_writes_bytes_no_utf_8_decoder_takes_is_read_and_closed_once(tmp_path, parsers):
    """A child printing b'\\xff' made close() raise UnicodeDecodeError (a traceback after a run that passed), and
    a second close() then closed the answer pipe twice (EBADF)."""
    from rig.serving import server

    venv = standin_with(tmp_path, "import sys\nsys.stdout.buffer.write(b'\\xff\\n')\nsys.stdout.flush()")
    assert "--speculative-algorithm" in render(stack(), venv)["argv"]
    parser = server._PARSERS[venv / "bin" / "python"]
    assert parser.close() == "\ufffd" and parser.close() == ""


def test_a_parser_whose_import_hangs_is_one_error_within_its_deadline(tmp_path, parsers, monkeypatch):
    """readline() had no timeout: `rig server args` waited forever on a venv whose server_args never loads."""
    from rig.serving import server

    monkeypatch.setattr(server, "PARSER_DEADLINE", 2.0)
    venv = standin_with(tmp_path, "import sys, time\nprint('loading', file=sys.stderr, flush=True)\ntime.sleep(600)")
    began = time.monotonic()
    with pytest.raises(RigError, match=r"sglang's argument parser gave no answer within 2 s in .*python \(loading\); "
                                       r"see whether .* finishes"):
        render(stack(), venv)
    assert time.monotonic() - began < 30 and server._PARSERS[venv / "bin" / "python"].proc.poll() is not None


@pytest.mark.parametrize("answer, why", [
    ("{}", "version: is required"), ('{"version": "0.5.23"}', "options: is required"),
    ('{"version": "0.5.23", "options": [1]}', r"options\[0\]: expected str"), ("[1]", "it says seq None"),
    ("<html>", "not valid JSON"),
    ('{"version": "0.5.23", "options": [], "seq": 7}', "not to request 1 .it says seq 7."),  # another's number
])
def test_an_answer_of_the_wrong_shape_is_one_error_naming_the_parser(tmp_path, parsers, answer, why):
    """`{}` was exit 70 (KeyError: 'version'): every answer is held to its mode's schema, and to its turn."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"  # answers every request with ANSWER's lines, numbered as the request is
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\nfor line in sys.stdin:\n"
                    "    seq = json.loads(line)['seq']\n"
                    f"    for text in {answer!r}.splitlines():\n"
                    "        if text.startswith('{') and '\"seq\"' not in text:\n"
                    "            text = json.dumps({**json.loads(text), 'seq': seq})\n"
                    "        os.write(int(sys.argv[-1]), text.encode() + b'\\n')\n")
    fake.chmod(0o755)
    with pytest.raises(RigError, match=rf"sglang's argument parser's answer: .*{why}.*; see whether"):
        render(stack(), venv)


def test_a_second_line_to_one_request_is_never_taken_for_the_next_ones_answer(tmp_path):
    """A child that wrote two answers to its first request had its second taken for the answer to the next."""
    from rig.core.dialogue import Dialogue
    from rig.core.schema import Field

    child = tmp_path / "child.py"
    child.write_text("import json, os, sys\nfor line in sys.stdin:\n    seq = json.loads(line)['seq']\n"
                     "    for n in (seq, seq):\n        os.write(int(sys.argv[-1]), json.dumps({'n': 1, 'seq': n}).encode()"
                     " + b'\\n')\n")
    talk = Dialogue([sys.executable, str(child)], "the child", "here", "fix it", 10.0)
    spec = Field(dict, fields={"n": Field(int)})
    assert talk.ask({"q": 1}, spec) == {"n": 1}
    with pytest.raises(RigError, match=r"the child's answer: not to request 2 \(it says seq 1\), an answer out of turn"):
        talk.ask({"q": 2}, spec)
    assert talk.close() == ""
