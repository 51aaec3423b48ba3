#!/usr/bin/env bash
# `rig tune` on the lent one-GPU H200, from the repo root, one phase per device call:
#   stage N       move the carried wheel piece .whl/pN to /root/stage (serving-h200/carry.py cut them)
#   setup         a venv over the machine's torch 2.11.0+cu130 with the locked wheels it lacks; both test models
#   tune NAME     start `rig tune --stack docs/validation/tune-h200/stack-NAME.yml` detached, then wait
#   wait NAME     wait for it again (a device call lasts at most 10 minutes; the run may take longer)
# Everything lands in /root/results and comes back as $OUT/NAME.tgz. NVLink multicast stays off in every process.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
VENV=/root/venv; RES=/root/results; SRC=/root/rig-src; OUT=${OUT:-/tmp/out}
mkdir -p "$RES" "$OUT"
rig() { PYTHONPATH="$SRC" python3 -c 'from rig.cli import main; main()' "$@"; }

wait_for() {  # wait_for NAME: until the detached run has exited (its exit status in NAME.rc) or 540 s passed
  local name=$1 deadline=$((SECONDS + 540))
  while [ ! -e "$RES/tune-$name.rc" ] && [ $SECONDS -lt $deadline ]; do sleep 10; done
  tail -5 "$RES/tune-$name.err" || true
  if [ -e "$RES/tune-$name.rc" ]; then echo "tune $name exited $(cat "$RES/tune-$name.rc")"; cat "$RES/tune-$name.json"
  else echo "tune $name still running"; fi
  tar -C /root -czf "$OUT/$name.tgz" results
}

case $1 in
stage)
  mkdir -p /root/stage && mv ".whl/p$2"/*.whl /root/stage/ && ls /root/stage | wc -l ;;
setup)
  rm -rf "$SRC" && mkdir -p "$SRC" && cp -r rig docs "$SRC"/
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
  name=$2
  rm -rf "$SRC" && mkdir -p "$SRC" && cp -r rig docs "$SRC"/  # the detached run reads this copy, not the call's tree
  rm -f "$RES/tune-$name.rc"
  setsid bash -c "cd $SRC && PYTHONPATH=$SRC python3 -c 'from rig.cli import main; main()' tune \
    --stack docs/validation/tune-h200/stack-$name.yml --out $RES/tune-$name --json \
    > $RES/tune-$name.json 2> $RES/tune-$name.err; echo \$? > $RES/tune-$name.rc" < /dev/null > /dev/null 2>&1 &
  sleep 5
  wait_for "$name" ;;
wait)
  wait_for "$2" ;;
esac
