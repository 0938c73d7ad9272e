#!/bin/busybox sh
# ulnic guest init (busybox). Mounts the basics, reports the virtio devices,
# then either powers off (ulnic.poweroff on the kernel command line) or
# gives a shell on the console.
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mkdir -p /proc /sys /dev /tmp /run
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
if [ -f /lib/modules/ulnic.ko ]; then
  insmod /lib/modules/ulnic.ko || echo "ulnic-guest: insmod ulnic.ko failed"
  dmesg | grep -i ulnic | sed 's/^/ulnic-guest: dmesg: /'
fi
for d in /sys/bus/virtio/devices/*; do
  [ -e "$d/device" ] || continue
  echo "ulnic-guest: virtio $(basename "$d") device=$(cat "$d/device") driver=$(basename "$(readlink "$d/driver" 2>/dev/null)" 2>/dev/null)"
done
if [ -x /bin/ulnic ]; then
  echo "ulnic-guest: tool: $(/bin/ulnic --version 2>&1)"
fi
echo "ulnic-guest: ready kernel=$(uname -r)"
if grep -q ulnic.selftest /proc/cmdline; then
  /bin/ulnic selftest 2>&1
  echo "ulnic-guest: selftest exit=$?"
fi
if grep -q ulnic.poweroff /proc/cmdline; then
  poweroff -f
fi
exec setsid cttyhack sh
