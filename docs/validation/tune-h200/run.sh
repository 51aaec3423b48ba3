#!/usr/bin/env bash
# `rig tune` on the lent one-GPU H200, from the repo root, one phase per device call:
#   stage N       move the carried wheel piece .whl/pN to /root/stage (serving-h200/carry.py cut them)
#   setup         a venv over the machine's torch 2.11.0+cu130 with the locked wheels it lacks; both test models
#   tune NAME     start `rig tune --stack docs/validation/tune-h200/stack-NAME.yml` detached, then wait
#   wait NAME     wait for it again (a device call lasts at most 10 minutes; the run may take longer)
# Everything lands in /root/results and comes back as $OUT/NAME.tgz. NVLink multicast stays off in every process.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
VENV=/root/venv; RES=/root/results; SRC=/root/rig-src; RIG_SRC=$SRC
# shellcheck source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
mkdir -p "$RES" "$OUT"

tune() {  # tune NAME: its JSON in tune-NAME.json, its stderr in tune-NAME.err (the stack's path is the source copy's)
  cd "$SRC" && rig tune --stack "docs/validation/tune-h200/stack-$1.yml" --out "$RES/tune-$1" --json \
    > "$RES/tune-$1.json" 2> "$RES/tune-$1.err"
}

show() {  # show NAME: the end of its stderr, and its JSON once it has exited
  if [ -e "$RES/tune-$1.err" ]; then tail -5 "$RES/tune-$1.err"; fi
  if [ -e "$RES/tune-$1.rc" ]; then cat "$RES/tune-$1.json"; fi
}

case ${1:-} in
stage)
  mkdir -p /root/stage && mv ".whl/p$2"/*.whl /root/stage/ && ls /root/stage | wc -l ;;
setup)
  rig_source "$SRC"
  python3 -m venv "$VENV"
  # the machine's python3 is itself a venv: chain its site-packages after this venv's own, so the locked
  # transformers 5.12.1 here shadows the machine's 5.17 (which crashes sglang 0.5.17 at import)
  python3 -c 'import site; print(site.getsitepackages()[0])' > "$VENV/lib/python3.12/site-packages/zz-machine.pth"
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile /root/stage/*.whl
  "$VENV/bin/python" -c 'import importlib.metadata as m, torch
for p in ("sglang", "sglang-kernel", "flashinfer-python", "transformers", "torch"):
    print(p, m.version(p))
print("cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0))' | tee "$RES/versions.txt"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$RES/versions.txt"
  rig testmodel --out /var/lib/rig/testmodel --venv "$VENV" --json > "$RES/testmodel-agree.json"
  rig testmodel --out /var/lib/rig/testmodel-random --venv "$VENV" --draft random --json > "$RES/testmodel-random.json"
  tail -3 "$RES/testmodel-agree.json" ;;
tune)
  rig_source "$SRC"
  detach "tune-$2" tune "$2"
  wait_for "tune-$2" "$2.tgz" show "$2" ;;
wait)
  wait_for "tune-$2" "$2.tgz" show "$2" ;;
*)
  echo "usage: run.sh stage N | setup | tune NAME | wait NAME" >&2; exit 2 ;;
esac
