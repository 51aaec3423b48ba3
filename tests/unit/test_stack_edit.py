"""rig.stack.edit: a stack file's keys set in place, every comment and other line kept."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rig.core import RigError
from rig.core.documents import parse_yaml
from rig.stack.edit import with_keys

STACK = """# my stack: the box in rack 4
name: mine   # the name the fleet knows
server:
  model: /models/target   # the 8B
  # the draft we trained in March
  draft_model: /models/draft
  attention_backends:
    - fa3
    - triton
  speculative_num_steps: 2  # was 3 until the March test
bench:
  concurrency: [1, 16]
"""


def test_keys_are_set_in_place_and_every_comment_stays():
    edited = with_keys(STACK, "server", {"speculative_num_steps": 3, "attention_backends": ["triton"],
                                         "speculative_adaptive_config": "/etc/rig/adaptive.json"}, "stack.yml")
    assert "# my stack: the box in rack 4" in edited and "# the draft we trained in March" in edited
    assert "  speculative_num_steps: 3  # was 3 until the March test\n" in edited
    assert '  attention_backends: ["triton"]\n' in edited and "    - fa3" not in edited
    assert edited.index('speculative_adaptive_config: "/etc/rig/adaptive.json"') < edited.index("bench:")
    data = parse_yaml(edited, "edited")
    assert data["server"]["attention_backends"] == ["triton"] and data["bench"] == {"concurrency": [1, 16]}
    assert [line for line in edited.splitlines() if "server" not in line and "speculative" not in line
            and "attention" not in line and "fa3" not in line and "triton" not in line] == \
        [line for line in STACK.splitlines() if "speculative" not in line and "attention" not in line
         and "fa3" not in line and "triton" not in line and "server" not in line]


def test_a_key_already_at_its_value_keeps_its_spelling():
    """tune proposes the stack's own attention_backends where it changes nothing: no diff of the user's file."""
    edited = with_keys(STACK, "server", {"attention_backends": ["fa3", "triton"], "speculative_num_steps": 3},
                       "stack.yml")
    assert edited == STACK.replace("speculative_num_steps: 2", "speculative_num_steps: 3")
    # equal in Python, not the same value: true where 1 was written is an edit
    assert with_keys("server:\n  x: 1\n", "server", {"x": True}, "stack.yml") == "server:\n  x: true\n"


def test_a_stack_without_the_section_gets_it_at_the_end():
    edited = with_keys("name: mine\n# the end\n", "server", {"speculative_num_steps": 3}, "stack.yml")
    assert edited == 'name: mine\n# the end\nserver:\n  speculative_num_steps: 3\n'


def test_a_value_that_is_hostile_text_is_serialized_never_pasted():
    edited = with_keys(STACK, "server", {"speculative_adaptive_config": "x\n  model: /evil # y"}, "stack.yml")
    assert parse_yaml(edited, "edited")["server"]["model"] == "/models/target"


@pytest.mark.parametrize("text", ["name: a\nserver: {model: /m}\n", "name: a\nserver: [1]\n"])
def test_a_layout_it_cannot_edit_in_place_is_refused_and_said(text):
    with pytest.raises(RigError, match="server"):
        with_keys(text, "server", {"speculative_num_steps": 3}, "stack.yml")


def test_a_key_in_yamls_explicit_form_is_said_not_reported_as_given_twice():
    """`? speculative_num_steps` / `: 1` is the same key; the edit added a second and said "given twice"."""
    text = "name: a\nserver:\n  ? speculative_num_steps\n  : 1\n  port: 30000\n"
    with pytest.raises(RigError, match=r"stack.yml: line 3 writes a key of server in YAML's explicit form \(`\? key`\)"):
        with_keys(text, "server", {"speculative_num_steps": 3}, "stack.yml")


def test_a_list_written_at_its_keys_indent_is_replaced_whole():
    """PyYAML's own layout (yaml.safe_dump): a list's items at the indent of the key that holds them."""
    text = "server:\n  attention_backends:\n  - fa3\n  - triton\n  port: 30000\n"
    edited = with_keys(text, "server", {"attention_backends": ["triton"]}, "stack.yml")
    assert edited == 'server:\n  attention_backends: ["triton"]\n  port: 30000\n'


def test_the_comments_and_blank_lines_around_a_replaced_key_stay():
    text = ("server:\n  speculative_num_steps: 4  # it's old\n  # keep me: about port\n\n  port: 1\n\n"
            "# ---- bench settings\nbench:\n  seed: 1\n")
    edited = with_keys(text, "server", {"speculative_num_steps": 3, "max_running_requests": 256}, "stack.yml")
    assert edited == ("server:\n  speculative_num_steps: 3  # it's old\n  # keep me: about port\n\n  port: 1\n"
                      "  max_running_requests: 256\n\n# ---- bench settings\nbench:\n  seed: 1\n")


def test_a_crlf_file_stays_crlf_and_a_long_line_is_read_in_one_pass():
    edited = with_keys("server:\r\n  port: 1\r\n", "server", {"speculative_num_steps": 3}, "stack.yml")
    assert edited == "server:\r\n  port: 1\r\n  speculative_num_steps: 3\r\n"
    spaces = "server:\n  speculative_num_steps: 2" + " " * 200_000 + "\n"
    assert with_keys(spaces, "server", {"speculative_num_steps": 3}, "stack.yml") == \
        "server:\n  speculative_num_steps: 3\n"


@pytest.mark.parametrize("spelt", ['"speculative_num_steps"', "'speculative_num_steps'", "speculative_num_steps",
                                   '"speculative_num_steps" '])
def test_a_key_is_found_by_its_value_however_it_is_quoted(spelt):
    """A stack writing `"speculative_num_steps": 1` (quoted keys are YAML) got no proposal: the key was matched by
    its spelling, added a second time, and the edit refused as "given twice"."""
    text = f"name: t\nserver:\n  {spelt}: 1  # mine\n  tp: 1\n"
    edited = with_keys(text, "server", {"speculative_num_steps": 3}, "stack.yml")
    assert parse_yaml(edited, "edited")["server"] == {"speculative_num_steps": 3, "tp": 1}
    assert edited.count("speculative_num_steps") == 1 and "# mine" in edited


ENVIRONMENT = """name: t
environment:
  nccl_pcie_only: false
  vars:
    # the hold we measured in March
    RIG_FREE_OFF_HOLD: 64   # decode steps
    "HF_HOME": /data/hf  # the big disk
    OLD: x
