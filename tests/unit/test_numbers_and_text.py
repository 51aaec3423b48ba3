"""Hostile numbers and text, fuzzed: whatever a document, an answer or a log holds, rig reads a bounded
finite number or says which file and what to do; what it writes (JSON, markdown, the terminal, a unit)
holds no row, directive, escape or non-finite number that input put there."""
import json
import math
import re

import pytest
from harness.commands import rig
from harness.paths import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

from rig.core import RigError, numbers
from rig.core.documents import dump_json, parse_json, parse_yaml
from rig.core.escape import terminal, unit_exec, unit_text
from rig.core.markdown import table
from rig.serving.server import _render, wants
from rig.stack.spec import load

FUZZ = settings(max_examples=150, deadline=None)
DIGITS = st.integers(1, 6000).flatmap(lambda n: st.integers(0, 9).map(lambda d: str(d % 9 + 1) + "7" * (n - 1)))


@FUZZ
@given(digits=DIGITS, sign=st.sampled_from(["", "-"]), where=st.sampled_from(["value", "key", "list"]))
def test_an_integer_of_any_length_in_yaml_or_json_is_read_or_named_with_the_fix(digits, sign, where):
    text = sign + digits
    yaml_doc = {"value": f"a: {text}\n", "key": f"{text}: a\n", "list": f"a: [1, {text}]\n"}[where]
    json_doc = {"value": f'{{"a": {text}}}', "key": f'{{"a": [{text}]}}', "list": f"[1, {text}]"}[where]
    for parse, doc, source in ((parse_yaml, yaml_doc, "s.yml"), (parse_json, json_doc, "r.json")):
        if len(text) <= numbers.MAX_CHARS:  # a document's number is bounded in length; its field bounds its value
            assert str(int(text)) in json.dumps(parse(doc, source))
            continue
        with pytest.raises(RigError) as caught:
            parse(doc, source)
        said = str(caught.value)  # a plain YAML key past 1024 characters is not YAML at all
        assert said.startswith(source) and ("smaller" in said or "not valid YAML" in said and where == "key")


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"])
def test_json_without_a_finite_number_is_refused(text):
    with pytest.raises(RigError, match=r"^r\.json: "):
        parse_json(f'{{"accept_length": {text}}}', "r.json")


# Real data past 10^18 in fields rig never reads: a Kineto trace's header, a prompt file's creation time, ShareGPT's
# 64-bit ids. A document's reader takes them; a field rig reads (the schema's) still bounds its own value.
@pytest.mark.parametrize("field, value", [("baseTimeNanoseconds", "1790857026000000000"), ("created_ns", "1.79e18"),
                                          ("id", "18446744073709551615"), ("weight_ns", "1.7e308")])
def test_numbers_in_fields_rig_does_not_read_are_not_judged(field, value):
    assert parse_json(f'{{"{field}": {value}, "n": 1}}', "r.json")["n"] == 1
    assert parse_yaml(f"{field}: {value}\nn: 1\n", "r.yml")["n"] == 1


@FUZZ
@given(value=st.one_of(st.integers(10**18 + 1, 10**60), st.floats(1.01e18, 1e300)), sign=st.sampled_from([1, -1]))
def test_a_field_rig_reads_still_bounds_its_value(tmp_path_factory, value, sign):
    from rig.core.schema import Field, validate

    with pytest.raises(RigError, match=r"^s\.yml: bench\.max_tokens: .*beyond"):
        validate(sign * value, Field((int, float)), "s.yml", "bench.max_tokens")


def test_a_5000_digit_integer_in_a_stack_is_one_error_line_naming_the_file(tmp_path):
    stack = tmp_path / "s.yml"
    stack.write_text((REPO / "stacks" / "default.yml").read_text() + "\nextra: " + "9" * 5000 + "\n")
    done = rig("stack", "show", "--stack", str(stack))
    assert done.returncode == 2 and done.stderr.startswith(f"rig: error: {stack}: line ")
    assert "write a smaller number" in done.stderr and len(done.stderr.splitlines()) == 1


ANSWERS = st.one_of(st.integers(-(10**400), 10**400), st.floats(allow_nan=True, allow_infinity=True),
                    st.booleans(), st.text(max_size=5), st.none())


