"""What a measuring command leaves in --out (rig machine probe, rig bench, rig tune, rig prove): one writer.

The JSON record first, so that nothing measured is lost when a later step fails; then the markdown report;
then the plots, drawn by the caller only once both are on disk, each written like every other file (never
through a link or into a FIFO). Where matplotlib does not import (a host's venv), the plots are left out and
said so: the record and the report hold everything they show."""
from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rig.core import progress
from rig.core.documents import dump_json
from rig.core.fs import atomic_write


def record(result: dict, name: str = "the record") -> str:
    """RESULT as the JSON record NAME; a non-finite number in it is refused (rig.core.documents.dump_json)."""
    return dump_json(result, name, indent=2, default=str) + "\n"


def write(out: str | Path, files: dict[str, str], draw: Callable[[], dict[str, Any]] | None = None) -> list[str]:
    """FILES (name -> text, in order) into OUT, then the figures DRAW returns (name -> a matplotlib Figure) as
    PNGs; the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [str(atomic_write(out / name, text)) for name, text in files.items()]
    try:
        figures = draw() if draw else {}
    except ImportError as exc:
        progress(f"plots not drawn in {out}: {exc.name or 'matplotlib'} does not import here")
        return written
    for name, figure in figures.items():
        png = io.BytesIO()
        figure.savefig(png, format="png", dpi=110)
        written.append(str(atomic_write(out / name, png.getvalue())))
    return written
