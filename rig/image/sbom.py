"""A CycloneDX SBOM of a venv: every installed distribution, with the wheel's sha256 from the lock.

Deterministic: no timestamp, and a serial number derived from the content, so two
builds of the same lock write the same file.
"""
from __future__ import annotations

import uuid
from pathlib import Path

from packaging.utils import canonicalize_name

from rig.core.documents import dump_json, read_text
from rig.core.proc import venv_python
from rig.python.introspect import held
from rig.python.pip import read_pinned


def locked_hashes(requirements: str | Path) -> dict:
    """name -> (version, sha256) from a hash-pinned requirements file (`rig wheelhouse export`)."""
    return {canonicalize_name(name): (version, sha256)
            for name, version, sha256 in read_pinned(read_text(requirements, "requirements file"))}


def cyclonedx(venv: str | Path, requirements: list, name: str = "") -> dict:
    """REQUIREMENTS: the lock's list and that of the wheels rig built for it."""
    listed = sorted(held(venv_python(venv), every=True).every)
    hashes = {k: v for path in requirements for k, v in locked_hashes(path).items()}
    components = []
    for dist, version in listed:
        key = canonicalize_name(dist)
        component: dict = {"type": "library", "bom-ref": f"pkg:pypi/{key}@{version}", "name": dist, "version": version,
                     "purl": f"pkg:pypi/{key}@{version}"}
        if key in hashes and hashes[key][0] == version:
            component["hashes"] = [{"alg": "SHA-256", "content": hashes[key][1]}]
        components.append(component)
    body = dump_json(components, "the SBOM's components", sort_keys=True)
    return {"bomFormat": "CycloneDX", "specVersion": "1.5",
            "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, 'rig-sbom:' + body)}", "version": 1,
            "metadata": {"component": {"type": "application", "name": name or Path(venv).name},
                         "tools": {"components": [{"type": "application", "name": "rig"}]}},
            "components": components}
