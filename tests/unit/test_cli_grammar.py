"""One CLI grammar, held over the whole click tree: every command has --json, every command that changes
something has --check (or says in EXCEPTIONS why not), result directories are --out DIR and single files
--output FILE, the stack is --stack (or $RIG_STACK, or the nearest stacks/default.yml), --venv says its default,
every path is typed, an option several commands take is declared once; and the behaviours around them: refusals
before anything is written, suggestions and hints, bare `rig`."""
import json
import re
import subprocess
import sys
import textwrap

import click
import pytest
from harness.commands import rig
from harness.paths import BIN, REPO

from rig.cli import COMMANDS, cli
from rig.cli.types import HostPath

# Commands that change nothing on the machine (they print, judge, measure into their own --out, or serve).
READS = {"stack show", "stack vars", "validate", "cuda list", "cuda ldconfig-conf", "wheelhouse show",
         "wheelhouse serve", "wheelhouse route", "venv verify", "wheels plan", "env show", "patch status",
         "doctor", "audit", "machine facts", "machine probe", "server args", "server adaptive", "smoke", "bench",
         "image verify", "image sbom", "upgrade plan", "upgrade previous", "plumbing tool",
         "fleet summary"}  # writes only its table, beside the reports it reads
# Commands that change something and have no --check, each with the reason.
EXCEPTIONS = {
    "lock": "--verify is its dry run: it says whether the lock is current and writes nothing",
    "wheels build": "`rig wheels plan` is its dry run: it says whether the built wheel is already kept",
}
RESULT_DIRS = {"bench", "tune", "prove", "machine probe", "testmodel"}


def leaves(group: click.Group = cli, path: str = "") -> dict[str, click.Command]:
    """Every command users see, by its path under `rig`."""
    ctx = click.Context(group)
    found = {}
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        where = f"{path} {name}".strip()
        found.update(leaves(command, where) if isinstance(command, click.Group) else {where: command})
    return found


def options(command: click.Command) -> dict[str, click.Option]:
    return {opt: p for p in command.params if isinstance(p, click.Option) and not p.hidden for opt in p.opts}


COMMAND_TREE = leaves()


def test_the_tree_is_whole_and_every_command_prints_json():
    assert len(COMMAND_TREE) > 40 and {"stack show", "prove", "plumbing bundle", "machine probe"} <= set(COMMAND_TREE)
    assert [name for name, command in COMMAND_TREE.items() if "--json" not in options(command)] == []


def test_every_command_that_changes_something_has_check_or_says_why_not():
    missing = [name for name, command in COMMAND_TREE.items()
               if name not in READS and name not in EXCEPTIONS and "--check" not in options(command)]
    assert missing == []
    assert set(EXCEPTIONS) <= set(COMMAND_TREE) and set(READS) <= set(COMMAND_TREE)
    stale = [name for name in EXCEPTIONS if "--check" in options(COMMAND_TREE[name])]
    assert stale == []  # an exception that has --check now is no exception: take it off the list


def test_result_directories_are_out_dir_and_single_files_are_output_file():
    for name, command in COMMAND_TREE.items():
        opts = options(command)
        if name in RESULT_DIRS:
            assert "--out" in opts, name
        if "--out" in opts:
            assert isinstance(opts["--out"].type, click.Path) and not opts["--out"].type.file_okay, name
            assert opts["--out"].metavar == "DIR", name
        if "--output" in opts:
            assert isinstance(opts["--output"].type, click.Path) and not opts["--output"].type.dir_okay, name


def test_the_stack_is_one_option_from_the_environment_too_and_venv_says_its_default():
    for name, command in COMMAND_TREE.items():
        for param in command.params:
            if param.name == "stack_path":
                assert param.opts == ["--stack"] and param.envvar == "RIG_STACK", name
            if param.name == "venv_path":
                assert param.opts == ["--venv"], name
                assert "Default: the stack's `venv` key." in param.help or "Without it:" in param.help, name
        assert not [p for p in command.params if isinstance(p, click.Argument) and p.name == "stack_path"], name


