#!/usr/bin/env bash
# Issue 16 on a one-GPU H200 (nvidia-h200): doctor's machine layer and rig probe, with the machine's own
# python3 (torch 2.11.0+cu130) as the venv. Run from the repo root; results in $OUT/single-gpu.tgz.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
RES=/root/results-1gpu
# shellcheck source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
mkdir -p "$RES" "$OUT"
PYTHONPATH="$RIG_SRC" python3 -c 'import json; from rig import gpu_health; print(json.dumps(gpu_health.collect(), indent=1))' \
  > "$RES/gpu-health-raw.json"
rig doctor --cuda 13.0.2 --arch 9.0a --expect-gpus 1 --json > "$RES/doctor.json" || echo "doctor: exit $?"
rig doctor --cuda 13.0.2 --arch 9.0a --expect-gpus 1 | tee "$RES/doctor.txt" || echo "doctor: exit $?"
rig probe --python "$(command -v python3)" --out "$RES/probe" | tee "$RES/probe.txt"
pack single-gpu.tgz
