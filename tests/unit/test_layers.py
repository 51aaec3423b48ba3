"""rig's subpackages are layers: each imports only itself and the layers before it, so that reading the
package list from the top tells what builds on what (the order is in rig/__init__.py's docstring)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import rig

RIG = Path(rig.__file__).parent
LAYERS = ["core", "engine", "stack", "python", "cuda", "kernels", "patches", "machine", "serving", "image", "ci",
          "cli"]
# what core may take from outside the standard library: the parsers every document needs
CORE_THIRD_PARTY = {"yaml", "packaging"}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "rig"


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module PATH imports, at any depth (function-level imports too), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, node.module)]
            if node.module == "rig":  # `from rig import serving` names a layer
                found += [(node.lineno, f"rig.{alias.name}") for alias in node.names]
    return found


FOREIGN = RIG / "foreign"  # scripts other interpreters run: read as text, never imported


def modules() -> list[tuple[Path, str]]:
    return [(path, layer_of("rig." + ".".join(path.relative_to(RIG).with_suffix("").parts)))
            for path in sorted(RIG.rglob("*.py")) if FOREIGN not in path.parents]


def test_the_package_docstring_lists_the_layers_in_order():
    assert ", ".join(LAYERS) in " ".join(rig.__doc__.split())


def test_every_module_sits_in_a_layer():
    assert [str(p.relative_to(RIG)) for p, layer in modules() if layer == "rig"] == ["__init__.py", "__main__.py"]
    assert sorted(p.name for p in RIG.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(
        LAYERS + ["templates", "foreign"])


def test_the_foreign_scripts_import_no_rig_and_are_read_only_through_core_proc():
    """They run in a venv's Python, where rig is not installed; each one is run by its name, and the table of
    rig/foreign/README.md lists every one."""
    scripts = sorted(p.stem for p in FOREIGN.glob("*.py"))
    assert scripts and not (FOREIGN / "__init__.py").exists()
    assert [f"{s}:{line} imports {n}" for s in scripts for line, n in imports(FOREIGN / f"{s}.py")
            if n.split(".")[0] == "rig"] == []
    sources = "\n".join(path.read_text() for path, _ in modules())
    assert [s for s in scripts if f'"{s}"' not in sources] == []
    assert "foreign" not in "".join(n for path, _ in modules() for _, n in imports(path))
    table = (FOREIGN / "README.md").read_text()
    assert [s for s in scripts if f"`{s}.py`" not in table] == []


def test_each_layer_imports_only_itself_and_the_layers_before_it():
    upward = []
    for path, layer in modules():
        if layer == "rig":
            continue
        for line, name in imports(path):
            if name == "rig" or name.startswith("rig."):
                used = layer_of(name)
                if used != "rig" and LAYERS.index(used) > LAYERS.index(layer):
                    upward.append(f"{path.relative_to(RIG)}:{line} ({layer}) imports {name} ({used})")
    assert upward == []


def test_core_needs_only_the_standard_library_and_the_document_parsers():
    outside = [f"{path.relative_to(RIG)}:{line} imports {name}" for path, layer in modules() if layer == "core"
               for line, name in imports(path)
               if name.split(".")[0] not in sys.stdlib_module_names | CORE_THIRD_PARTY | {"rig"}]
    assert outside == []


def test_the_checker_sees_an_upward_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from rig.serving import smoke\n    from rig import cli\n")
    assert [layer_of(name) for _, name in imports(sample)] == ["serving", "rig", "cli"]
