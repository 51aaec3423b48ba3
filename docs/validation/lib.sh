# shellcheck shell=bash
# What the GPU runbooks under docs/validation share, sourced by each (". .../lib.sh"): rig from a source copy, one
# detached run and its wait, and servers stopped by the process groups the script itself started.
# A device call lasts at most 10 minutes and a run may take longer, so a run is detached into a session of its own
# and later calls wait on its files in $RES: NAME.pid (its pid, which setsid makes its process group's id too),
# NAME.log (its output) and NAME.rc (its exit status, written when it exits).
# Settings: RES (the results folder; a script sets it before detach, wait_for or pack), OUT (what comes back),
# RIG_SRC (where rig is imported from: a source copy, or the engine bundle rig.pyz), WAIT_S (how long wait_for waits).
OUT=${OUT:-/tmp/out}; RIG_SRC=${RIG_SRC:-$PWD}; WAIT_S=${WAIT_S:-540}

rig() {  # rig ARGS...: rig from $RIG_SRC alone: -P (Python 3.11 on) keeps the working directory off sys.path,
  # where the call's own tree (or another copy) would be found first
  PYTHONPATH="$RIG_SRC" python3 -P -m rig "$@"
}

rig_source() {  # rig_source DEST: copy rig (and the docs and stacks it is run on) from the call's tree to DEST and
  # run rig from there: a detached run outlives the call, whose tree the next call replaces
  rm -rf "$1" && mkdir -p "$1" && cp -r rig docs stacks "$1"/
  RIG_SRC=$1
}

detach() {  # detach NAME CMD [ARG...]: CMD (a command or one of the script's functions) run under set -euo pipefail
  # in a session of its own, reading nothing from the call; the script's functions, RES, RIG_SRC and the variables
  # named in DETACH_VARS go with it. Refused while a run detached as NAME is still going.
  local name=$1 pid
  shift
  if [ -e "$RES/$name.pid" ] && kill -0 "$(cat "$RES/$name.pid")" 2> /dev/null; then
    echo "$name is already going (pid $(cat "$RES/$name.pid")): wait for it instead" >&2
    return 2
  fi
  rm -f "$RES/$name.rc"
  # shellcheck disable=SC2086  # DETACH_VARS is a list of names
  setsid bash -c "$(declare -f); $(declare -p RES RIG_SRC ${DETACH_VARS:-})
    (set -euo pipefail; $(printf '%q ' "$@")) > $(printf %q "$RES/$name.log") 2>&1
    echo \$? > $(printf %q "$RES/$name.rc")" < /dev/null > /dev/null 2>&1 &
  pid=$!
  echo "$pid" > "$RES/$name.pid"
  sleep 5  # the first lines of its output, for the wait that follows
}

wait_for() {  # wait_for NAME TGZ [CMD...]: until the run detached as NAME has exited or WAIT_S seconds have passed;
  # then CMD (what to show of the run), whether it exited, and $RES packed as $OUT/TGZ
  local name=$1 tgz=$2 deadline=$((SECONDS + WAIT_S))
  shift 2
  while [ ! -e "$RES/$name.rc" ] && [ $SECONDS -lt $deadline ]; do sleep 5; done
  if [ $# -gt 0 ]; then "$@"; fi
  if [ -e "$RES/$name.rc" ]; then echo "the run exited $(cat "$RES/$name.rc")"; else echo "the run is still going"; fi
  pack "$tgz"
}

pack() {  # pack TGZ: $RES as $OUT/TGZ, less the profiler's traces (their sums are in tune.json) and test models; the
  # traces beside it as $OUT/traces.tar, to be read again here (the device tool leaves out a file over its limit)
  local rc=0  # tar exits 1 where a file changed as it read it (a run still writing): what it took is kept
  mkdir -p "$OUT"
  tar -C "$(dirname "$RES")" --warning=no-file-changed --exclude='*.trace.json.gz' --exclude='models*' \
    -czf "$OUT/$1" "$(basename "$RES")" || rc=$?
  [ "$rc" -le 1 ] || { echo "tar of $RES failed (exit $rc)" >&2; return "$rc"; }
  rc=0
  (cd "$(dirname "$RES")" && find "$(basename "$RES")" -name '*.trace.json.gz' -type f -print0 \
    | tar --warning=no-file-changed --null -T - -cf "$OUT/traces.tar") || rc=$?
  [ "$rc" -le 1 ] || { echo "tar of the traces failed (exit $rc)" >&2; return "$rc"; }
}

start_group() {  # start_group PIDFILE CMD [ARG...]: CMD in the background as a process group of its own (setsid:
  # its pid is the group's id), its pid in PIDFILE; stop_groups stops it in this call (a pid file left from an
  # earlier call is never signalled: pids are reused). The caller redirects its output
  setsid "${@:2}" &
  echo $! > "$1"
  STARTED+=("$1")
}

stop_groups() {  # stop_groups: every process group start_group recorded in this call, TERM, then KILL after 30 s;
  # by group, so a server's workers (which carry other command lines) go with it, and nothing else does
  local file pgid waited
  for file in "${STARTED[@]}"; do
    pgid=$(cat "$file")
    if ! kill -0 -- "-$pgid" 2> /dev/null; then
      echo "$(basename "$file" .pid): already gone"
    else
      signal_group TERM "$pgid"
      for ((waited = 0; waited < 30; waited++)); do kill -0 -- "-$pgid" 2> /dev/null || break; sleep 1; done
      if kill -0 -- "-$pgid" 2> /dev/null; then
        echo "$(basename "$file" .pid): still up after TERM, killed"
        signal_group KILL "$pgid"
        for ((waited = 0; waited < 10; waited++)); do kill -0 -- "-$pgid" 2> /dev/null || break; sleep 1; done
      fi
    fi
  done
  STARTED=()
}

signal_group() {  # signal_group SIGNAL PGID: sent, or the group had gone already (it may exit between check and kill)
  kill -s "$1" -- "-$2" 2> /dev/null || ! kill -0 -- "-$2" 2> /dev/null
}

STARTED=()
