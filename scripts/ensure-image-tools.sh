#!/usr/bin/env bash
# Make sure this controller can image a venv archive (rig venv image: zstd and mksquashfs 4.5 or later, which reads
# a tar): reuse what is there; else, as root, install Debian's zstd and squashfs-tools. Without them the
# python_stack role says so and hosts unpack the archive instead of mounting its image.
set -euo pipefail

log() { echo "ensure-image-tools: $*" >&2; }
if command -v zstd >/dev/null && command -v mksquashfs >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    log "no zstd or mksquashfs here, and this is not root: install zstd and squashfs-tools for mounted venv images (hosts unpack the archive meanwhile)"
    exit 0
fi
log "installing Debian's zstd and squashfs-tools"
export DEBIAN_FRONTEND=noninteractive
# bounded: a mirror that stops answering ends this step, not the provisioning that waits on it
timeout 600 apt-get update -qq
timeout 600 apt-get install -y -qq zstd squashfs-tools >/dev/null
