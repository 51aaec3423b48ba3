#!/usr/bin/env bash
# `rig prove` on the lent one-GPU H200, from the repo root, one phase per device call. The venv is the one
# ../tune-h200/run.sh sets up first (stage 1|2|3, then setup: the locked sglang 0.5.17 over the machine's torch).
#   prove   start `rig prove --stack docs/validation/tune-h200/stack-agree.yml` detached, then wait for it
#   wait    wait for it again (a device call lasts at most 10 minutes)
# Everything rig wrote lands in /root/results/prove and comes back as $OUT/prove.tgz. NVLink multicast stays off.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
RES=/root/results; SRC=/root/rig-src; RIG_SRC=$SRC
# shellcheck source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
mkdir -p "$RES" "$OUT"

prove() {  # its JSON in prove.json, its stderr in prove.err (the stack's path is the source copy's)
  cd "$SRC" && rig prove --stack docs/validation/tune-h200/stack-agree.yml --out "$RES/prove" --json \
    > "$RES/prove.json" 2> "$RES/prove.err"
}

show() { if [ -e "$RES/prove.err" ]; then tail -30 "$RES/prove.err"; fi; }

case ${1:-} in
prove)
  rig_source "$SRC"
  detach prove prove
  wait_for prove prove.tgz show ;;
wait)
  wait_for prove prove.tgz show ;;
*)
  echo "usage: run.sh prove | wait" >&2; exit 2 ;;
esac
