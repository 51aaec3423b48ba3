"""rig: provision, build and prove an SGLang + EAGLE-3 stack on CUDA 13."""

__version__ = "0.1.0"


class RigError(Exception):
    """A problem the user can fix; the message names it and says how."""
