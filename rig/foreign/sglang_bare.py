"""Put before the scripts that import sglang's modules (sglang_parser, patch_checks; rig.core.proc.script):
sglang's package registered without running its __init__, which is the frontend language's API and transformers'
patches, 8 of the 11 CPU-seconds 0.5.23's server_args takes to import. What the __init__ does first, pointing
third-party caches under sglang's, is done here too. The modules the scripts import run as in a server; where
anything here goes wrong, sglang is left to the usual import, which fails (or not) with its own reason."""
import importlib.util as _util
import sys as _sys


def _bare_sglang() -> None:
    if "sglang" in _sys.modules:  # imported at start-up (a .pth file): kept whole
        return
    spec = _util.find_spec("sglang")
    if spec is None or spec.submodule_search_locations is None:  # absent or a single module
        return
    _sys.modules["sglang"] = _util.module_from_spec(spec)
    try:
        import sglang.srt.environ as environ  # type: ignore[import-not-found]
    except ImportError:  # an sglang without it has no caches to redirect
        return
    getattr(environ, "redirect_third_party_caches", lambda: None)()


try:
    _bare_sglang()
except Exception:
    _sys.modules.pop("sglang", None)
