#!/usr/bin/env python3
"""Render each role's README.md from its meta/argument_specs.yml (the source of truth).

    python3 scripts/role_readme.py          # rewrite the READMEs
    python3 scripts/role_readme.py --check  # exit 1 if any README is stale
"""
import sys
from pathlib import Path

import yaml

ROLES = Path(__file__).resolve().parent.parent / "roles"


def render(role: Path) -> str:
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    main = specs["main"]
    lines = [f"# {role.name}", "", main["short_description"], ""]
    lines += [f"- {d}" for d in main.get("description", [])]
    for entry, spec in specs.items():
        title = "Variables" if entry == "main" else f"Entry point `{entry}`: {spec['short_description']}"
        lines += ["", f"## {title}", "", "| variable | type | default | meaning |", "| --- | --- | --- | --- |"]
        for name, opt in spec.get("options", {}).items():
            default = f"`{opt['default']}`" if "default" in opt else "see defaults/main.yml"
            lines.append(f"| `{name}` | {opt.get('type', 'str')} | {default} | {opt['description']} |")
    if (role / "meta" / "tests.md").exists():  # a role whose tests live elsewhere says where
        lines += ["", "## Tests", "", (role / "meta" / "tests.md").read_text().strip(), ""]
    elif (role / "molecule").is_dir():
        lines += ["", "## Tests", "", "`molecule test` in this directory (run by `make test`): check, converge,",
                  "idempotence and testinfra verification against a real container.", ""]
    else:
        lines += ["", "## Tests", "", "Exercised by the Molecule scenarios of the roles that depend on it.", ""]
    return "\n".join(lines)


def main() -> int:
    stale = []
    for role in sorted(p for p in ROLES.iterdir() if (p / "meta" / "argument_specs.yml").exists()):
        readme, text = role / "README.md", render(role)
        if "--check" in sys.argv:
            if not readme.exists() or readme.read_text() != text:
                stale.append(str(readme))
        else:
            readme.write_text(text)
    if stale:
        print("stale, run scripts/role_readme.py:", *stale, sep="\n  ")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
