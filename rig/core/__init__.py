"""The core layer: errors, progress, documents, schemas, files, processes; it imports nothing above it."""

import sys


def progress(message: str) -> None:
    """Progress of long work goes to stderr, so --json output on stdout stays parseable."""
    from rig.core.escape import rig_line  # escape imports this module's RigError

    print(rig_line(message), file=sys.stderr, flush=True)


class RigError(Exception):
    """A problem the user can fix: MESSAGE names it, HINT (where given) says how to fix it. The error boundary
    (rig.cli.main) prints the hint on a line of its own, `rig: hint: ...` (and as `hint` under --json); str() holds
    both, so a caller that words the error into its own (a failed check, a wrapping error) keeps the remedy.
    REASON, on a subclass, names a failure a caller acts on (`cannot-mount`: fall back): the boundary gives it its
    own exit status and a `reason` key under --json."""

    reason: str | None = None

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message
