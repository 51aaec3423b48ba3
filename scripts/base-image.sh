#!/usr/bin/env bash
# Build (or reuse) the base image that boxes start from, and print its tag.
#
# A box stands for a fresh GPU machine: Debian bookworm with python3 and
# python3-apt (for Ansible, check mode included), a C++ host compiler (for
# nvcc), Python's headers (a builder compiles torch extensions; the boxes
# have no network to fetch them), zstd (it unpacks rig's venv archives; an
# Ubuntu server has it, a minimal Debian not) and the host's extra CA certificates (from
# /usr/local/share/ca-certificates) so TLS to package registries verifies.
# From a registry when one answers; else debootstrap + docker import. The tag
# carries a hash of this recipe and the certificates, so the image is rebuilt
# only when one of them changes; the rootfs tarball is cached on disk as well.
set -euo pipefail

SUITE=bookworm
PACKAGES=python3,python3-apt,python3-dev,ca-certificates,g++,procps,zstd
CACHE=${RIG_CACHE:-$HOME/.cache/rig}/base
CERTS=/usr/local/share/ca-certificates

log() { echo "base-image: $*" >&2; }

recipe_hash() {
    { cat "$0"; find "$CERTS" -name '*.crt' -type f -print0 2>/dev/null | sort -z | xargs -0r cat; } |
        sha256sum | cut -c1-12
}
TAG=rig-base:$SUITE-$(recipe_hash)

if docker image inspect "$TAG" >/dev/null 2>&1; then
    log "reusing $TAG"; echo "$TAG"; exit 0
fi
mkdir -p "$CACHE"
TARBALL=$CACHE/${TAG#rig-base:}.tar

add_certs() {  # $1: root filesystem
    if compgen -G "$CERTS/*.crt" >/dev/null; then
        cp "$CERTS"/*.crt "$1$CERTS/"
        chroot "$1" update-ca-certificates >/dev/null
    fi
}

if [ ! -s "$TARBALL" ] && timeout 30 docker pull -q "debian:$SUITE" >/dev/null 2>&1; then
    log "building from debian:$SUITE pulled from a registry"
    cid=$(docker create "debian:$SUITE")
    root=$(mktemp -d); trap 'rm -rf "$root"; docker rm -f "$cid" >/dev/null' EXIT
    docker export "$cid" | tar -C "$root" -x
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    chroot "$root" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ${PACKAGES//,/ } >/dev/null && apt-get clean"
    add_certs "$root"
    tar -C "$root" -c . >"$TARBALL.partial" && mv "$TARBALL.partial" "$TARBALL"
elif [ ! -s "$TARBALL" ]; then
    command -v debootstrap >/dev/null || { log "installing debootstrap"; apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
    # The host's own Debian mirror, as its apt client is configured.
    MIRROR=$(apt-get indextargets --format '$(REPO_URI)' 'Created-By: Packages' 'Label: Debian' \
        "Codename: $SUITE" 2>/dev/null | head -1)
    [ -n "$MIRROR" ] || { log "no Debian $SUITE mirror in this host's apt sources; run apt-get update or add one"; exit 1; }
    log "no registry answers; debootstrap $SUITE from $MIRROR (a few minutes, once)"
    root=$(mktemp -d); trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
        { log "debootstrap failed; see $CACHE/debootstrap.log"; tail -5 "$CACHE/debootstrap.log" >&2; exit 1; }
    add_certs "$root"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . >"$TARBALL.partial" && mv "$TARBALL.partial" "$TARBALL"
fi
log "importing $TARBALL as $TAG"
docker import -c 'CMD ["sleep", "infinity"]' "$TARBALL" "$TAG" >/dev/null
echo "$TAG"
