#!/usr/bin/env bash
# GPU evidence for issues 13 and 16, run on the lent 2-GPU H200 from the repo root, one phase per call:
#   stage N     move the carried wheel piece .whl/pN to /root/stage (carry.py cut them)
#   setup       a venv over the machine's torch 2.11.0+cu130 with the locked wheels it lacks,
#               the test models, doctor's machine layer and rig probe on one GPU and on two
#   serve NAME GRAPHS TP      EAGLE-3 (agree draft) and the baseline, smoke, rig bench interleaved
#   random      EAGLE-3 with the random draft: rig smoke must fail on its accept length
# Results go to $OUT/NAME.tgz. NVLink multicast stays off in every process (the machines are shared).
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
REPO=$PWD; VENV=/root/venv; RES=/root/results
# shellcheck source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
trap stop_groups EXIT  # a call that stops early leaves no server of its own holding the GPUs
mkdir -p "$RES" "$OUT"
# shellcheck disable=SC2054  # the commas are --concurrency's own list
BENCH=(--concurrency 1,4,16,64 --max-tokens 128 --min-requests 16 --serial-runs 3 --serial-tokens 512 --rounds 3)

derive() {  # derive NAME GRAPHS TP PORT [random]: a stack file for one server
  python3 - "$@" <<'PY'
import sys, yaml
name, graphs, tp, port = sys.argv[1], sys.argv[2] == "on", int(sys.argv[3]), int(sys.argv[4])
stack = yaml.safe_load(open("stacks/h200-sglang-0.5.17.yml"))
server = stack["server"]
server.update(tp=tp, port=port)
if len(sys.argv) > 5:
    server["testmodel_dir"] = "/var/lib/rig/testmodel-random"
if not graphs:
    server["extra_args"] = server["extra_args"] + ["--disable-cuda-graph"]
yaml.safe_dump(stack, open(f"/root/{name}.yml", "w"))
PY
}

start() {  # start LABEL STACKFILE GPUS [--baseline]: launch in the background as a process group of its own
  # (stop_groups stops it), one after the other
  local label=$1 stack=$2 gpus=$3; shift 3
  rig server args --stack "$stack" --venv "$VENV" --json "$@" > "$RES/$label-args.json"
  python3 -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))["argv"]))' "$RES/$label-args.json" \
    > "$RES/$label-argv.txt"
  mapfile -t argv < "$RES/$label-argv.txt"
  CUDA_VISIBLE_DEVICES=$gpus start_group "$RES/$label.pid" "${argv[@]}" > "$RES/$label-server.log" 2>&1
  local port; port=$(python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["argv"]; print(a[a.index("--port")+1])' "$RES/$label-args.json")
  rig smoke --url "http://127.0.0.1:$port" --timeout 420 --pid "$(cat "$RES/$label.pid")" --log "$RES/$label-server.log" \
    --json > "$RES/$label-smoke.json" || echo "smoke $label: exit $?"
  cat "$RES/$label-smoke.json" | head -c 600; echo
}