def test_help_lists_every_command_in_the_table_order_without_importing_one():
    listed = [e.name for e in COMMANDS if not e.renamed]
    out = rig("--help").stdout
    assert [line.split()[0] for line in out.split("Commands:\n")[1].splitlines() if line.startswith("  ")
            and not line.startswith("    ")] == listed
    assert listed[:3] == ["stack", "lock", "validate"] and listed[-1] == "plumbing"
    code = "import sys; from rig.cli import main\ntry: main(['--help'])\nexcept SystemExit: pass\n" \
           "print(sorted(m for m in sys.modules if m.startswith('rig.cli.') and m not in ('rig.cli.common', " \
           "'rig.cli.types')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_bare_rig_prints_its_help_and_exits_0_and_a_misspelt_command_or_choice_is_suggested():
    bare = rig()
    assert bare.returncode == 0 and bare.stdout.startswith("Usage: rig") and bare.stderr == ""
    done = rig("proove")
    assert done.returncode == 2 and "did you mean `rig prove`?" in done.stderr
    assert "probe" not in done.stderr and "((" not in done.stderr and "))" not in done.stderr
    done = rig("prove", "--skip", "dcotor")
    assert done.returncode == 2 and "did you mean doctor?" in done.stderr


def test_a_mode_refuses_options_it_would_ignore(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("nothing\n")
    done = rig("doctor", "--log", str(log), "--stack", "missing.yml")
    assert done.returncode == 2 and "--stack has no effect with --log" in done.stderr
    assert rig("doctor", "--log", str(log), "--json", env={"RIG_STACK": "missing.yml", "PATH": ""}).returncode == 0


def test_the_stack_comes_from_the_option_the_environment_or_the_nearest_stacks_dir(tmp_path):
    other = REPO / "stacks" / "cuda-13.0.yml"
    shown = lambda *args, **kw: json.loads(rig("stack", "show", "--json", *args, **kw).stdout)["name"]  # noqa: E731
    default = shown()
    assert shown("--stack", str(other)) != default
    assert shown(env={"RIG_STACK": str(other)}) == shown("--stack", str(other))
    below = subprocess.run([str(BIN / "rig"), "stack", "show", "--json"], cwd=REPO / "rig" / "cli",
                           capture_output=True, text=True, check=True)
    assert json.loads(below.stdout)["name"] == default  # found walking up, as cargo finds Cargo.toml
    nowhere = subprocess.run([str(BIN / "rig"), "stack", "show"], cwd=tmp_path, capture_output=True, text=True,
                             check=False)
    assert nowhere.returncode == 2 and "rig: error: no stack: no stacks/default.yml in" in nowhere.stderr
    assert nowhere.stderr.splitlines()[-1] == "rig: hint: give --stack FILE or set RIG_STACK"
    assert str(REPO / "stacks" / "default.yml") in rig("lock", "--help").stdout  # --help names the default
    old = rig("stack", "show", "--json", str(other))  # the old positional, for one release
    assert old.returncode == 0 and json.loads(old.stdout)["name"] == shown("--stack", str(other))
    assert "is now `--stack FILE`; the old spelling is removed in rig 0.2.0" in old.stderr
    both = rig("stack", "show", "--stack", str(other), str(other))
    assert both.returncode == 2 and "give the stack once" in both.stderr


@pytest.mark.parametrize("args", [
    ["tune", "--stack", str(REPO / "stacks" / "h200-sglang-0.5.17.yml"), "--venv", "/nonexistent/venv"],
    ["bench", "--url", "http://127.0.0.1:9"],
])
def test_a_run_refused_before_it_starts_writes_nothing(tmp_path, args):
    done = rig(*args, "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and done.stderr.startswith("rig: error: ")
    assert not (tmp_path / "out").exists()


def test_dry_runs_change_nothing(tmp_path):
    out = tmp_path / "engine" / "rig.pyz"
    done = rig("plumbing", "bundle", "--check", "--json", "--output", str(out))
    assert json.loads(done.stdout)["changed"] is True and not (tmp_path / "engine").exists()


def test_prove_steps_are_checks_its_junit_lists_them_and_the_fleet_summary_reads_them(tmp_path):
    from dataclasses import asdict
    from xml.etree import ElementTree

    from rig.core import RigError
    from rig.core.check import Check, Runner, junit
    from rig.serving.fleet import summary

    runner = Runner("prove")
    runner.run("doctor", lambda c: None)
    runner.skip("probe", "no GPU is visible")
    runner.run("testmodel", lambda c: (_ for _ in ()).throw(RigError("no torch in the venv", hint="install the lock")))
    steps = [asdict(c) for c in runner.checks]
    assert [s["status"] for s in steps] == ["pass", "skip", "fail"] and not runner.ok
    assert (steps[2]["detail"], steps[2]["fix"]) == ("no torch in the venv", "install the lock")  # the hint: its fix
    cases = ElementTree.fromstring(junit([Check(**s) for s in steps], "rig prove host")).findall(".//testcase")
    assert [(c.find("failure") is not None, c.find("skipped") is not None) for c in cases] == \
        [(False, False), (False, True), (True, False)]
    assert cases[2].find("failure").get("message") == "no torch in the venv" and cases[0].get("time") is not None
    assert cases[2].find("failure").text.splitlines()[-1] == "fix: install the lock"
    (tmp_path / "host1").mkdir()
    (tmp_path / "host1" / "prove.json").write_text(json.dumps({"ok": False, "steps": steps}))
    table = summary(tmp_path)
    assert table["ok"] is False and table["hosts"][0]["failed"] == ["testmodel"]


def test_the_readme_command_table_is_the_click_tree():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "readme_tables.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    readme = (REPO / "README.md").read_text()
    assert all(f"`rig {name} " in readme for name in COMMAND_TREE)


def groups(group: click.Group = cli, path: str = "") -> dict[str, click.Group]:
    """Every group users see (the root as ""), by its path under `rig`."""
    ctx = click.Context(group)
    found = {path: group}
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group) and not command.hidden:
            found.update(groups(command, f"{path} {name}".strip()))
    return found


def test_a_misspelt_subcommand_is_answered_in_rigs_voice_in_every_group():
    from rig.cli.common import RigGroup

    tree = groups()
    assert len(tree) > 10 and all(isinstance(g, RigGroup) for g in tree.values()), \
        [p for p, g in tree.items() if not isinstance(g, RigGroup)]
    for path, group in tree.items():
        shown = sorted(n for n in group.list_commands(click.Context(group))
                       if not group.get_command(click.Context(group), n).hidden)
        typo = shown[0][:-1] + "x" if len(shown[0]) > 3 else shown[0] + "xx"  # one letter off the first
        done = rig(*path.split(), typo)
        where = f" in `rig {path}`" if path else ""
        assert done.returncode == 2 and done.stderr.startswith(f"rig: error: no command {typo!r}{where}"), done.stderr
        if len(shown[0]) > 3:
            assert f"did you mean `rig {path + ' ' if path else ''}{shown[0]}`" in done.stderr, done.stderr


@pytest.mark.parametrize("args, said, hint", [
    (("stack", "show", "--json", "--stack", "/nonexistent/stack.yml"), "cannot read stack file /nonexistent/stack.yml",
     None),
    (("stack", "shwo", "--json"), "no command 'shwo' in `rig stack`", "did you mean `rig stack show`?"),
    (("bench", "--json", "--rounds", "x"), "--rounds 'x' is not a whole number", "give a whole number in ASCII "
     "digits, e.g. 12"),
    (("stack", "show", "--json", "--stak", "x"), "No such option '--stak'", "see `rig stack show --help`"),
])
def test_under_json_an_error_is_one_json_object_on_stdout_too_its_hint_apart(args, said, hint):
    """The remedy is a line of its own after the error, as uv prints it, and its own key under --json."""
    done = rig(*args)
    answer = json.loads(done.stdout)
    assert done.returncode == answer["exit"] == 2 and said in answer["error"] and answer["hint"] == hint
    assert set(answer) == {"error", "hint", "exit"} and (hint is None or hint not in answer["error"])
    assert done.stderr.splitlines()[-1] == (f"rig: hint: {hint}" if hint else f"rig: error: {answer['error']}")


def test_stack_show_says_which_file_it_read_and_where_a_link_leads():
    done = rig("stack", "show", "--stack", str(REPO / "stacks" / "default.yml"))
    target = (REPO / "stacks" / "default.yml").resolve()
    assert done.returncode == 0 and f"(a link to {target})" in done.stderr


# A parameter says what it takes: a type (a path, a number, a choice, a URL), or for free text a metavar naming
# what the text is (VERSION, SHA256, NAME). A metavar that names a path (FILE, DIR, PATH, or a part of one: URL_OR_DIR)
# is a typed path: click.Path here, so a file given for a directory is refused as the line is read and --help and
# completion know; HostPath for a path on the target host, whose form alone is checked.
PATH_METAVAR = re.compile(r"(^|_)(FILE|DIR|PATH)(_|$)")


def test_every_parameter_says_what_it_takes_and_every_path_is_typed():
    plain, untyped, paths = [], [], set()
    for name, command in COMMAND_TREE.items():
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            where = f"{name} {param.opts[0] if isinstance(param, click.Option) else param.human_readable_name}"
            typed = isinstance(param.type, (click.Path, HostPath))
            paths |= {where} if typed else set()
            if isinstance(param.type, click.types.StringParamType) and not param.metavar:
                plain.append(where)  # text that does not say what it is: a path, or a version, a name...?
            if param.metavar and PATH_METAVAR.search(param.metavar) and not typed:
                untyped.append(where)
    assert plain == [] and untyped == []
    # the paths the issue named among them, each typed now
    assert {"patch status --python", "testmodel --python", "wheels stage --root", "cuda install --source",
            "wheels build --cuda-home", "wheels export DEST", "venv install --find-links", "server args --gate-engine",
            "wheels build SOURCE", "venv add --wheelhouse"} <= paths


@pytest.mark.parametrize("args", [
    ["server", "args", "--gate-engine", "engine/rig.pyz"],
    ["server", "args", "--gate-engine", "/opt/rig/../rig.pyz"],
    ["server", "args", "--gate-python", "/usr/bin//python3"],
    ["server", "args", "--gate-python", "bin/python3"],  # a program's bare name has no slash
    ["wheels", "stage", str(REPO), "--root", "/srv/build/"],
])
def test_a_path_on_the_target_host_must_be_absolute_and_clean_and_says_so_before_anything_runs(args):
    done = rig(*args, "--json")
    answer = json.loads(done.stdout)
    assert done.returncode == 2 and "is not an absolute, clean path" in answer["error"]
    assert answer["hint"].startswith("give the path as that host sees it"), answer


def test_a_path_on_the_target_host_is_not_looked_for_here(tmp_path):
    (tmp_path / "log").mkdir()  # a directory here, where the host's log file is named: nothing here is looked at
    line = ["--gate-engine", "/nonexistent/engine/rig.pyz", "--log", str(tmp_path / "log"), "--gate-python",
            "python3.12"]  # a program may be a name the host's PATH finds
    params = COMMAND_TREE["server args"].make_context("args", line).params
    assert (params["gate_engine"], params["log_path"], params["gate_python"]) == \
        ("/nonexistent/engine/rig.pyz", str(tmp_path / "log"), "python3.12")


def test_an_option_several_commands_take_is_declared_once():
    """As pip's cmdoptions: every option two commands take comes from one click.option call (a decorator in
    rig.cli.common), so its type, metavar and meaning cannot drift apart between them."""
    code = textwrap.dedent("""
        import collections, json, sys
        import click
        real = click.option

        def option(*decls, **attrs):  # each option remembers the line that declared it
            caller = sys._getframe(1)
            site, decorate = f"{caller.f_code.co_filename}:{caller.f_lineno}", real(*decls, **attrs)

            def apply(f):
                f = decorate(f)
                (f.params if isinstance(f, click.Command) else f.__click_params__)[-1].site = site
                return f
            return apply

        click.option = option
        from rig.cli import cli

        sites, users = collections.defaultdict(set), collections.defaultdict(set)
        def walk(group, path):
            ctx = click.Context(group)
            for name in group.list_commands(ctx):
                command = group.get_command(ctx, name)
                if command.hidden:
                    continue
                if isinstance(command, click.Group):
                    walk(command, f"{path} {name}")
                    continue
                for param in command.params:
                    if isinstance(param, click.Option) and not param.hidden:
                        sites[param.opts[0]].add(param.site)
                        users[param.opts[0]].add(f"{path} {name}")
        walk(cli, "rig")
        print(json.dumps({o: sorted(sites[o]) for o in sites if len(users[o]) > 1}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    declared = json.loads(done.stdout)
    assert {"--find-links", "--python", "--cuda-home", "--root", "--log", "--max-tokens"} <= set(declared)
    assert {name: where for name, where in declared.items() if len(where) > 1} == {}


def test_a_file_where_a_directory_belongs_is_refused_as_the_line_is_read(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    done = rig("cuda", "list", "--prefix", str(a_file))
    assert done.returncode == 2 and f"Directory '{a_file}' is a file" in done.stderr
    done = rig("stack", "show", "--stack", str(tmp_path))
    assert done.returncode == 2 and f"File '{tmp_path}' is a directory" in done.stderr


def test_every_command_under_json_answers_a_bad_line_with_one_json_error_on_stdout():
    """The tree walked: each command given an option it does not have, under --json."""
    wrong = []
    for name in COMMAND_TREE:
        done = rig(*name.split(), "--json", "--no-such-option")
        try:
            answer = json.loads(done.stdout)
        except ValueError:
            answer = None
        if not (done.returncode == 2 and isinstance(answer, dict) and set(answer) == {"error", "hint", "exit"}
                and answer["exit"] == 2 and "--no-such-option" in answer["error"]):
            wrong.append(f"{name}: exit {done.returncode}, stdout {done.stdout[:80]!r}")
    assert wrong == []


def test_one_name_per_timeout():
    """A wait is a start, a read or a whole request: no other spelling of a timeout option in the tree."""
    names = {opt for command in COMMAND_TREE.values() for param in command.params if isinstance(param, click.Option)
             for opt in param.opts if "timeout" in opt}
    assert names == {"--start-timeout", "--timeout", "--read-timeout", "--request-timeout"}
    smoke = {param.name: param for param in COMMAND_TREE["smoke"].params}["start_timeout"]
    assert smoke.opts == ["--start-timeout"] and smoke.old == "--timeout"  # its old name, read until its release


def test_a_required_out_with_no_default_is_asked_for():
    done = rig("testmodel", "--python", sys.executable)
    assert done.returncode == 2 and "Missing option '--out'" in done.stderr


@pytest.mark.parametrize("stop, said, code", [("terminated", "rig: terminated", 128 + 15),
                                              ("interrupted", "rig: interrupted", 130)])
def test_under_json_a_stopped_run_still_answers_one_json_object(monkeypatch, capsys, stop, said, code):
    """SIGTERM under --json left stdout empty: a machine reading it got nothing to parse."""
    import signal

    import rig.cli as boundary

    def stopped(**_):
        raise boundary.Terminated(signal.SIGTERM) if stop == "terminated" else KeyboardInterrupt

    monkeypatch.setattr(signal, "signal", lambda *_: None)  # this test process keeps its own handlers
    monkeypatch.setattr(boundary, "cli", stopped)
    with pytest.raises(SystemExit) as done:
        boundary.main(["stack", "show", "--json"])
    out, err = capsys.readouterr()
    assert done.value.code == code and err.strip() == said
    assert json.loads(out) == {"error": stop, "hint": None, "exit": code}
