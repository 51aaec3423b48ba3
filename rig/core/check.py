"""One doctor check: its layer, its verdict, what it saw and how to fix it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Check:
    layer: str
    name: str
    status: str  # pass | fail | warn | skip
    detail: str
    fix: str = ""
    required: bool = True  # a failed check that is not required is reported without failing the run
