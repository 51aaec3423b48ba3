"""Reading input documents: every stack, patch, lock and state file comes through here.

Text must be UTF-8; YAML is read strictly (a key given twice, an anchor/alias
or absurd nesting is refused, not silently resolved); JSON of the wrong shape
is refused naming the file and the key; every number in either is a
rig.core.numbers token (bounded in length, finite), and the fields rig reads
bound their values (the schema). Each failure is a RigError that names the
file and what to do, never a traceback. dump_json is the one JSON writer.
"""
from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rig.core import RigError, numbers
from rig.core.fs import read_bytes
from rig.core.schema import Field, validate

JSON_EXPONENT = re.compile(r"^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?[eE][-+]?[0-9]+$")
MAX_DEPTH = 32      # stack and patch files nest 4 levels; anything deeper is an attack or an accident


def read_text(path, what: str, follow: bool = True) -> str:
    """PATH's UTF-8 text (a regular file: rig.core.fs.open_plain; follow=False refuses a link at PATH)."""
    if not isinstance(path, (str, os.PathLike)):  # a file inside the engine bundle (importlib.resources)
        return path.read_text()
    path = Path(path)
    try:
        return read_bytes(path, what, follow=follow).decode("utf-8")
    except RigError:  # read_bytes' own answers, MissingFile (also an OSError) among them
        raise
    except OSError as exc:
        raise RigError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise RigError(f"{what} {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from exc


def converge_file(path: str | Path, text: str, what: str, check: bool = False) -> dict:
    """PATH made to hold TEXT: {"changed", "diff"} (a unified diff from what is there); CHECK writes nothing. The
    one way rig writes a file it manages on a host: a file already right is left alone (its mtime too), a FIFO
    at PATH is refused, never waited on, and the write replaces PATH in one rename (a link there is replaced, never
    written through; a reader never takes a half-written file)."""
    from rig.core.fs import MissingFile, atomic_write

    try:
        current: str | None = read_text(path, what)
    except MissingFile:
        current = None
    if current == text:
        return {"changed": False, "diff": ""}
    import difflib

    diff = "".join(difflib.unified_diff((current or "").splitlines(True), text.splitlines(True), str(path), str(path)))
    if not check:
        atomic_write(path, text)
    return {"changed": True, "diff": diff}


def _depth(value: Any, limit: int, level: int = 0) -> bool:
    if level > limit:
        return False
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return all(_depth(child, limit, level + 1) for child in children)


def parse_yaml(text: str, source: str) -> Any:
    """YAML as data: safe types only, no duplicate keys, no aliases, bounded nesting."""
    import yaml  # controller-only: targets read JSON alone

    class Strict(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise RigError(f"{source}: line {event.start_mark.line + 1}: YAML aliases (*name) are not "
                               "accepted; write the value out")
            if self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
                self._depth = getattr(self, "_depth", 0) + 1
                if self._depth > MAX_DEPTH:
                    raise RigError(f"{source}: nested more than {MAX_DEPTH} levels deep; not a rig document")
                node = super().compose_node(parent, index)
                self._depth -= 1
                return node
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    raise RigError(f"{source}: line {key_node.start_mark.line + 1}: a key must be text")
                if key in seen:
                    raise RigError(f"{source}: line {key_node.start_mark.line + 1}: key {key!r} is given twice; "
                                   "keep one")
                seen.add(key)
            return super().construct_mapping(node, deep)

        def construct_number(self, node):
            text = self.construct_scalar(node)
            if text.lower().lstrip("+-") in (".inf", ".nan"):  # YAML's own spellings; a schema bounds them
                return self.construct_yaml_float(node)
            convert = self.construct_yaml_int if node.tag.endswith(":int") else self.construct_yaml_float
            return numbers.token(text, f"{source}: line {node.start_mark.line + 1}", lambda _: convert(node))

    # JSON is YAML 1.2, whose floats need no dot (1e3, 2.5E-1); PyYAML follows YAML 1.1, which reads them as text
    Strict.add_implicit_resolver("tag:yaml.org,2002:float", JSON_EXPONENT, list("-+0123456789"))
    Strict.add_constructor("tag:yaml.org,2002:int", Strict.construct_number)
    Strict.add_constructor("tag:yaml.org,2002:float", Strict.construct_number)
    try:
        return yaml.load(text, Loader=Strict)  # noqa: S506 - Strict is a SafeLoader
    except yaml.MarkedYAMLError as exc:  # one line: where, what was found or expected, while reading what
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        said = " ".join(str(exc.problem or exc.context or "").split())
        context = f" ({' '.join(exc.context.split())})" if exc.context and exc.problem else ""
        raise RigError(f"{source}: {where}not valid YAML: {said}{context}") from exc
    except yaml.YAMLError as exc:
        raise RigError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from exc


def load_yaml(path: str | Path, what: str) -> Any:
    return parse_yaml(read_text(path, what), str(path))


def parse_json(text: str, source: str, spec: Field | None = None) -> Any:
    """JSON as data: no duplicate keys, bounded nesting, and SPEC's shape when given."""
    def pairs(items):
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            raise RigError(f"{source}: a key is given twice in one object; not a file rig wrote")
        return dict(items)

    def number(text: str) -> int | float:
        return numbers.token(text, source)

    def constant(text: str):
        raise RigError(f"{source}: {text} is not JSON (no NaN or Infinity); not a file rig wrote")

    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_int=number, parse_float=number,
                           parse_constant=constant)
    except RecursionError as exc:
        raise RigError(f"{source}: nested too deeply; not a rig document") from exc
    except ValueError as exc:
        raise RigError(f"{source}: not valid JSON ({exc})") from exc
    if not _depth(value, MAX_DEPTH):
        raise RigError(f"{source}: nested more than {MAX_DEPTH} levels deep; not a rig document")
    return validate(value, spec, source) if spec else value


def load_json(path: str | Path, what: str, spec: Field | None = None, follow: bool = True) -> Any:
    return parse_json(read_text(path, what, follow), str(path), spec)


def dump_json(value: Any, what: str, indent: int | None = None, sort_keys: bool = False,
              default: Callable[[Any], Any] | None = None) -> str:
    """VALUE as JSON text (json.dumps' own layout for the same arguments, so hashes of it stay put), or a
    RigError naming WHAT and the key holding a number JSON cannot hold (NaN or infinity)."""
    try:
        return json.dumps(value, indent=indent, sort_keys=sort_keys, default=default, allow_nan=False)
    except ValueError as exc:
        where = _nonfinite(value) or "a value"
        raise RigError(f"cannot write {what} as JSON: {where} is not a finite number (NaN or infinity, a "
                       "measurement that overflowed or was never made); nothing was written") from exc


def _nonfinite(value: Any, where: str = "") -> str | None:
    """The key path of the first NaN or infinity in VALUE."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "the top level"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) \
        else ()
    for key, child in items:
        if found := _nonfinite(child, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}".lstrip(".")):
            return found
    return None


def yaml_dump(data: dict) -> str:
    """DATA as block YAML in its own key order (no trailing newline)."""
    import yaml

    return yaml.safe_dump(data, sort_keys=False).rstrip()
