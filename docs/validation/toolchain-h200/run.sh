#!/usr/bin/env bash
# Issue 27's checks on the lent one-GPU H200, from the repo root, in one device call: rig doctor (its
# toolkit-agreement check on the machine's own CUDA 13.0 tree), the python layer's cuda-agreement judged on the
# machine's own venv (torch 2.11.0+cu130) as a fresh interpreter sees it, rig machine probe with its
# peer-to-peer section, and rig's peer worker on GPU 0 with itself (one GPU: no pair to probe, but the worker's
# copy, check and timing run on a real GPU). Everything lands in $OUT. NVLink multicast stays off.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# shellcheck source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
mkdir -p "$OUT"
venv=$(python3 -c 'import sys; print(sys.prefix)')
ls -d /usr/local/cuda* > "$OUT/trees.txt"
set +e
rig doctor --cuda 13.0.2 --arch 9.0a --venv "$venv" --json > "$OUT/doctor.json" 2> "$OUT/doctor.err"
echo "doctor exited $?" >> "$OUT/doctor.err"
rig machine probe --python "$venv/bin/python" --out "$OUT/probe" --json > "$OUT/probe.summary.json" 2> "$OUT/probe.err"
echo "probe exited $?" >> "$OUT/probe.err"
set -e
PYTHONPATH="$PWD" python3 - "$venv" > "$OUT/agreement.json" <<'PY'
import json, sys
from pathlib import Path
from rig.machine import doctor
from rig.python.runtime_env import seen_by
venv = sys.argv[1]
seen = seen_by(Path(venv) / "bin" / "python")
check = doctor._agreement(venv, {**seen, "environ": {**seen["environ"], "CUDA_HOME": "/usr/local/cuda-13.0"}})
print(json.dumps({"venv": venv, "cuda_home": "/usr/local/cuda-13.0", "check": check.__dict__}, indent=1))
PY
python3 rig/machine/peer_worker.py '{"a": 0, "b": 0, "bytes": 67108864, "iters": 5}' > "$OUT/peer-self.json"
cat "$OUT/agreement.json" "$OUT/peer-self.json"
python3 -c "
import json; d = json.load(open('$OUT/doctor.json'))
for c in d['checks']: print(c['status'], c['layer'], c['name'], c['detail'][:150])"
tail -3 "$OUT/probe.err"
