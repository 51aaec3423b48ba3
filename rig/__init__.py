"""rig: provision, build and prove an SGLang + EAGLE-3 stack on CUDA 13."""

import sys

__version__ = "0.1.0"


def progress(message: str) -> None:
    """Progress of long work goes to stderr, so --json output on stdout stays parseable."""
    print(f"rig: {message}", file=sys.stderr, flush=True)


class RigError(Exception):
    """A problem the user can fix; the message names it and says how."""
