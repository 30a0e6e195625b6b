#!/bin/sh
# A Python base image for sr3's Dockerfile, built from Debian's archive: for machines that
# reach no image registry (the Dockerfile's default base, python:3.11-slim, comes from one).
#
#   sudo deploy/base-image.sh [TAG]           (default sr3-base:bookworm)
#   echo SR3_BASE_IMAGE=sr3-base:bookworm >> .env && docker-compose up -d --build
#
# Needs root, debootstrap and a running Docker engine. The image has Debian's Python 3.11
# with pip usable for `pip install .` (no PEP 668 marker: the image is one application's),
# and the CA certificates of this machine (its /usr/local/share/ca-certificates too, so a
# TLS-inspecting proxy that this machine trusts is trusted inside the image as well).
# SR3_DEBIAN_MIRROR and SR3_DEBIAN_SUITE choose the archive (deb.debian.org, bookworm).
set -eu
tag=${1:-sr3-base:bookworm}
suite=${SR3_DEBIAN_SUITE:-bookworm}
mirror=${SR3_DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ "$(id -u)" != 0 ]; then
    echo "base-image.sh: run as root (debootstrap and chroot need it)" >&2
    exit 2
fi
if ! command -v debootstrap >/dev/null; then
    echo "base-image.sh: debootstrap not found (apt-get install debootstrap)" >&2
    exit 2
fi
if ! docker info >/dev/null 2>&1; then
    echo "base-image.sh: no Docker engine answers (start dockerd)" >&2
    exit 2
fi
root=$(mktemp -d "${TMPDIR:-/var/tmp}/sr3-base.XXXXXX")
cleanup() {
    # debootstrap mounts these while it installs; never delete through a mount.
    for mount in proc sys dev/pts; do
        if mountpoint -q "$root/$mount" 2>/dev/null; then umount "$root/$mount"; fi
    done
    rm -rf "$root"
}
trap cleanup EXIT
debootstrap --variant=minbase \
    --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
    "$suite" "$root" "$mirror"
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi
chroot "$root" update-ca-certificates >/dev/null
rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$root/etc/pip.conf"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$tag" >/dev/null
echo "$tag"
