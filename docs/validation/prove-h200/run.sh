#!/usr/bin/env bash
# `rig prove` on the lent one-GPU H200, from the repo root, one phase per device call. The venv is the one
# ../tune-h200/run.sh sets up first (stage 1|2|3, then setup: the locked sglang 0.5.17 over the machine's torch).
#   prove   start `rig prove --stack docs/validation/tune-h200/stack-agree.yml` detached, then wait for it
#   wait    wait for it again (a device call lasts at most 10 minutes)
# Everything rig wrote lands in /root/results/prove and comes back as $OUT/prove.tgz. NVLink multicast stays off.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
RES=/root/results; SRC=/root/rig-src; OUT=${OUT:-/tmp/out}
mkdir -p "$RES" "$OUT"

wait_done() {  # until the detached run has exited (its exit status in prove.rc) or 540 s passed
  local deadline=$((SECONDS + 540))
  while [ ! -e "$RES/prove.rc" ] && [ $SECONDS -lt $deadline ]; do sleep 10; done
  [ -e "$RES/prove.err" ] && tail -30 "$RES/prove.err"
  if [ -e "$RES/prove.rc" ]; then echo "prove exited $(cat "$RES/prove.rc")"; else echo "prove still running"; fi
  tar -C /root -czf "$OUT/prove.tgz" results
}

case $1 in
prove)
  rm -rf "$SRC" && mkdir -p "$SRC" && cp -r rig docs stacks "$SRC"/  # the detached run reads this copy
  rm -f "$RES/prove.rc"
  setsid bash -c "cd $SRC && PYTHONPATH=$SRC python3 -c 'from rig.cli import main; main()' prove \
    --stack docs/validation/tune-h200/stack-agree.yml --out $RES/prove --json \
    > $RES/prove.json 2> $RES/prove.err; echo \$? > $RES/prove.rc" < /dev/null > /dev/null 2>&1 &
  sleep 5
  wait_done ;;
wait)
  wait_done ;;
esac
