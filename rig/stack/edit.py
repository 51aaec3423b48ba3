"""A targeted edit of a stack file as its user wrote it (rig tune's proposed stack): some keys of one top-level
block mapping set, every other line (comments, order, spelling) left as it was; a mapping written as a block is
edited key by key, so the comments inside it stay too. Each value is serialized (JSON's flow form, which YAML
reads), never pasted, and the result is parsed again and must be the document with exactly those keys changed;
where the layout is one this edit does not take on (a flow mapping, a key spelt twice, an explicit `? key`), it
says so and changes nothing."""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, replace
from typing import Any

from rig.core import RigError
from rig.core.documents import dump_json, parse_yaml

_BLANK = re.compile(r"\s*(#.*)?")


def _comment(line: str) -> str:
    """LINE's trailing comment (from the whitespace before its '#'), or "": the first '#' after whitespace and
    outside quotes (one pass: a long line costs its length)."""
    quote, escaped = "", False
    for at, char in enumerate(line):
        if escaped:  # a double-quoted scalar's \" is no closing quote
            escaped = False
        elif quote:
            escaped = quote == '"' and char == "\\"
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and at and line[at - 1] in " \t":
            start = at
            while start and line[start - 1] in " \t":
                start -= 1
            return line[start:]
    return ""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _item(line: str, indent: int) -> bool:
    """A sequence item at the keys' own indent: the value of the key above it (PyYAML writes lists so)."""
    return _indent(line) == indent and line.lstrip(" ").startswith(("- ", "-\n"))


def _split(line: str) -> tuple[Any, str] | None:
    """The key a block mapping's line writes, as YAML reads it ("a", 'a' and a are one key), and the text after
    its colon; None where the line writes none. Compared by value, never by spelling: a quoted key is the same key."""
    text = line.strip()
    quote = text[:1] if text[:1] in "'\"" else ""
    sep = text.find(":", text.find(quote, 1) + 1 if quote else 0)
    if sep < 0:
        return None
    try:
        read = parse_yaml(text[:sep] + ": 0", "a key")
    except RigError:
        return None
    return (next(iter(read)), text[sep + 1:]) if isinstance(read, dict) and len(read) == 1 else None


def _key(line: str) -> Any:
    split = _split(line)
    return split[0] if split else None


def _opens_block(line: str) -> bool:
    """LINE is `key:` with nothing after it but a comment: its value is the block below (no flow, anchor or tag)."""
    split = _split(line.rstrip("\r\n"))
    return split is not None and not split[1][:len(split[1]) - len(_comment(split[1]))].strip()


def _blank(line: str) -> bool:
    return bool(_BLANK.fullmatch(line.rstrip("\r\n")))


def _same(a: Any, b: Any) -> bool:
    """A and B equal, their types too: YAML's 1, 1.0 and true are three values here, as they are to a schema."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)



def _value_end(lines: list[str], i: int, end: int, indent: int) -> int:
    """Where the value of the key on line I (at INDENT) ends, the blank and comment lines before the next key left
    out: they are not the value's."""
    stop = next((j for j in range(i + 1, end) if not _blank(lines[j]) and _indent(lines[j]) <= indent
                 and not _item(lines[j], indent)), end)
    while stop > i + 1 and _blank(lines[stop - 1]):
        stop -= 1
    return stop


def _written(key: Any, value: Any, indent: int, path: str) -> str:
    """KEY: VALUE as one line, both serialized, never pasted (a key YAML would read as another value is quoted)."""
    plain = isinstance(key, str) and _key(f"{key}: 0") == key
    return f"{' ' * indent}{key if plain else dump_json(key, path)}: {dump_json(value, f'{path}.{key}')}"


def _nested(lines: list[str], i: int, stop: int, current: Any, value: Any) -> bool:
    """The key on line I holds a mapping written as a block below it, and is set to a mapping: edited one level
    down, key by key (an empty one is written whole: a block of no keys is no mapping)."""
    return (isinstance(value, dict) and bool(value) and isinstance(current, dict) and bool(current)
            and stop > i + 1 and _opens_block(lines[i]))


@dataclass(frozen=True)
class _Block:
    """A block mapping being edited: LINES[start:end], the indent its keys take where it has none yet, its key path,
    and the file's line ending and name."""
    start: int
    end: int
    indent: int
    path: str
    eol: str
    source: str


