"""Put before the scripts that import sglang's modules (sglang_parser, patch_checks; rig.core.proc.script):
sglang's package registered without running its __init__, which is the frontend language's API and transformers'
patches, 8 of the 11 CPU-seconds 0.5.23's server_args takes to import. The modules they import run as in a
server; where sglang is not installed, their import fails as it would have."""
import importlib.util as _util
import sys as _sys

_spec = _util.find_spec("sglang")
if _spec is not None and _spec.submodule_search_locations is not None:
    _sys.modules["sglang"] = _util.module_from_spec(_spec)
