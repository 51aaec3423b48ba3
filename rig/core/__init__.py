"""The core layer: errors, progress, documents, schemas, files, processes; it imports nothing above it."""

import sys


def progress(message: str) -> None:
    """Progress of long work goes to stderr, so --json output on stdout stays parseable."""
    from rig.core.escape import rig_line  # escape imports this module's RigError

    print(rig_line(message), file=sys.stderr, flush=True)


class RigError(Exception):
    """A problem the user can fix; the message names it and says how."""
