#!/usr/bin/env bash
# Build (or reuse) a local Debian base image for podman when no image registry is
# reachable: debootstrap --variant=minbase bookworm + python3, python3-venv,
# redis-server.  It stands in for both python:3.11-slim (bookworm's python3 is 3.11)
# and the Redis image.
#
#   bash docker/local-base.sh            # prints the image reference on stdout
#
# Cached outside the repository in $AUTOPAR_CONTAINERS_CACHE (default
# /var/cache/autopar-containers) as a rootfs tarball named by a hash of the inputs
# (suite, variant, mirror, package list, this script); the podman image is tagged
# with the same hash, so a changed input builds a new base and an unchanged one is
# reused (import from the tarball when podman's store was wiped).  Needs root.
set -euo pipefail

SUITE="${AUTOPAR_BASE_SUITE:-bookworm}"
MIRROR="${AUTOPAR_BASE_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3,python3-venv,redis-server,passwd,ca-certificates"
CACHE="${AUTOPAR_CONTAINERS_CACHE:-/var/cache/autopar-containers}"
REPO="localhost/autopar-debian-base"

key="$( { printf '%s\n' "$SUITE" minbase "$MIRROR" "$PACKAGES"; cat "${BASH_SOURCE[0]}"; } \
        | sha256sum | cut -c1-16)"
image="$REPO:$SUITE-$key"
tarball="$CACHE/debian-base-$SUITE-$key.tar"

log() { echo "local-base: $*" >&2; }

if podman image exists "$image"; then
  log "cached image $image"
elif [ -s "$tarball" ]; then
  log "importing cached rootfs $tarball"
  podman import --quiet - "$image" < "$tarball" >/dev/null
else
  command -v debootstrap >/dev/null || { log "debootstrap not installed (apt-get install -y debootstrap)"; exit 1; }
  mkdir -p "$CACHE"
  root="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
  trap 'rm -rf "$root" "$tarball.partial"' EXIT
  log "debootstrap --variant=minbase $SUITE (+ ${PACKAGES//,/ }) into $root; a few minutes"
  start=$SECONDS
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 \
    || { tail -20 "$root.log" >&2; rm -f "$root.log"; log "debootstrap failed"; exit 1; }
  rm -f "$root.log"
  # Package lists and caches are not needed at run time.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/*
  tar -C "$root" --numeric-owner -cf "$tarball.partial" .
  mv "$tarball.partial" "$tarball"
  log "rootfs built in $((SECONDS - start)) s: $(du -h "$tarball" | cut -f1)"
  podman import --quiet - "$image" < "$tarball" >/dev/null
fi
podman tag "$image" "$REPO:$SUITE"
echo "$image"
