#!/usr/bin/env bash
# Make sure a Docker engine answers and a Docker client on PATH builds with BuildKit
# (rig image build): reuse what is there; else, as root, install Debian's docker.io
# (whose 20.10 client speaks BuildKit by itself) and start dockerd in the background.
set -euo pipefail

log() { echo "ensure-docker: $*" >&2; }
answers() { timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }
# the same question rig.engine.buildkit asks: a client without BuildKit refuses at once
buildkit() {
    local client
    for client in $(type -ap docker); do
        DOCKER_BUILDKIT=1 "$client" build --help >/dev/null 2>&1 && return 0
    done
    return 1
}

if command -v docker >/dev/null && buildkit && answers; then
    log "Docker engine $(docker version --format '{{.Server.Version}}') already answers"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    log "no Docker engine answers or no client builds with BuildKit, and this is not root: start dockerd and install buildx, or run as root to let rig install docker.io"
    exit 1
fi
# docker.io only where no engine is installed at all: over another Docker (docker-ce with containerd.io)
# apt would remove that one to make room
if ! command -v dockerd >/dev/null; then
    log "installing Debian's docker.io"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq docker.io >/dev/null
fi
buildkit || { log "no Docker client on PATH builds with BuildKit: install the buildx plugin of the Docker installed here (docker-buildx-plugin or docker-buildx), or put a 20.10 client first on PATH"; exit 1; }
answers && { log "Docker engine $(docker version --format '{{.Server.Version}}') answers"; exit 0; }
log "starting dockerd (log: /var/log/rig-dockerd.log)"
nohup setsid dockerd >/var/log/rig-dockerd.log 2>&1 &
for _ in $(seq 60); do
    answers && { log "Docker engine $(docker version --format '{{.Server.Version}}') is up"; exit 0; }
    sleep 1
done
log "dockerd did not answer within 60 s; the end of its log:"
tail -20 /var/log/rig-dockerd.log >&2
exit 1
