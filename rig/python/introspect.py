"""What a Python environment holds, asked of its own interpreter: one script (rig/foreign/distributions.py)
and one answer, checked here, for everything that needs to know (audit, patches, the SBOM, venv verify,
doctor, prove). rig never imports a venv's packages; their metadata is input like any other."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rig.core import RigError
from rig.core.documents import dump_json
from rig.core.proc import ask
from rig.core.wheelfile import requires_dist

FIELDS = {"version": str, "root": str, "files": list, "metadata": str}


@dataclass(frozen=True)
class Held:
    python: str
    prefix: Path
    site: Path
    packages: dict[str, dict] = field(default_factory=dict)  # each name asked and found -> {version, root, ...}
    every: list[tuple[str, str]] = field(default_factory=list)  # (name, version) of each one, when asked
    torch: dict = field(default_factory=dict)  # the CUDA and NCCL torch was built with, when asked
    modules: dict[str, list[Path]] = field(default_factory=dict)  # each top-level module asked -> where it imports from
    namespaces: frozenset[str] = frozenset()  # those of them that are namespace packages (no __init__)


def held(python: str | Path, names: list[str] | tuple[str, ...] = (), *, files: bool = False,
         metadata: bool = False, every: bool = False, torch: bool = False, modules: tuple[str, ...] = (),
         timeout: float = 120) -> Held:
    """What PYTHON's environment holds of NAMES (with each one's .so/.cubin FILES and METADATA text when asked),
    EVERY distribution's version (in import order: the first of a name is the one Python imports), torch's build
    (TORCH: imports torch there) and where each of MODULES would be imported from (importlib's finder: .pth
    directories and editable installs included, nothing imported). A distribution whose metadata
    cannot be read is one error naming it; a Python that does not answer within TIMEOUT seconds is one too."""
    request = {"names": sorted(set(names)), "files": files, "metadata": metadata, "every": every, "torch": torch,
               "modules": sorted(set(modules))}
    answer = ask(python, "distributions", [dump_json(request, "the request")],
                 "report what its environment holds (its Python must start)",
                 timeout=timeout)
    try:
        broken = [(_text(path), _text(why)) for path, why in answer.get("broken", [])]
        found = _read_answer(answer, files, metadata, every, torch, modules)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RigError(f"{python} reported its environment in a shape rig did not write ({exc}); is it a Python "
                       "with intact package metadata?") from exc
    if broken:
        raise RigError(f"{python}'s environment holds a distribution whose metadata cannot be read: {broken[0][0]} "
                       f"({broken[0][1]}){f' and {len(broken) - 1} more' if len(broken) > 1 else ''}; remove it or "
                       "reinstall that package")
    return found


def _read_answer(answer: dict, files: bool, metadata: bool, every: bool, torch: bool,
                 modules: tuple[str, ...]) -> Held:
    """The answer of held()'s worker, each part checked against what was asked; a KeyError, TypeError or
    ValueError where it is not in the shape the worker writes."""
    asked = [key for key, wanted in (("files", files), ("metadata", metadata)) if wanted]
    packages = {name: _package(name, answer["packages"][name], asked) for name in answer["packages"]}
    if (every and "every" not in answer) or (torch and not isinstance(answer.get("torch"), dict)):
        raise KeyError("an answer that was asked for")
    listed = answer.get("every", [])
    for entry in listed:
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(v, str) for v in entry)):
            raise ValueError(f"a distribution listed as {entry!r:.80}, without a name or a version")
    return Held(python=_text(answer["python"]), prefix=Path(_text(answer["prefix"])),
                site=Path(_text(answer["site"])), packages=packages,
                every=[(name, version) for name, version in listed],
                torch=dict(answer.get("torch") or {}),
                modules={name: _dirs(answer["modules"][name]["dirs"]) for name in modules},
                namespaces=frozenset(n for n in modules if answer["modules"][n]["namespace"] is True))


def import_dirs(python: str | Path, names: tuple[str, ...], regular: bool = False) -> dict[str, list[Path]]:
    """Where PYTHON would import each top-level module of NAMES from ([] where it finds none; where REGULAR, also
    for a namespace package, which a leftover directory without its __init__ is): the one answer to "what does
    this venv import", for tune's backend checks and the audit's library dirs."""
    found = held(python, modules=names)
    return {name: [] if regular and name in found.namespaces else dirs for name, dirs in found.modules.items()}


def _dirs(value) -> list[Path]:
    if not isinstance(value, list):
        raise TypeError(f"{value!r:.60} is not a list of directories")
    return [Path(_text(d)) for d in value]


def _text(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r:.60} is not text")
    return value


def _package(name: str, entry: dict, asked: list[str]) -> dict:
    for key, kind in FIELDS.items():
        if key in ("version", "root", *asked) and key not in entry:
            raise KeyError(f"{name} without its {key}")
        if key in entry and not isinstance(entry[key], kind):
            raise TypeError(f"{name}'s {key} is {entry[key]!r:.60}")
    if not all(isinstance(f, str) for f in entry.get("files", [])):
        raise TypeError(f"{name} lists a file that is not a path")
    if "metadata" in asked:  # read here, once: a caller never meets a Requires-Dist no parser takes
        requires_dist(entry["metadata"], f"{name} {entry['version']} (installed)")
    return {key: entry[key] for key in FIELDS if key in entry}
