#!/usr/bin/env bash
# `rig tune` at a real model's cost on the lent one-GPU H200, from the repo root, one phase per device call:
#   stage N       move the carried wheel piece .whl/pN to /root/stage (carry.py --full-kernel cut them: FA3 needs
#                 sgl_kernel's flash_ops, which the plain carry leaves behind)
#   setup         a venv over the machine's torch 2.11.0+cu130 with the locked wheels it lacks, then the 8b test
#                 model written on the GPU (rig testmodel --shape 8b --accept 0.7)
#   tune NAME     start `rig tune --stack docs/validation/real-cost-h200/stack-NAME.yml` detached, then wait
#   wait NAME     wait for it again (a device call lasts at most 10 minutes; a tune of 11 servers takes longer)
# Everything lands in /root/results and comes back as $OUT/NAME.tgz. NVLink multicast stays off in every process.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
VENV=/root/venv; RES=/root/results; SRC=/root/rig-src; OUT=${OUT:-/tmp/out}
mkdir -p "$RES" "$OUT"
rig() { PYTHONPATH="$SRC" python3 -c 'from rig.cli import main; main()' "$@"; }
fresh_source() { rm -rf "$SRC" && mkdir -p "$SRC" && cp -r rig docs "$SRC"/; }

wait_for() {  # wait_for NAME: until the detached run has exited (its status in NAME.rc) or 540 s have passed
  local name=$1 deadline=$((SECONDS + 540))
  while [ ! -e "$RES/tune-$name.rc" ] && [ $SECONDS -lt $deadline ]; do sleep 10; done
  tail -5 "$RES/tune-$name.err"
  if [ -e "$RES/tune-$name.rc" ]; then echo "tune $name exited $(cat "$RES/tune-$name.rc")"
  else echo "tune $name still running"; fi
  tar -C /root -czf "$OUT/$name.tgz" results
}

case $1 in
stage)
  mkdir -p /root/stage && mv ".whl/p$2"/* /root/stage/ && ls /root/stage | wc -l ;;
setup)
  fresh_source
  python3 -m venv "$VENV"
  # the machine's python3 is itself a venv: its site-packages come after this venv's own, so the locked
  # transformers here shadows the machine's newer one (which crashes sglang 0.5.17 at import)
  python3 -c 'import site; print(site.getsitepackages()[0])' > "$VENV/lib/python3.12/site-packages/zz-machine.pth"
  for first in /root/stage/*.whl.part000; do  # a wheel carried in chunks, joined in order
    [ -e "$first" ] || continue
    whole=${first%.part000}; cat "$whole".part* > "$whole" && rm "$whole".part*
  done
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile /root/stage/*.whl
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$RES/versions.txt"
  /usr/bin/time -f "%e s" -o "$RES/testmodel-8b.time" \
    bash -c "cd $SRC && PYTHONPATH=$SRC python3 -c 'from rig.cli import main; main()' testmodel --shape 8b \
      --accept 0.7 --out /var/lib/rig/testmodel-8b --venv $VENV --json > $RES/testmodel-8b.json"
  cat "$RES/testmodel-8b.time"; tail -12 "$RES/testmodel-8b.json" ;;
tune)
  name=$2
  fresh_source  # the detached run reads this copy, not the call's tree
  rm -f "$RES/tune-$name.rc"
  setsid bash -c "cd $SRC && PYTHONPATH=$SRC python3 -c 'from rig.cli import main; main()' tune \
    --stack docs/validation/real-cost-h200/stack-$name.yml --out $RES/tune-$name --json \
    > $RES/tune-$name.json 2> $RES/tune-$name.err; echo \$? > $RES/tune-$name.rc" < /dev/null > /dev/null 2>&1 &
  sleep 5
  wait_for "$name" ;;
wait)
  wait_for "$2" ;;
*)
  echo "usage: run.sh stage N | setup | tune NAME | wait NAME" >&2; exit 2 ;;
esac
