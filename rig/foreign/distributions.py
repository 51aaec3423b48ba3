"""What a Python environment holds, from its packages' metadata, asked of its own interpreter.

rig.python.introspect runs it as `python -I -c SOURCE REQUEST`. REQUEST is JSON:
names (the distributions to describe; absent ones are left out), files (also each one's .so and .cubin
files), metadata (also its METADATA text), every (also every distribution's name and version), torch
(also import torch for the CUDA and NCCL versions it was built with). One JSON line back.
"""
import importlib.metadata as m
import json
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


def torch_runtime() -> dict:
    try:
        import torch

        nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
        return {"cuda": torch.version.cuda, "nccl": ".".join(map(str, nccl)) if nccl else None}
    except Exception as exc:  # a torch that does not import is an answer, not a crash
        return {"error": str(exc)[:200]}


def main(request: dict) -> dict:
    out: dict = {"python": sys.executable, "prefix": sys.prefix, "site": sysconfig.get_paths()["purelib"],
                 "packages": {}}
    for name in request.get("names", []):
        try:
            out["packages"][name] = describe(m.distribution(name), request.get("files", False),
                                             request.get("metadata", False))
        except m.PackageNotFoundError:
            continue
    if request.get("every"):
        out["every"] = [[d.metadata["Name"], d.version] for d in m.distributions()]
    if request.get("torch"):
        out["torch"] = torch_runtime()
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
