"""A targeted edit of a YAML document a user wrote: some keys of one top-level block mapping set, every other
line (comments, order, spelling) left as it was. Each value is serialized (JSON's flow form, which YAML reads),
never pasted, and the result is parsed again and must be the document with exactly those keys changed; where
the layout is one this edit does not take on (a flow mapping, a key spelt twice), it says so and changes nothing."""
from __future__ import annotations

import copy
import re
from typing import Any

from rig.core import RigError
from rig.core.documents import dump_json, parse_yaml

_BLANK = re.compile(r"\s*(#.*)?")


def _comment(line: str) -> str:
    """LINE's trailing comment (from the whitespace before its '#'), or "": the first '#' after whitespace and
    outside quotes (one pass: a long line costs its length)."""
    quote = ""
    for at, char in enumerate(line):
        if quote:
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


def _key(line: str) -> Any:
    """The key a block mapping's line writes, as YAML reads it ("a", 'a' and a are one key); None where the
    line writes none. Compared by value, never by spelling: a quoted key is the same key."""
    text = line.strip()
    quote = text[:1] if text[:1] in "'\"" else ""
    sep = text.find(":", text.find(quote, 1) + 1 if quote else 0)
    if sep < 0:
        return None
    try:
        read = parse_yaml(text[:sep] + ": 0", "a key")
    except RigError:
        return None
    return next(iter(read)) if isinstance(read, dict) and len(read) == 1 else None


def _same(a: Any, b: Any) -> bool:
    """A and B equal, their types too: YAML's 1, 1.0 and true are three values here, as they are to a schema."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def with_keys(text: str, section: str, values: dict[str, Any], source: str) -> str:
    """TEXT with SECTION's keys set to VALUES (added at the block's end where absent; the block added at the end
    where the document has none). A RigError when the edit would not give exactly that document."""
    data = parse_yaml(text, source)
    if not isinstance(data, dict) or not isinstance(data.get(section) or {}, dict):
        raise RigError(f"{source}: {section} is not a mapping; rig edits only a stack file's mapping sections")
    lines = text.splitlines(keepends=True)
    eol = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"  # the file's own line ending
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += eol
    heads = [i for i, line in enumerate(lines) if re.match(rf"{re.escape(section)}\s*:\s*(#.*)?$", line.rstrip("\r\n"))]
    if section in data and len(heads) != 1:
        raise RigError(f"{source}: its {section} section is not a block of its own line ({section}: followed by "
                       "indented keys), so rig cannot edit it in place; edit it by hand")
    if not heads:
        lines += [f"{section}:{eol}"]
        heads = [len(lines) - 1]
    start = heads[0] + 1
    end = next((i for i in range(start, len(lines)) if not _BLANK.fullmatch(lines[i].rstrip("\r\n"))
                and _indent(lines[i]) == 0), len(lines))
    body = [i for i in range(start, end) if not _BLANK.fullmatch(lines[i].rstrip("\r\n"))]
    indent = _indent(lines[body[0]]) if body else 2
    current = data.get(section) or {}
    for key, value in values.items():
        if key in current and _same(current[key], value):
            continue  # already so: its line stays as the user spelt it
        shown = f"{' ' * indent}{key}: {dump_json(value, f'{section}.{key}')}"
        at = [i for i in body if _indent(lines[i]) == indent and _key(lines[i]) == key]
        if len(at) > 1:
            raise RigError(f"{source}: {section}.{key} is written {len(at)} times; keep one and run again")
        if at:
            i = at[0]
            stop = next((j for j in range(i + 1, end) if not _BLANK.fullmatch(lines[j].rstrip("\r\n"))
                         and _indent(lines[j]) <= indent and not _item(lines[j], indent)), end)
            while stop > i + 1 and _BLANK.fullmatch(lines[stop - 1].rstrip("\r\n")):
                stop -= 1  # the blank and comment lines before the next key are not the value's
            comment = _comment(lines[i].rstrip("\r\n")) if stop == i + 1 else ""
            lines[i:stop] = [shown + comment + eol]
            end += 1 - (stop - i)
        else:
            lines.insert((body[-1] + 1) if body else start, shown + eol)
            end += 1
        body = [j for j in range(start, end) if not _BLANK.fullmatch(lines[j].rstrip("\r\n"))]
    edited = "".join(lines)
    wanted = copy.deepcopy(data)
    wanted[section] = {**(wanted.get(section) or {}), **values}
    if not _same(parse_yaml(edited, f"{source} (edited)"), wanted):  # a text that does not parse is a RigError there
        raise RigError(f"{source}: setting {section}'s {', '.join(values)} in place would change more than those "
                       "keys (an unusual layout); edit it by hand")
    return edited
