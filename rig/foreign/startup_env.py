"""What a fresh interpreter's startup set, run by rig.python.runtime_env.seen_by with an empty environment:
whether rig's runtime module (named by the argument) loaded, what it declares, and the environment it left.
One JSON line back."""
import json
import os
import sys

if __name__ == "__main__":
    module = sys.modules.get(sys.argv[1])
    declared = {**module.PINNED, **module.DEFAULTS, **getattr(module, "HOME_PATHS", {})} if module else {}
    print(json.dumps({"loaded": module is not None, "declared": declared, "environ": dict(os.environ)}))
