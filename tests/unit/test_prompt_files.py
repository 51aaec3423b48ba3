"""Prompt files (rig.serving.workload) are read as a stream, a record at a time: a ShareGPT file of any size is
taken (the standard one is 642 MB; a whole-file cap of 16 MiB refused it), each record is bounded, and every
fault names its line or entry."""
import io
import json
import os
import tracemalloc
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rig.core import RigError
from rig.serving import workload

# one record as ShareGPT_V3_unfiltered_cleaned_split.json writes it, with the 64-bit ids other ShareGPT exports
# carry: numbers past 10^18 in fields rig does not read
SHAREGPT = {"id": "QWJhYvA_0", "uid": 18446744073709551615, "created": 1.8e19, "conversations": [
    {"from": "human", "value": "Summarize the main ideas of Jeff Walker's Product Launch Formula into bullet points "
                                "as it pertains to a growth marketing agency implementing these strategies."},
    {"from": "gpt", "value": "Here are the main ideas of Jeff Walker's Product Launch Formula: \"pre-launch\", "
                              "{the launch} and [the follow-up]\\n" * 40}]}


class Generated(io.RawIOBase):
    """A file's bytes made as they are read, never whole in memory: PIECES (an iterator of bytes)."""

    def __init__(self, pieces):
        self.pieces, self.left = pieces, b""

    def readable(self):
        return True

    def readinto(self, buffer):
        while not self.left:
            self.left = next(self.pieces, b"")
            if not self.left:
                return 0
        n = min(len(buffer), len(self.left))
        buffer[:n], self.left = self.left[:n], self.left[n:]
        return n


def sharegpt_list(count: int):
    yield b"[\n"
    for i in range(count):
        record = {**SHAREGPT, "id": f"QWJhYvA_{i}", "uid": 18446744073709551615 - i}
        yield (b",\n" if i else b"") + json.dumps(record, indent=2).encode()
    yield b"\n]\n"


def test_a_sharegpt_list_past_the_old_whole_file_cap_is_streamed_with_its_64_bit_ids():
    count = 7000  # 7000 records of 3.4 KB: 24 MB, past the 16 MiB a file could once be
    size = sum(len(piece) for piece in sharegpt_list(count))
    assert size > 20 << 20
    tracemalloc.start()
    try:
        prompts = workload.read(io.BufferedReader(Generated(sharegpt_list(count))), "prompt file big.json", 16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(prompts) == count and {p.text for p in prompts} == {SHAREGPT["conversations"][0]["value"]}
    assert all(p.max_tokens == 16 for p in prompts)
    assert peak < size / 2  # a record at a time, never the whole file (one copy of the prompt text is kept)


def test_a_prompt_file_is_a_regular_file_and_its_records_are_bounded(tmp_path, monkeypatch):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([SHAREGPT, {**SHAREGPT, "conversations": []}, SHAREGPT]))
    assert [p.text for p in workload.load(path, 8)] == [SHAREGPT["conversations"][0]["value"]] * 2
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(RigError, match="fifo.jsonl is not a regular file"):
        workload.load(tmp_path / "fifo.jsonl", 8)
    monkeypatch.setattr(workload, "MAX_RECORD", 1024)  # SHAREGPT's record is 3.4 KB
    with pytest.raises(RigError, match=r"sharegpt.json: entry 1 is larger than .* more than a prompt record holds"):
        workload.load(path, 8)
    lines = tmp_path / "prompts.jsonl"
    lines.write_text('{"prompt": "short"}\n' + json.dumps({"prompt": "x" * 2000}) + "\n")
    with pytest.raises(RigError, match="prompts.jsonl: line 2 is longer than"):
        workload.load(lines, 8)


def test_sharegpt_conversations_without_a_human_turn_are_left_out_and_said(tmp_path, capsys):
    """As SGLang's benchmark leaves out conversations too short to use: such a conversation sends nothing, and the
    standard file holds some."""
    path = tmp_path / "sharegpt.json"
    empty = {**SHAREGPT, "conversations": []}
    gpt_only = {**SHAREGPT, "conversations": [SHAREGPT["conversations"][1]]}
    path.write_text(json.dumps([empty, SHAREGPT, gpt_only]))
    assert len(workload.load(path, 8)) == 1
    assert "left out 2 ShareGPT conversation(s) without a human turn to send (the first: entry 1)" in \
        capsys.readouterr().err
    path.write_text(json.dumps([empty, gpt_only]))
    with pytest.raises(RigError, match="holds no prompt: none of its 2 ShareGPT conversation"):
        workload.load(path, 8)
    path.write_text(json.dumps([{**SHAREGPT, "conversations": [{"from": "human", "value": 7}]}]))
    with pytest.raises(RigError, match="entry 1: no prompt text"):  # a turn that is not text is a fault, said
        workload.load(path, 8)


