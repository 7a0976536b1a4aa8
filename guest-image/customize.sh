#!/bin/sh
# mmdebstrap customize hook: identity, network, SSH with the pinned host key, the
# unprivileged user, and units that only cost boot time in a disposable guest.
set -eu
root="$1"
echo guest > "$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 guest\n' > "$root/etc/hosts"
echo '/dev/vda / ext4 rw,relatime 0 1' > "$root/etc/fstab"
: > "$root/etc/machine-id"   # each fresh overlay makes its own at boot
: > "$root/etc/resolv.conf"  # no DNS: the host proxy resolves names

# Restricted user networking: a static address (no DHCP wait), no default route and no
# DNS; the only way out is the host proxy at 10.0.2.100:3128.
mkdir -p "$root/etc/systemd/network"
cat > "$root/etc/systemd/network/20-wired.network" <<'NET'
[Match]
Name=en* eth*

[Network]
Address=10.0.2.15/24
LinkLocalAddressing=no
IPv6AcceptRA=no
NET
chroot "$root" systemctl enable systemd-networkd >/dev/null 2>&1
for unit in modprobe@dm_mod.service modprobe@fuse.service modprobe@loop.service \
  modprobe@efi_pstore.service modprobe@drm.service modprobe@configfs.service \
  sys-kernel-debug.mount sys-kernel-tracing.mount sys-kernel-config.mount \
  dev-hugepages.mount systemd-binfmt.service proc-sys-fs-binfmt_misc.automount \
  getty-static.service getty@tty1.service serial-getty@ttyS0.service \
  e2scrub_reap.service systemd-pstore.service systemd-networkd-wait-online.service \
  apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer fstrim.timer \
  e2scrub_all.timer; do
  chroot "$root" systemctl mask "$unit" >/dev/null 2>&1
done

# SSH: only the pinned host key of this provisioning; root by key only (the control
# link); no passwords.
rm -f "$root"/etc/ssh/ssh_host_*
install -m 0600 "$HOST_KEY" "$root/etc/ssh/ssh_host_ed25519_key"
cat > "$root/etc/ssh/sshd_config.d/aiworker.conf" <<'SSHD'
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UseDNS no
# No PAM session (logind) per login: under TCG it made each first command ~0.6 s slower.
UsePAM no
PrintMotd no
PrintLastLog no
MaxSessions 64
MaxStartups 64:30:128
SSHD
# -r: no re-exec of sshd per connection; under TCG the re-exec was most of a login.
echo 'SSHD_OPTS="-r"' > "$root/etc/default/ssh"
install -d -m 0700 "$root/root/.ssh"
install -m 0600 "$CLIENT_KEY_PUB" "$root/root/.ssh/authorized_keys"

# The unprivileged user every phase and check runs as: no sudo, no password.
chroot "$root" useradd --create-home --uid 1000 --shell /bin/bash dev
chroot "$root" passwd --lock dev >/dev/null

for layer in ${LAYERS:-}; do
  "$GUEST_IMAGE_DIR/layers/$layer.sh" "$root"
done
