"""A filesystem call that fails where a test says: the failures rig must leave nothing behind after."""
from __future__ import annotations

import os
from pathlib import Path


def refuse(monkeypatch, name: str, path: Path, error: OSError, arg: int = 0) -> None:
    """os.NAME raises ERROR where its argument ARG (0: the source, 1: the destination) is PATH; else it runs."""
    real = getattr(os, name)

    def refused(*args, **kwargs):
        if Path(args[arg]) == path:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, refused)