@FUZZ
@given(values=st.lists(ANSWERS, max_size=8))
def test_measured_answers_are_finite_bounded_numbers_whose_sums_and_means_stay_finite(values):
    taken = [v for v in (numbers.answer(v, low=0) for v in values) if v is not None]
    assert all(not isinstance(v, bool) and 0 <= v <= numbers.LIMIT for v in taken)
    if taken:
        assert math.isfinite(sum(taken) / len(taken))  # two 1.7e308 no longer average to infinity


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                     max_size=3), max_leaves=12)


@FUZZ
@given(value=JSONISH)
def test_the_json_writer_writes_json_or_names_the_non_finite_value(value):
    try:
        text = dump_json(value, "tune.json", indent=2)
    except RigError as exc:
        assert str(exc).startswith("cannot write tune.json as JSON: ") and "nothing was written" in str(exc)
        return
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} written")) == json.loads(json.dumps(value))


@FUZZ
@given(cells=st.lists(st.text(max_size=20), min_size=1, max_size=5))
def test_a_markdown_row_of_any_cells_stays_one_row_of_as_many_cells(cells):
    head, rule, row = table([f"h{i}" for i in range(len(cells))], [cells])  # the one renderer of every table
    assert rule == "|" + "---|" * len(cells) and head.count("|") == len(cells) + 1
    assert len(row.splitlines()) == 1 and row.isprintable()
    unescaped = re.sub(r"\\.", "", row)  # every backslash escape dropped: what markdown reads as markup is left
    # a cell's own line breaks are its one piece of HTML, <br>, one per break; the input's < stays escaped
    assert unescaped.count("<br>") == sum(len(c.splitlines()) - 1 for c in cells if c.splitlines())
    unescaped = unescaped.replace("<br>", "")
    assert unescaped.count("|") == len(cells) + 1 and not set("<`[]") & set(unescaped)


@FUZZ
@given(text=st.text())
def test_the_terminal_sees_no_control_character_and_the_same_lines(text):
    shown = terminal(text)
    assert all(ch.isprintable() or ch == "\n" for ch in shown) and shown.count("\n") == text.count("\n")


@FUZZ
@given(argv=st.lists(st.text(max_size=12), min_size=1, max_size=4))
def test_a_unit_line_is_one_line_of_escaped_words_or_refused(argv):
    argv = ["/v/bin/python", *argv]
    try:
        line = unit_exec(argv, "argv")
    except RigError as exc:
        assert "control character" in str(exc)
        assert any(not ch.isprintable() for arg in argv for ch in arg)
        return
    assert line.isprintable() and "%" not in line.replace("%%", "") and "$" not in line.replace("$$", "")


class Parser:
    """A venv's sglang parser that knows every flag asked for and says VERSION is its version."""
    def __init__(self, version, flags):
        self.version, self.flags = version, flags

    def ask(self, request):
        return {"version": self.version, "options": self.flags} if request["mode"] == "options" else {}


def server_line(version: str, python: str) -> dict:
    stack = load(REPO / "stacks" / "default.yml")
    stack["server"].update(model="/m", draft_model="/d")
    pairs = wants(stack, False)
    flags = [w for w, _ in pairs if w.startswith("--")] + ["--tp-size", "--cuda-graph-max-bs"]
    return _render(stack, pairs, Parser(version, flags), python, False, False)


def test_a_version_that_would_add_a_unit_directive_and_a_relative_venv_are_refused():
    assert server_line("0.5.23", "/opt/v/bin/python")["exec_start"].startswith("/opt/v/bin/python -m sglang")
    with pytest.raises(RigError, match="sglang reports .*control character"):
        server_line("0.5.23\n[Service]\nExecStartPre=/bin/id", "/opt/v/bin/python")
    with pytest.raises(RigError, match="relative path, which systemd refuses.*absolute path"):
        server_line("0.5.23", "venv/bin/python")
    assert unit_text("100%", "x") == "100%%"


def test_accept_lengths_that_average_past_the_largest_float_are_no_measurement():
    from rig.serving.measure.plan import plan_from
    from rig.serving.measure.stats import aggregate
    from rig.serving.sglang_api import server_accept_length

    huge = {"internal_states": [{"avg_spec_accept_length": 1.7e308}, {"avg_spec_accept_length": 1.7e308}]}
    assert server_accept_length(huge) is None
    level = aggregate([[]], 1, plan_from(), [1.7e308, 1.7e308])
    assert level["server_accept_length"] is None
