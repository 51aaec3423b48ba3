"""One reader of numbers and JSON, one JSON writer: JSON goes in through rig.core.documents.parse_json
(numbers bounded by rig.core.numbers) and out through documents.dump_json (never NaN or Infinity), and
float() is never applied to input elsewhere. A new json.dump, json.loads or float() outside them fails here."""
import re
from pathlib import Path

import rig

RIG = Path(rig.__file__).parent
BYPASS = re.compile(r"\bjson\.(dumps?|loads?)\(|\bfloat\((?!\s*[\"'])")  # float("inf") is a constant, not input
ALLOWED = {
    "core/documents.py": "the one JSON reader and writer",
    "core/numbers.py": "the one reader of numbers",
    "foreign/": "scripts other interpreters run, which cannot import rig",
    # a template filter writing a Python literal (ensure_ascii off: characters beyond the basic plane stay
    # whole), not JSON output; its values are checked by the environment's validator first
    "python/runtime_env.py": "a Python literal in a template, not a JSON document",
}


def bypasses() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(RIG.rglob("*.py")):
        rel = path.relative_to(RIG).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if BYPASS.search(line.split("#", 1)[0]):
                found.setdefault(rel, []).append(f"{rel}:{number}: {line.strip()}")
    return found


def covers(entry: str, rel: str) -> bool:
    return rel == entry or entry.endswith("/") and rel.startswith(entry)


def test_no_json_or_float_of_input_outside_the_one_reader_and_writer():
    outside = [hit for rel, hits in bypasses().items() if not any(covers(e, rel) for e in ALLOWED)
               for hit in hits]
    assert not outside, "use rig.core.documents (parse_json, dump_json) or rig.core.numbers:\n" + "\n".join(outside)


def test_the_allow_list_holds_no_entry_that_is_no_longer_needed():
    found = bypasses()
    stale = [entry for entry in ALLOWED if not any(covers(entry, rel) for rel in found)]
    assert not stale, f"drop these from ALLOWED: {stale}"
