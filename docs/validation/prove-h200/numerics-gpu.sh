#!/usr/bin/env bash
# The numerics test model on the lent H200's own GPU kernels (cuBLAS bf16 GEMMs, SDPA attention), from the
# repo root in one device call: rig testmodel --kind numerics with the machine's python3 (torch 2.11.0+cu130,
# transformers), then the builder's own reference check again on cuda in float32 and bfloat16.
# rig prove itself needs the locked sglang staged first (tune-h200/run.sh stage, setup), which this
# session's device time (304 s) did not allow.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# shellcheck source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
} | tee "$OUT/versions.txt"
rig testmodel --kind numerics --tp 8 --out /root/numerics \
  --python "$(command -v python3)" --json > "$OUT/testmodel.json"
PYTHONPATH=. python3 - "$OUT/reference-cuda.json" <<'PY'
import json, runpy, sys
from pathlib import Path
from rig import numerics
asked = numerics.prompts()
reference = runpy.run_path("rig/testmodel_build.py")["reference"]
result = reference(Path("/root/numerics/target"), asked, [numerics.continuation(p) for p in asked], "cuda")
Path(sys.argv[1]).write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result))
PY
