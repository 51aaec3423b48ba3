#!/usr/bin/env bash
# rig prove and rig tune at a real model's cost on the lent one-GPU H200, from the repo root, one phase per device call:
#   stage N...  move the carried wheel pieces .whl/pN to $STAGE (carry.py cut them under the call's 64 MiB)
#   all         detached: setup, then the phases of $PHASES in order, each one's exit status and wall time in
#               $RES; then wait. Phases: prove (`rig prove` on stack-greedy.yml), tune-t1 and tune-greedy (`rig tune`
#               on stack-t1.yml, stack-greedy.yml), free-off and free-off-greedy (issue 55: rig's free-off patches
#               applied to the venv's sglang, then `rig tune` on stack-free-off-t1.yml or stack-free-off-greedy.yml),
#               free-off-policy (the same on stack-free-off-policy.yml: the policy beside its one step-0 server, rounds),
#               free-off-check (free-off-policy with RIG_FREE_OFF_CHECK=1: ingest's draft KV against extend's, logged),
#               free-off-0523 (free-off-policy on sglang 0.5.23 with its torch 2.14.1: stack-free-off-0523.yml, the
#               wheels carried by `carry.py --lock ...stack-free-off-0523.lock --machine PIP_JSON`),
#               free-off-prove (issue 71: the patches, then `rig prove`'s free-off steps alone on stack-free-off-prove.yml),
#               free-off-tp (issue 76, a machine of N GPUs: `rig prove` at TP N, its free-off steps included, and
#               `rig tune` on the policy stack at TP N; N is nvidia-smi's count, or $GPUS where there is none).
#               Default: the first three; e.g. PHASES="free-off free-off-greedy" for the free-off runs alone;
#               TUNE_ARGS (e.g. "--concurrency 16,256") go to every rig tune, as PROVE_ARGS to rig prove;
#               BACKEND (e.g. flashinfer) serves every stack with that attention backend in triton's place (copies
#               in $RES/stacks); flashinfer gets a 1 GiB workspace (run 15: EAGLE-3's verify at graph 256
#               asked 574 MiB of SGLang's 384) unless SGLANG_FLASHINFER_WORKSPACE_SIZE says otherwise; DRAFT_BACKEND
#               (with BACKEND) serves the draft with that attention backend (--speculative-draft-attention-backend);
#               PROFILE_AT (e.g. 1,256) profiles those levels' full batches in every tune (tune.profile_levels in the
#               copies): the kernels' sums and how long the GPU sat idle in their span (run 21's question);
#               PROFILE_HOST=1 (with PROFILE_AT) records the host's Python in those profiles too (tune.profile_host)
#   wait        wait for it again (a device call lasts at most 10 minutes; the whole run takes longer)
# setup: a venv over the machine's own Python (its torch 2.11.0+cu130) through a .pth file, the staged wheels it
# lacks installed into it, and rig's environment module (`rig env install`), so doctor holds it as rig would.
# The 8b test model is written by the first command that needs it (rig's record keeps it for the rest).
# Everything lands in $RES and comes back as $OUT/results.tgz (the profiler's traces stay there: their kernel
# sums are in tune.json). NVLink multicast stays off in every process.
# The CPU rehearsal (tests/integration/test_runbooks.py) runs this same script against the SGLang stand-in with
# every path below pointed into a scratch directory and the stacks' test model made tiny.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export SGLANG_LOG_MS=1  # the servers' log lines carry milliseconds: a step's time is read from them
VENV=${VENV:-/root/venv}; RES=${RES:-/root/results}; SRC=${SRC:-/root/rig-src}; STAGE=${STAGE:-/root/stage}
OUT=${OUT:-/tmp/out}; STACKS=${STACKS:-docs/validation/real-cost-h200}; PROVE_ARGS=${PROVE_ARGS:-}; TUNE_ARGS=${TUNE_ARGS:-}
WAIT_S=${WAIT_S:-540}; WHEELS=${WHEELS:-.whl}; PHASES=${PHASES:-prove tune-t1 tune-greedy}; GPUS=${GPUS:-}
BACKEND=${BACKEND:-}; DRAFT_BACKEND=${DRAFT_BACKEND:-}; PROFILE_AT=${PROFILE_AT:-}; PROFILE_HOST=${PROFILE_HOST:-}
KNOWN="prove tune-t1 tune-greedy free-off free-off-greedy free-off-policy free-off-check free-off-0523 free-off-prove free-off-tp"
mkdir -p "$RES" "$OUT"
VENV=$(realpath -m "$VENV"); RES=$(realpath -m "$RES"); SRC=$(realpath -m "$SRC"); STAGE=$(realpath -m "$STAGE")
RIG_SRC=$SRC
# shellcheck source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
DETACH_VARS="VENV SRC STAGE STACKS PROVE_ARGS TUNE_ARGS PHASES KNOWN GPUS BACKEND DRAFT_BACKEND PROFILE_AT PROFILE_HOST"  # what the detached pipeline reads

