"""The patch set: patch files read strictly into Patch records, and the opt-in features they offer."""
from __future__ import annotations

import hashlib
import importlib.resources
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rig.core import RigError
from rig.core.documents import dump_json
from rig.core.schema import Field, distribution, feature, validate

PATCH_SET = importlib.resources.files("rig.patches") / "set"  # a directory, or a folder inside the zipapp


@dataclass(frozen=True)
class Patch:
    id: str
    summary: str
    package: str
    needed: str
    upstream: str
    file: str
    hunks: tuple  # (find, replace) pairs, applied in order
    check: str
    why: str
    provenance: dict
    opt_in: str = ""  # the feature that turns it on; "" for a patch every environment in its range needs

    def needs(self, version: str) -> bool:
        return in_range(version, self.needed)

    def wanted(self, opted: frozenset[str]) -> bool:
        """Whether this patch is asked for: always, unless it is opt-in and OPTED lacks its feature."""
        return not self.opt_in or self.opt_in in opted

    def knows(self, version: str) -> bool:
        return self.needs(version) or bool(self.upstream and in_range(version, self.upstream))


def in_range(version: str, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return SpecifierSet(spec).contains(Version(version), prereleases=True)


def _schema() -> dict:
    text = Field(required=True, multiline=True)  # prose and code; names and paths stay one line

    def spec(value: str) -> str | None:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        try:
            SpecifierSet(value)
        except InvalidSpecifier:
            return f"{value!r} is not a version range like '>=0.5.9,<0.5.10'"
        return None if value else "must not be empty"

    return {
        "id": Field(required=True, check=distribution), "summary": text, "package": Field(required=True, check=distribution),
        "opt_in": Field(default="", nonempty=True, check=lambda v: v and feature(v)),
        "needed": Field(required=True, check=spec),
        "upstream": Field(default="", check=lambda v: v and spec(v)),
        "file": Field(required=True), "why": text, "check": text,
        "hunks": Field(list, required=True, check=lambda v: None if v else "needs at least one hunk",
                       item=Field(dict, fields={"find": Field(required=True, multiline=True,
                                                              check=lambda v: None if v else "must not be empty"),
                                                "replace": text})),
        "provenance": Field(dict, required=True, fields={
            "mirrors": text, "fixed_in": text, "checked": text, "drop_when": text}),
    }


def patch_files(source: str | Path | None):
    """The patch files: SOURCE's, else rig's own patch set (package data: a checkout, an installed rig or the
    engine bundle alike)."""
    if source:
        return sorted(Path(source).glob("*.yml"))
    if not PATCH_SET.is_dir():  # an image's engine: its patch set lies beside it
        raise RigError("this rig carries no patch set of its own; give --patches (in an image: /opt/rig/patches)")
    return sorted((p for p in PATCH_SET.iterdir() if p.name.endswith(".yml")), key=lambda p: p.name)


def load(source: str | Path | None = None) -> list[Patch]:
    """The patch set at SOURCE (else rig's own), in file-name order: the order patches of one file apply in."""
    from rig.core.documents import parse_yaml, read_text

    patches: list[Patch] = []
    seen: dict[str, str] = {}  # patch id -> the file that defines it
    for path in patch_files(source):
        data = parse_yaml(read_text(path, "patch file"), path.name)
        if not isinstance(data, dict):
            raise RigError(f"{path.name}: a patch file must be a mapping of keys")
        data = validate(data, Field(dict, fields=_schema()), path.name)
        if data["id"] in seen:
            raise RigError(f"{path.name}: patch id {data['id']!r} is also used by {seen[data['id']]}")
        if data["id"] + ".yml" != path.name:
            raise RigError(f"{path.name}: the file must be named after its id ({data['id']}.yml)")
        seen[data["id"]] = path.name
        hunks = tuple((h["find"], h["replace"]) for h in data.pop("hunks"))
        patches.append(Patch(hunks=hunks, **data))
    if not patches:
        raise RigError(f"no patch files (*.yml) in {source or PATCH_SET}: a patch set is never empty; "
                       "give --patches a directory of patch files")
    return patches


def identity(patches: list[Patch], opted: frozenset[str]) -> dict:
    """The patch set asked for (every patch an environment gets where its versions need it: the set's own, and the
    opt-in ones of OPTED), as a venv archive or image records it: {"ids", "opt_in", "sha256"}. The sha256 covers
    what decides the bytes a patch writes (its package, ranges, file and hunks), not its prose: two rigs whose
    patches write the same, hash the same."""
    wanted = sorted((p for p in patches if p.wanted(opted)), key=lambda p: p.id)
    said = [[p.id, p.package, p.needed, p.upstream, p.file, [list(hunk) for hunk in p.hunks], p.opt_in]
            for p in wanted]
    digest = hashlib.sha256(dump_json(said, "the patch set").encode()).hexdigest()
    return {"ids": [p.id for p in wanted], "opt_in": sorted(opted), "sha256": digest}


def asked(patches: list[Patch], opted: Iterable[str]) -> frozenset[str]:
    """The opt-in features OPTED, each one some patch of the set turns on (else a RigError naming those it knows)."""
    opted = sorted(opted)
    known = sorted({p.opt_in for p in patches if p.opt_in})
    if unknown := [name for name in opted if name not in known]:
        raise RigError(f"no patch of the set is opt-in {', '.join(repr(name[:60]) for name in unknown)}; the opt-in "
                       f"features are: {', '.join(known) or 'none'}. Fix the stack's patches.opt_in (or --opt-in)")
    return frozenset(opted)