def _edit_block(lines: list[str], block: _Block, current: dict, values: dict, exact: bool = False) -> int:
    """BLOCK given VALUES key by key (added at its end, at the indent of its keys), and where EXACT without the keys
    VALUES lacks (CURRENT: what it holds now). Returns the block's new end."""
    unset = [key for key in current if key not in values] if exact else []
    end = block.end
    for key, value in [*values.items(), *((key, None) for key in unset)]:
        if key in values and key in current and _same(current[key], value):
            continue  # already so: its line stays as the user spelt it
        before = len(lines)
        _edit_key(lines, replace(block, end=end), key, value, current.get(key), key in values)
        end += len(lines) - before
    return end


def _edit_key(lines: list[str], block: _Block, key: Any, value: Any, current: Any, kept: bool) -> None:
    """KEY of BLOCK set to VALUE (CURRENT: its value now), added where the block lacks it; where not KEPT, its
    lines removed."""
    body = [j for j in range(block.start, block.end) if not _blank(lines[j])]
    keys_at = _indent(lines[body[0]]) if body else block.indent
    at = [j for j in body if _indent(lines[j]) == keys_at and _key(lines[j]) == key]
    if len(at) > 1:
        raise RigError(f"{block.source}: {block.path}.{key} is written {len(at)} times; keep one and run again")
    if not at:
        lines.insert(body[-1] + 1 if body else block.start, _written(key, value, keys_at, block.path) + block.eol)
        return
    stop = _value_end(lines, at[0], block.end, keys_at)
    path = f"{block.path}.{key}"
    if not kept:
        del lines[at[0]:stop]
    elif _nested(lines, at[0], stop, current, value):
        _edit_block(lines, _Block(at[0] + 1, stop, keys_at + 2, path, block.eol, block.source), current, value, True)
    else:  # one line, the key as the user spelt it, its trailing comment kept where the old value was one line
        line = lines[at[0]].rstrip()
        spelt = line[:len(line) - len(_split(line)[1])]  # type: ignore[index]  # _key found a key there
        comment = _comment(lines[at[0]].rstrip("\r\n")) if stop == at[0] + 1 else ""
        lines[at[0]:stop] = [f"{spelt} {dump_json(value, path)}{comment}{block.eol}"]


def _lines(text: str) -> tuple[list[str], str]:
    """TEXT's lines, the last one ended, and the file's own line ending."""
    lines = text.splitlines(keepends=True)
    eol = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += eol
    return lines, eol


def _section(lines: list[str], data: dict, section: str, eol: str, source: str) -> tuple[int, int]:
    """Where SECTION's block is in LINES (its line added at the end where the document has none): its first line
    after `SECTION:` and its end. A RigError where it is no block of its own line or writes a key as `? key`."""
    heads = [i for i, line in enumerate(lines) if re.match(rf"{re.escape(section)}\s*:\s*(#.*)?$", line.rstrip("\r\n"))]
    if section in data and len(heads) != 1:
        raise RigError(f"{source}: its {section} section is not a block of its own line ({section}: followed by "
                       "indented keys), so rig cannot edit it in place; edit it by hand")
    if not heads:
        lines += [f"{section}:{eol}"]
        heads = [len(lines) - 1]
    start = heads[0] + 1
    end = next((i for i in range(start, len(lines)) if not _blank(lines[i]) and _indent(lines[i]) == 0), len(lines))
    if explicit := next((i for i in range(start, end) if lines[i].lstrip(" ").startswith(("? ", "?\t", "?\n", "?\r"))),
                        None):
        raise RigError(f"{source}: line {explicit + 1} writes a key of {section} in YAML's explicit form (`? key`); "
                       "rig edits `key: value` lines: write it so, or edit the file by hand")
    return start, end


def with_keys(text: str, section: str, values: dict[str, Any], source: str) -> str:
    """TEXT with SECTION's keys set to VALUES (added at the block's end where absent; the block added at the end
    where the document has none); a mapping value written as a block is edited key by key, its comments kept. A
    RigError when the edit would not give exactly that document."""
    data = parse_yaml(text, source)
    if not isinstance(data, dict) or not isinstance(data.get(section) or {}, dict):
        raise RigError(f"{source}: {section} is not a mapping; rig edits only a stack file's mapping sections")
    lines, eol = _lines(text)
    start, end = _section(lines, data, section, eol, source)
    _edit_block(lines, _Block(start, end, 2, section, eol, source), data.get(section) or {}, values)
    edited = "".join(lines)
    wanted = copy.deepcopy(data)
    wanted[section] = {**(wanted.get(section) or {}), **values}
    if not _same(parse_yaml(edited, f"{source} (edited)"), wanted):  # a text that does not parse is a RigError there
        raise RigError(f"{source}: setting {section}'s {', '.join(values)} in place would change more than those "
                       "keys (an unusual layout); edit it by hand")
    return edited
