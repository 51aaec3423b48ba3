"""A fleet's `rig prove` reports as one table: REPORTS/HOST/prove.json of every host (playbooks/prove.yml fetches
them), summary.md beside them. Each report is input from a host: any field may be missing or odd."""
from __future__ import annotations

from pathlib import Path

from rig.core import RigError, numbers
from rig.core.fs import atomic_write
from rig.core.markdown import table
from rig.serving.measure.stats import shown

OUTPUTS = ("summary.md",)


def _host_row(host: str, report: object) -> dict:
    """One host's line of the fleet table, from its prove.json (input: any field may be missing or odd)."""
    if not isinstance(report, dict) or not isinstance(report.get("steps"), list):
        return {"host": host, "ok": False, "failed": ["prove.json holds no steps"], "margin": None, "sglang": None}
    steps = [s for s in report["steps"] if isinstance(s, dict)]
    failed = [str(s.get("name"))[:80] for s in steps if s.get("status") == "fail"]
    margins = [s.get("data", {}).get("min_margin") for s in steps
               if str(s.get("name", "")).endswith(": numerics") and isinstance(s.get("data"), dict)]
    known = [m for m in map(numbers.answer, margins) if m is not None]
    versions = report.get("versions")
    stopped = report.get("stopped")
    return {"host": host, "ok": report.get("ok") is True and not failed and not stopped,
            "failed": failed + ([f"stopped: {str(stopped)[:80]}"] if stopped else []),
            "margin": min(known) if known else None,
            "sglang": versions.get("sglang") if isinstance(versions, dict) else None}


def summary(reports: str | Path) -> dict:
    """REPORTS/HOST/prove.json of every host as one table (summary.md beside them); ok when every host is."""
    from rig.core.documents import load_json

    root = Path(reports)
    if not root.is_dir() or root.is_symlink():
        raise RigError(f"{root}: give the directory the hosts' reports were fetched into (HOST/prove.json)")
    rows = []
    for host in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        try:
            # a link is never followed: it could read any file on the controller into the table
            rows.append(_host_row(host.name, load_json(host / "prove.json", "prove report", follow=False)))
        except RigError as exc:
            rows.append({"host": host.name, "ok": False, "failed": [str(exc)[:200]], "margin": None, "sglang": None})
    if not rows:
        raise RigError(f"{root}: no HOST/ directory with a prove.json in it; give the directory playbooks/prove.yml "
                       "fetched the hosts' reports into")
    text = "\n".join(table(("host", "verdict", "smallest numerics margin", "sglang", "failed steps"),
                           ((r["host"], "pass" if r["ok"] else "FAIL", shown(r["margin"], 2), r["sglang"],
                             "; ".join(r["failed"]) or None) for r in rows))) + "\n"
    path = atomic_write(root / "summary.md", f"# rig prove across {len(rows)} host(s)\n\n" + text)
    ok = all(r["ok"] for r in rows)
    return {"ok": ok, "hosts": rows, "files": [str(path)],
            "msg": text + (f"every host passed ({len(rows)})" if ok else
                            f"FAILED on {', '.join(r['host'] for r in rows if not r['ok'])}")}
