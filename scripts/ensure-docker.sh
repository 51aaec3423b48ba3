#!/usr/bin/env bash
# Make sure a Docker engine answers: reuse a running one; else, as root, install
# Debian's docker.io and start dockerd in the background.
set -euo pipefail

log() { echo "ensure-docker: $*" >&2; }
answers() { timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if command -v docker >/dev/null && answers; then
    log "Docker engine $(docker version --format '{{.Server.Version}}') already answers"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    log "no Docker engine answers and this is not root: start dockerd, or run as root to let rig install docker.io"
    exit 1
fi
if ! command -v dockerd >/dev/null; then
    log "installing Debian's docker.io"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq docker.io >/dev/null
fi
log "starting dockerd (log: /var/log/rig-dockerd.log)"
nohup setsid dockerd >/var/log/rig-dockerd.log 2>&1 &
for _ in $(seq 60); do
    answers && { log "Docker engine $(docker version --format '{{.Server.Version}}') is up"; exit 0; }
    sleep 1
done
log "dockerd did not answer within 60 s; the end of its log:"
tail -20 /var/log/rig-dockerd.log >&2
exit 1
