"""What a Python environment holds, from its packages' metadata, asked of its own interpreter.

rig.python.introspect runs it as `python -I -c SOURCE REQUEST`. REQUEST is JSON:
names (the distributions to describe; absent ones are left out), files (also each one's .so and .cubin
files), metadata (also its METADATA text), every (also every distribution's name and version), torch
(also import torch for the CUDA and NCCL versions it was built with), modules (top-level module names: where
this interpreter would import each from, found by importlib's own finder without importing it, so .pth-added
directories and editable installs count as Python counts them). One JSON line back.

A distribution whose metadata cannot be read (no name or version, a RECORD or METADATA that is not what
packaging tools write) is reported under "broken" with its path, for rig to name, instead of failing the rest.
"""
import importlib.metadata as m
import importlib.util
import json
import os
import sys
import sysconfig


def describe(dist: m.Distribution, files: bool, metadata: bool) -> dict:
    out: dict = {"version": dist.version, "root": str(dist.locate_file(""))}
    if files:
        out["files"] = [str(dist.locate_file(f)) for f in dist.files or []
                        if ".so" in f.name or f.name.endswith(".cubin")]
    if metadata:
        out["metadata"] = dist.read_text("METADATA") or ""
    return out


def where(dist: m.Distribution) -> str:
    return str(getattr(dist, "_path", "") or dist.locate_file(""))


def module_dirs(name: str) -> dict:
    """The directories NAME imports from (its package's, or a plain module's own), and whether it is a namespace
    package (no __init__: a leftover directory is one); no dirs when no finder finds it, or a finder fails."""
    try:
        spec = importlib.util.find_spec(name)
    except Exception:  # a .pth-installed finder may raise anything: not found, as Python would fail to import it
        spec = None
    if spec is None:
        return {"dirs": [], "namespace": False}
    if spec.submodule_search_locations is not None:
        return {"dirs": [str(p) for p in spec.submodule_search_locations], "namespace": spec.origin is None}
    return {"dirs": [os.path.dirname(spec.origin)] if spec.origin else [], "namespace": False}


def torch_runtime() -> dict:
    try:
        import torch
    except Exception as exc:  # a torch that does not import is an answer, not a crash
        return {"error": str(exc)[:200]}
    out = {"cuda": torch.version.cuda, "nccl": None}
    try:
        if torch.cuda.is_available():
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:  # no GPU reachable: the build's CUDA is still known
        out["nccl_error"] = str(exc)[:200]
    return out


def main(request: dict) -> dict:
    out: dict = {"python": sys.executable, "prefix": sys.prefix, "site": sysconfig.get_paths()["purelib"],
                 "packages": {}, "broken": []}
    for name in request.get("names", []):
        try:
            dist = m.distribution(name)
        except m.PackageNotFoundError:
            continue
        try:
            out["packages"][name] = describe(dist, request.get("files", False), request.get("metadata", False))
        except Exception as exc:
            out["broken"].append([where(dist), f"{type(exc).__name__}: {exc}"[:200]])
    if request.get("every"):
        out["every"] = []
        for dist in m.distributions():
            try:
                name, version = dist.metadata["Name"], dist.version
            except Exception as exc:
                name, version = None, f"{type(exc).__name__}: {exc}"[:200]
            if isinstance(name, str) and isinstance(version, str):
                out["every"].append([name, version])
            else:
                out["broken"].append([where(dist), version if name is None and version else "no name or version"])
    if request.get("modules"):
        out["modules"] = {name: module_dirs(name) for name in request["modules"] if "." not in name}
    if request.get("torch"):
        out["torch"] = torch_runtime()
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