@pytest.mark.parametrize("text, says", [
    (b'[{"prompt": "a"},]', r"entry 2: expected an object with a prompt at byte 17, got the list's end"),
    (b'[{"prompt": "a"} {"prompt": "b"}]', r"after entry 1, expected , or \] at byte 17, got '\{'"),
    (b'[{"prompt": "a"}, "b"]', "entry 2: expected an object with a prompt at byte 18, got text"),
    (b'[{"prompt": "a"', "entry 1: the file ends inside it; is it cut short"),
    (b'[{"prompt": "a"}', r"after entry 1, expected , or \] at byte 16, got the end of the file"),
    (b'[{"prompt": "a"}] []', r"more follows the list's closing \] \(at byte 18\)"),
    (b'[{"prompt": "a\xff"}]', r"entry 1 is not UTF-8 text \(byte 14 of the file\)"),
    (b'[{"prompt": "a", "prompt": "b"}]', "entry 1: a key is given twice"),
    (b'[{"prompt": "a"}, {"prompt": 1e999}]', "entry 2: .*not a finite number"),
    (b'{"prompt": "a"}\n\n{"prompt": "b"\n', "line 3: not valid JSON"),
    (b"[]", "holds no prompt$"),
])
def test_every_fault_names_its_entry_or_line(text, says):
    with pytest.raises(RigError, match=says):
        workload.read(io.BytesIO(text), "prompt file p", 8)


@pytest.mark.parametrize("chunk", [1, 5, 1 << 20])
def test_a_fault_is_named_by_its_line_whatever_the_reads(chunk):
    """Blank lines before the first record count, however much of them one read holds."""
    text = b"\n \n" * 40 + b'  {"prompt": "a"}\r\n\n{"prompt": "b"\n'
    with mock.patch.object(workload, "CHUNK", chunk), pytest.raises(RigError, match="^prompt file p: line 83: not "
                                                                                    "valid JSON"):
        workload.read(io.BytesIO(text), "prompt file p", 8)


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40).filter(str.strip)


@settings(max_examples=200, deadline=None)
@given(entries=st.lists(st.tuples(TEXT, st.none() | st.integers(1, 1_000_000), st.booleans()), min_size=1,
                        max_size=6),
       as_list=st.booleans(), indent=st.none() | st.integers(0, 3), ascii_only=st.booleans(),
       chunk=st.integers(1, 64))
def test_prompt_files_read_as_a_stream_give_what_the_whole_file_holds(entries, as_list, indent, ascii_only, chunk):
    """Any prompt text (quotes, backslashes, brackets, U+2028, astral characters, raw or escaped), either format,
    any layout, cut into reads of any size: the stream gives each entry's prompt, as json.loads of the whole file
    reads it."""
    records = [{"prompt": text, **({"max_tokens": tokens} if tokens else {})} if not sharegpt else
               {"id": 18446744073709551615, "conversations": [{"from": "human", "value": text}]}
               for text, tokens, sharegpt in entries]
    if as_list:
        data = json.dumps(records, indent=indent, ensure_ascii=ascii_only).encode()
    else:
        data = "\n".join(json.dumps(r, ensure_ascii=ascii_only) for r in records).encode() + b"\n"
    with mock.patch.object(workload, "CHUNK", chunk):
        got = workload.read(io.BytesIO(data), "prompt file p", 32)
    want = [(text, tokens if tokens and not sharegpt else 32) for text, tokens, sharegpt in entries]
    assert [(p.text, p.max_tokens) for p in got] == want


@pytest.mark.parametrize("chunk", [1, 2, 1 << 20])
@pytest.mark.parametrize("text", [b'\xef\xbb\xbf[{"conversations": [{"from": "human", "value": "hi"}]}]',
                                  b'\xef\xbb\xbf{"prompt": "hi"}\n'], ids=["sharegpt", "jsonl"])
def test_a_byte_order_mark_before_the_first_record_is_no_part_of_it(text, chunk):
    """Editors on Windows start UTF-8 files with one: the array is still an array, the line still line 1."""
    with mock.patch.object(workload, "CHUNK", chunk):
        assert [p.text for p in workload.read(io.BytesIO(text), "prompt file p", 8)] == ["hi"]
