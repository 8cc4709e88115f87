#!/usr/bin/env bash
# Make a Python base image without any container registry: debootstrap a minimal
# Debian and `docker import` it. Use it as the Dockerfile's BASE_IMAGE:
#   docker/make-base-image.sh splitrl-base:bookworm
#   docker build -f docker/Dockerfile --build-arg BASE_IMAGE=splitrl-base:bookworm -t splitrl:dev .
# Needs root, debootstrap (apt-get install -y debootstrap) and a Debian mirror.
# The image has Debian's python3 (3.11 on bookworm) as `python3`, like python:3.11-slim.
set -euo pipefail

TAG="${1:-splitrl-base:bookworm}"
SUITE="${SUITE:-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
ROOTFS="$(mktemp -d /tmp/splitrl-rootfs.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT

debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$ROOTFS" "$MIRROR"
# Keep the image small: no apt caches or lists (apt-get update re-creates them).
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
tar -C "$ROOTFS" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$TAG"
echo "imported $TAG"
