"""Bytecode to keep beside a source in a zip (name.pyc, the layout zipimport reads): zipimport never writes
bytecode, so without it every import from a zip compiles its source again. Unchecked-hash: the archive is
built and checked as a whole, and a Python of another version (another magic number) reads the source."""
from __future__ import annotations

import importlib.util
import marshal

UNCHECKED_HASH = (1).to_bytes(4, "little")  # the pyc flags: hash-based, the source not checked at import


def unchecked_pyc(source: bytes, name: str) -> bytes:
    """SOURCE compiled by this Python, its frames naming NAME; SyntaxError where this Python cannot compile it."""
    code = compile(source, name, "exec", dont_inherit=True)
    return importlib.util.MAGIC_NUMBER + UNCHECKED_HASH + importlib.util.source_hash(source) + marshal.dumps(code)