rig_in() {  # rig_in NAME ARGS...: rig from the source copy; its JSON, stderr, exit status and wall time in $RES
  local name=$1 start=$SECONDS rc=0
  shift
  (cd "$SRC" && rig "$@") > "$RES/$name.json" 2> "$RES/$name.err" || rc=$?
  echo "$rc" > "$RES/$name.rc"
  echo "$name: exit $rc after $((SECONDS - start)) s" | tee -a "$RES/phases.txt"
}

setup() {
  rig_source "$SRC"
  case $STACKS in /*) ;; *) STACKS=$SRC/$STACKS ;; esac
  if [ -n "$BACKEND$PROFILE_AT" ]; then stack_copies; fi
  python3 -m venv "$VENV"
  # the machine's python3 is itself a venv: what it imports (its site-packages and the directories its .pth files
  # add) comes after this venv's own, so the locked transformers here shadows the machine's newer one (which
  # crashes sglang 0.5.17 at import)
  python3 -c 'import sys, sysconfig
std = sysconfig.get_paths()["stdlib"]
print("\n".join(p for p in sys.path if p and not p.startswith(std) and not p.endswith(".zip")))' \
    > "$(echo "$VENV"/lib/python3*/site-packages)/zz-machine.pth"
  for first in "$STAGE"/*.whl.part000; do  # a wheel carried in chunks, joined in order
    [ -e "$first" ] || continue
    whole=${first%.part000}; cat "$whole".part* > "$whole" && rm "$whole".part*
  done
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile "$STAGE"/*.whl
  rig_in env-install env install --venv "$VENV" --stack "$STACKS/stack-greedy.yml"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$RES/versions.txt"
  else
    echo "no nvidia-smi on this machine (a CPU rehearsal)" | tee "$RES/versions.txt"
  fi
  # the host beside the GPU: its kernel names the runtime (gVisor says 4.4.0, Firecracker an -fc- kernel), and a
  # server bound by its host runs at its CPU's pace
  { echo "kernel $(uname -r)"; echo "cpus $(nproc)"; grep -m1 '^model name' /proc/cpuinfo || echo "model name unknown"; } \
    | tee -a "$RES/versions.txt"
}

stack_copies() {  # stack_copies [check]: every stack read and written as YAML into $RES/stacks with what the run
  # asks beyond it, beside its lock; STACKS then names the copies. BACKEND in triton's place (checked: each served
  # with triton alone), DRAFT_BACKEND on every line, PROFILE_AT as tune.profile_levels (checked: levels each tune
  # measures, by the stack's bench.concurrency or TUNE_ARGS' --concurrency), PROFILE_HOST=1 as tune.profile_host.
  # `check` writes nothing
  local into=$RES/stacks lock
  if [ "${1:-write}" = write ]; then mkdir -p "$into"; fi
  python3 -P - "$STACKS" "$into" "$BACKEND" "$DRAFT_BACKEND" "$PROFILE_AT" "$PROFILE_HOST" "$TUNE_ARGS" "${1:-write}" <<'PY' || return
import pathlib, shlex, sys
import yaml
source, into = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
backend, draft, profile, host, tune_args, mode = sys.argv[3:]
levels = [int(level) for level in profile.split(",")] if profile else []
if len(set(levels)) < len(levels):
    sys.exit(f"PROFILE_AT={profile} lists a level twice")
words = shlex.split(tune_args)
given = [w.split("=", 1)[1] if "=" in w else (words[i + 1] if i + 1 < len(words) else "")
         for i, w in enumerate(words) if w == "--concurrency" or w.startswith("--concurrency=")]
for stack in sorted(source.glob("stack-*.yml")):
    data = yaml.safe_load(stack.read_text())
    if backend:
        if data["server"].get("attention_backends") != ["triton"]:
            sys.exit(f"BACKEND={backend}: {stack} does not serve with triton alone, so it has no backend to replace")
        data["server"]["attention_backends"] = [backend]
    if draft:  # every line: the baseline's parser takes it too, and has no draft to use it
        data["server"]["extra_args"] = [*data["server"].get("extra_args", []),
                                        "--speculative-draft-attention-backend", draft]
    if levels:
        measured = given[-1].split(",") if given else [str(c) for c in data["bench"]["concurrency"]]
        if missing := [level for level in levels if str(level) not in measured]:
            sys.exit(f"PROFILE_AT={profile}: {stack.name}'s tunes measure no level {missing[0]} (they measure "
                     f"{','.join(measured)}): profile levels the run measures")
        data["tune"] = {**(data.get("tune") or {}), "profile_levels": levels, **({"profile_host": True} if host == "1"
                                                                                 else {})}
    if mode == "write":
        (into / stack.name).write_text(yaml.safe_dump(data, sort_keys=False))
PY
  if [ "${1:-}" = check ]; then return; fi
  for lock in "$STACKS"/stack-*.lock; do
    if [ -f "$lock" ]; then cp "$lock" "$into/"; fi
  done
  STACKS=$into
  if [ "$BACKEND" = flashinfer ]; then export SGLANG_FLASHINFER_WORKSPACE_SIZE=${SGLANG_FLASHINFER_WORKSPACE_SIZE:-1073741824}; fi
  # what the run changed beyond its stacks, what every server inherits included: recorded beside the machine's versions
  echo "${BACKEND:+BACKEND=$BACKEND }${DRAFT_BACKEND:+DRAFT_BACKEND=$DRAFT_BACKEND }${PROFILE_AT:+PROFILE_AT=$PROFILE_AT }${PROFILE_HOST:+PROFILE_HOST=$PROFILE_HOST }${SGLANG_FLASHINFER_WORKSPACE_SIZE:+SGLANG_FLASHINFER_WORKSPACE_SIZE=$SGLANG_FLASHINFER_WORKSPACE_SIZE}" \
    > "$RES/stacks.txt"
}

free_off_patches() {  # free_off_patches PHASE STACK [ARG...]: rig's free-off patches alone, applied for STACK (a no-op
  # again); ARGs go to rig patch apply
  mkdir -p "$SRC/free-off-patches" && cp "$SRC"/rig/patches/set/sglang-free-off-*.yml "$SRC/free-off-patches/"
  rig_in "patch-$1" patch apply --stack "$2" --patches "$SRC/free-off-patches" --json "${@:3}"
}

phase() {
  case $1 in
  prove) rig_in prove prove --stack "$STACKS/stack-greedy.yml" --out "$RES/prove" $PROVE_ARGS --json ;;
  tune-t1|tune-greedy) rig_in "$1" tune --stack "$STACKS/stack-${1#tune-}.yml" --out "$RES/$1" $TUNE_ARGS --json ;;
  free-off|free-off-greedy|free-off-policy|free-off-check|free-off-0523)
    # the free-off patches alone (the stack opts in): the SM120 ones change nothing a TP-1 SM90 run measures;
    # a second apply (free-off-greedy after free-off) is a no-op. free-off-check: the policy stack with
    # RIG_FREE_OFF_CHECK=1 (and its opt-in patch), so each ingest step also runs the draft extend and logs how far
    # their draft KV differ
    local kind=t1 check=0 out opt=; [ "$1" = free-off ] || kind=${1#free-off-}
    out=tune-free-off-$kind
    if [ "$kind" = check ]; then kind=policy check=1 opt=free-off-check; fi
    free_off_patches "$1" "$STACKS/stack-free-off-$kind.yml" ${opt:+--opt-in "$opt"}
    RIG_FREE_OFF_CHECK=$check rig_in "$out" tune --stack "$STACKS/stack-free-off-$kind.yml" --out "$RES/$out" \
      $TUNE_ARGS --json ;;
  free-off-prove)
    # the steps that need a free-off server alone: the numerics model is built, the rest is proven elsewhere
    free_off_patches "$1" "$STACKS/stack-free-off-prove.yml"
    rig_in prove-free-off prove --stack "$STACKS/stack-free-off-prove.yml" --out "$RES/prove-free-off" \
      --skip doctor --skip probe --skip servers --skip acceptance $PROVE_ARGS --json ;;
  free-off-tp)
    local gpus=${GPUS:-$(nvidia-smi -L | wc -l)} kind
    for kind in prove policy; do  # the stacks at TP N: their one `tp:` line, rewritten into $RES
      sed "s/^  tp: 1\$/  tp: $gpus/" "$STACKS/stack-free-off-$kind.yml" > "$RES/stack-free-off-$kind-tp$gpus.yml"
      grep -q "^  tp: $gpus\$" "$RES/stack-free-off-$kind-tp$gpus.yml"
    done
    free_off_patches "$1" "$RES/stack-free-off-prove-tp$gpus.yml"
    rig_in "prove-tp$gpus" prove --stack "$RES/stack-free-off-prove-tp$gpus.yml" --out "$RES/prove-tp$gpus" \
      --skip doctor $PROVE_ARGS --json
    rig_in "tune-free-off-tp$gpus" tune --stack "$RES/stack-free-off-policy-tp$gpus.yml" \
      --out "$RES/tune-free-off-tp$gpus" $TUNE_ARGS --json ;;
  *) echo "unknown phase $1 (known: $KNOWN)" >&2; return 2 ;;
  esac
}

pipeline() {
  rm -f "$RES/phases.txt"
  setup
  trap stop_groups EXIT
  watch_machine
  for name in $PHASES; do phase "$name"; done
}

watch_machine() {  # the host's pace and the GPU's clocks every 5 s into $RES (watch.py); it ends with the run, killed too
  start_group "$RES/watch.pid" python3 -P "$SRC/docs/validation/real-cost-h200/watch.py" "$RES" > "$RES/watch.log" 2>&1
}

show_phases() { if [ -e "$RES/phases.txt" ]; then cat "$RES/phases.txt"; fi; }

case ${1:-} in
stage)
  shift
  mkdir -p "$STAGE"
  for n in "$@"; do mv "$WHEELS/p$n"/* "$STAGE"/; done
  ls "$STAGE" | wc -l ;;
all)
  for name in $PHASES; do  # refused before anything starts
    case " $KNOWN " in *" $name "*) ;; *) echo "unknown phase $name in PHASES (known: $KNOWN)" >&2; exit 2 ;; esac
  done
  case $BACKEND in ""|triton|flashinfer|fa3) ;; *) echo "unknown BACKEND $BACKEND (triton, flashinfer or fa3)" >&2; exit 2 ;; esac
  case $DRAFT_BACKEND in ""|triton|flashinfer|fa3) ;; *) echo "unknown DRAFT_BACKEND $DRAFT_BACKEND (triton, flashinfer or fa3)" >&2; exit 2 ;; esac
  if [ -n "$DRAFT_BACKEND" ] && [ -z "$BACKEND" ]; then echo "DRAFT_BACKEND needs BACKEND (the target's)" >&2; exit 2; fi
  if ! [[ $PROFILE_AT =~ ^([1-9][0-9]{0,4}(,[1-9][0-9]{0,4})*)?$ ]]; then
    echo "PROFILE_AT=$PROFILE_AT is not a comma-separated list of concurrencies (e.g. 1,256)" >&2; exit 2
  fi
  case $PROFILE_HOST in ""|0|1) ;; *) echo "PROFILE_HOST=$PROFILE_HOST is neither 1 nor 0" >&2; exit 2 ;; esac
  if [ "$PROFILE_HOST" = 1 ] && [ -z "$PROFILE_AT" ]; then echo "PROFILE_HOST=1 needs PROFILE_AT (the levels)" >&2; exit 2; fi
  if [ -n "$BACKEND$PROFILE_AT" ]; then stack_copies check || exit 2; fi
  detach all pipeline
  wait_for all results.tgz show_phases ;;
wait)
  wait_for all results.tgz show_phases ;;
*)
  echo "usage: run.sh stage N... | all | wait" >&2; exit 2 ;;
esac