case ${1:-} in
stage)
  mkdir -p /root/stage && mv ".whl/p$2"/*.whl /root/stage/ && ls /root/stage | wc -l
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader ;;
setup)
  python3 -m venv "$VENV"
  # the machine's python3 is itself a venv (/opt/torch/.venv): chain its site-packages after this venv's own,
  # so the locked transformers 5.12.1 here shadows the machine's 5.17
  python3 -c 'import site; print(site.getsitepackages()[0])' > "$VENV/lib/python3.12/site-packages/zz-machine.pth"
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile /root/stage/*.whl
  "$VENV/bin/python" -c 'import importlib.metadata as m, torch
for p in ("sglang", "sglang-kernel", "flashinfer-python", "transformers", "tokenizers", "sgl-deep-gemm", "torch"):
    print(p, m.version(p))
print("cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' | tee "$RES/versions.txt"
  rig testmodel --out /var/lib/rig/testmodel --venv "$VENV" --tp 2 --json > "$RES/testmodel.json"
  rig testmodel --out /var/lib/rig/testmodel --venv "$VENV" --tp 2 > "$RES/testmodel-again.txt"
  rig testmodel --out /var/lib/rig/testmodel-random --venv "$VENV" --tp 2 --draft random --json > "$RES/testmodel-random.json"
  "$VENV/bin/python" - <<'PY' | tee "$RES/sglang-config.txt"
from sglang.srt.configs.model_config import ModelConfig
t = ModelConfig("/var/lib/rig/testmodel/target")
d = ModelConfig("/var/lib/rig/testmodel/draft", is_draft_model=True, speculative_algorithm="EAGLE3")
print("target", t.hf_config.architectures, "context", t.context_len, "heads", t.num_attention_heads)
print("draft", d.hf_config.architectures, "draft_vocab_size", d.hf_config.draft_vocab_size,
      "aux layers", d.hf_config.eagle_config["eagle_aux_hidden_state_layer_ids"])
PY
  PYTHONPATH="$REPO" python3 -c 'import json; from rig import gpu_health; print(json.dumps(gpu_health.collect(), indent=1))' \
    > "$RES/gpu-health-raw.json"
  rig doctor --cuda 13.0.2 --arch 9.0a --expect-gpus 2 --json > "$RES/doctor.json" || echo "doctor: exit $?"
  rig doctor --cuda 13.0.2 --arch 9.0a --expect-gpus 2 > "$RES/doctor.txt" || echo "doctor: exit $?"
  head -20 "$RES/doctor.txt"
  CUDA_VISIBLE_DEVICES=0 rig probe --venv "$VENV" --gpus 1 --out "$RES/probe-1gpu" > "$RES/probe-1gpu.txt"
  rig probe --venv "$VENV" --out "$RES/probe-2gpu" | tee "$RES/probe-2gpu.txt"
  pack setup.tgz ;;
serve)  # serve NAME GRAPHS TP
  name=$2 graphs=$3 tp=$4
  derive "$name-eagle" "$graphs" "$tp" 30000; derive "$name-base" "$graphs" "$tp" 30001
  if [ "$tp" = 1 ]; then
    start "$name-eagle" "/root/$name-eagle.yml" 0
    start "$name-base" "/root/$name-base.yml" 1 --baseline
    rig bench --url http://127.0.0.1:30000 --baseline-url http://127.0.0.1:30001 --stack "/root/$name-eagle.yml" \
      "${BENCH[@]}" --out "$RES/$name-bench" --json > "$RES/$name-bench.json" || echo "bench: exit $?"
  else  # both GPUs for each server: the baseline first, then EAGLE-3 against its results
    start "$name-base" "/root/$name-base.yml" 0,1 --baseline
    rig bench --url http://127.0.0.1:30001 --stack "/root/$name-base.yml" "${BENCH[@]}" --rounds 1 \
      --out "$RES/$name-base-bench" --json > /dev/null || echo "bench baseline: exit $?"
    stop_groups
    start "$name-eagle" "/root/$name-eagle.yml" 0,1
    rig bench --url http://127.0.0.1:30000 --baseline-results "$RES/$name-base-bench/results.json" \
      --stack "/root/$name-eagle.yml" "${BENCH[@]}" --rounds 1 --out "$RES/$name-bench" --json \
      > "$RES/$name-bench.json" || echo "bench: exit $?"
  fi
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["msg"])' "$RES/$name-bench.json" \
    || echo "no bench summary: exit $?"
  if [ -e "$RES/$name-bench/report.md" ]; then tail -15 "$RES/$name-bench/report.md"; fi
  stop_groups
  pack "$name.tgz" ;;
random)
  derive random-eagle on 1 30002 random
  start random-eagle /root/random-eagle.yml 0
  stop_groups
  pack random.tgz ;;
*)
  echo "usage: run.sh stage N | setup | serve NAME GRAPHS TP | random" >&2; exit 2 ;;
esac
