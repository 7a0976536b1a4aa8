#!/bin/sh
# Optional layer (LAYERS=docker): Docker inside the guest, for repositories whose CI
# needs it. Not in the default image; `dev` joins the docker group.
set -eu
root="$1"
chroot "$root" apt-get install -y -q --no-install-recommends docker.io >/dev/null
chroot "$root" usermod -aG docker dev