server:
  tp: 1
"""


def test_a_mapping_is_edited_key_by_key_and_its_comments_stay():
    """tune's proposal rewrote environment.vars as one flow line and lost the user's comments inside it."""
    wanted = {"RIG_FREE_OFF_HOLD": 64, "HF_HOME": "/data/hf2", "RIG_FREE_OFF": "1"}
    edited = with_keys(ENVIRONMENT, "environment", {"vars": wanted}, "stack.yml")
    assert parse_yaml(edited, "edited")["environment"] == {"nccl_pcie_only": False, "vars": wanted}
    assert "    # the hold we measured in March\n    RIG_FREE_OFF_HOLD: 64   # decode steps\n" in edited
    assert '    "HF_HOME": "/data/hf2"  # the big disk\n' in edited
    assert '    RIG_FREE_OFF: "1"\nserver:' in edited and "OLD: x" not in edited
    assert edited.startswith("name: t\nenvironment:\n  nccl_pcie_only: false\n  vars:\n")


@given(st.dictionaries(st.sampled_from(["A", "B", "HF_HOME", "x y", "é", "1", "true", "#", "a: b"]),
                       st.one_of(st.text(max_size=8), st.integers(-5, 5)), max_size=5),
       st.dictionaries(st.sampled_from(["A", "B", "HF_HOME", "x y", "é", "1", "true", "#", "a: b"]),
                       st.one_of(st.text(max_size=8), st.integers(-5, 5)), min_size=1, max_size=5))
@settings(max_examples=150, deadline=None)
def test_any_nested_mapping_edit_gives_exactly_the_mapping_asked_for(before, after):
    """Whatever the block holds and is set to, the edit gives exactly that document or refuses; never another."""
    from rig.core.documents import dump_json

    lines = "".join(f"    {dump_json(k, 'k')}: {dump_json(v, 'v')}  # c\n" for k, v in before.items())
    text = f"environment:\n  vars:{' {}' if not before else ''}\n{lines}server:\n  tp: 1\n"
    try:
        edited = with_keys(text, "environment", {"vars": after}, "stack.yml")
    except RigError as exc:
        assert "edit it by hand" in str(exc) or "written" in str(exc)
        return
    assert parse_yaml(edited, "edited") == {"environment": {"vars": after}, "server": {"tp": 1}}
    kept = [k for k in before if k in after]
    assert edited.count("# c") >= len(kept)
