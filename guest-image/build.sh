#!/usr/bin/env bash
# Build the aiworker guest base image: a Debian root filesystem (mmdebstrap), an ext4
# image made without loop mounts (mkfs.ext4 -d), converted to qcow2, with the kernel and
# initrd beside it for direct kernel boot, and a manifest with the SHA-256 of each file.
#
# Inputs (environment; every one is written into the manifest):
#   OUT             the folder to write (created; must not exist or be empty)   required
#   HOST_KEY        the guest's ed25519 SSH host key (private, OpenSSH format):
#                   generated per provisioning, never shipped                    required
#   CLIENT_KEY_PUB  the public key allowed to log in as root (the control link)  required
#   SUITE           Debian suite                                default bookworm
#   MIRROR          Debian mirror                               default http://deb.debian.org/debian
#   DISK_SIZE       the root filesystem's size (truncate -s)    default 4G
#   EXTRA_PACKAGES  packages beyond the base set, space-separated
#   LAYERS          optional layers from layers/, space-separated (e.g. "docker")
# Runs as root (mmdebstrap --mode=root; mkfs.ext4 -d keeps owners from the tree).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${OUT:?OUT is required}" "${HOST_KEY:?HOST_KEY is required}"
: "${CLIENT_KEY_PUB:?CLIENT_KEY_PUB is required}"
SUITE="${SUITE:-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
DISK_SIZE="${DISK_SIZE:-4G}"
EXTRA_PACKAGES="${EXTRA_PACKAGES:-}"
LAYERS="${LAYERS:-}"
# The base set: the cloud kernel (virtio, half the size of the generic one), systemd
# (with libpam-systemd, which gives a lingering user its own manager, as on any
# systemd host), SSH, and what repositories commonly need to build and test.
PACKAGES="linux-image-cloud-amd64 systemd-sysv libpam-systemd dbus iproute2 openssh-server
openssh-sftp-server sudo git python3 python3-venv ca-certificates curl make xz-utils
build-essential $EXTRA_PACKAGES"

if [[ $(id -u) != 0 ]]; then
  echo "build.sh: run as root (mmdebstrap --mode=root)" >&2
  exit 2
fi
mkdir -p "$OUT"
if [[ -n $(ls -A "$OUT") ]]; then
  echo "build.sh: $OUT is not empty" >&2
  exit 2
fi
rootfs="$OUT/.rootfs"
# --one-file-system: a stopped mmdebstrap may leave the host's /proc, /sys or /dev mounted in there
trap 'rm -rf --one-file-system "$rootfs" "$OUT/base.raw"' EXIT
export HOST_KEY CLIENT_KEY_PUB LAYERS GUEST_IMAGE_DIR="$here"

include=$(echo $PACKAGES | tr ' ' ',')
mmdebstrap --variant=apt --mode=root --quiet \
  --include="$include" \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --setup-hook='"$GUEST_IMAGE_DIR"/initramfs-setup.sh "$1"' \
  --customize-hook='"$GUEST_IMAGE_DIR"/customize.sh "$1"' \
  "$SUITE" "$rootfs" "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main"

cp "$(ls "$rootfs"/boot/vmlinuz-* | sort | tail -1)" "$OUT/vmlinuz"
cp "$(ls "$rootfs"/boot/initrd.img-* | sort | tail -1)" "$OUT/initrd.img"
rm -rf "$rootfs"/boot/initrd.img-*
truncate -s "$DISK_SIZE" "$OUT/base.raw"
mkfs.ext4 -q -F -L rootfs -d "$rootfs" "$OUT/base.raw"
qemu-img convert -f raw -O qcow2 "$OUT/base.raw" "$OUT/base.qcow2"
rm -f "$OUT/base.raw"
kernel_version=$(ls "$rootfs"/lib/modules | sort | tail -1)
rm -rf "$rootfs"

python3 - "$OUT" "$SUITE" "$MIRROR" "$DISK_SIZE" "$PACKAGES" "$LAYERS" "$kernel_version" <<'PY'
import hashlib, json, sys, time
from pathlib import Path
out, suite, mirror, size, packages, layers, kernel = sys.argv[1:]
def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
files = {n: {"sha256": digest(Path(out, n)), "bytes": Path(out, n).stat().st_size}
         for n in ("base.qcow2", "vmlinuz", "initrd.img")}
manifest = {
    "schema": "aiworker.guest-image.v1",
    "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "inputs": {"suite": suite, "mirror": mirror, "disk_size": size,
               "packages": packages.split(), "layers": layers.split()},
    "kernel": kernel,
    # init_on_free: freed pages are zeroed, so the saved state (dropped caches before
    # the save) holds only pages in use and loads faster.
    "append": "root=/dev/vda rw console=ttyS0 panic=-1 quiet init_on_free=1",
    "user": "dev",
    "files": files,
}
Path(out, "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
PY
echo "built $OUT"
