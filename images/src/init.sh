#!/bin/busybox sh
# ulnic guest init (busybox). Mounts the basics, reports the virtio devices,
# then either powers off (ulnic.poweroff on the kernel command line) or
# gives a shell on the console.
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mkdir -p /proc /sys /dev /tmp /run
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
if [ -f /lib/modules/ulnic.ko ]; then
  insmod /lib/modules/ulnic.ko || echo "ulnic-guest: insmod ulnic.ko failed"
  dmesg | grep -i ulnic | sed 's/^/ulnic-guest: dmesg: /'
fi
for m in failover net_failover virtio_net; do
  [ -f /lib/modules/$m.ko ] && insmod /lib/modules/$m.ko
done
ip link set lo up
chmod 1777 /tmp
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p" | head -n 1; }
# Every node's name (nodeN) at its segment address, which is also its
# ulnic address for the preload layer; this node's name as hostname.
{
  echo "127.0.0.1 localhost"
  echo "::1 localhost ip6-localhost ip6-loopback"
  i=0
  while [ "$i" -lt "$(arg ulnic.nodes)" ] 2>/dev/null; do
    echo "10.81.0.$((i + 1)) node$i"
    i=$((i + 1))
  done
} > /etc/hosts
if [ -n "$(arg ulnic.node)" ]; then
  echo "node$(arg ulnic.node)" > /etc/hostname
  hostname "node$(arg ulnic.node)"
fi
# The network whose addresses are ulnic nodes for the preload layer
# (node n is 10.81.0.(n+1)); eth0 carries the same addresses over the
# kernel's TCP, so one program can be run either way.
export ULNIC_INET=10.81.0.0/24
if [ -e /sys/class/net/eth0 ]; then
  # IPv6 link-local, and 10.81.0.(node+1)/24; the segment has no uplink.
  # Every address on the segment is unique by construction (the MAC
  # carries the node), so duplicate address detection only adds a window
  # in which the link-local address is tentative (or, if a probe is ever
  # echoed back under load, never usable): turn it off.
  echo 0 2>/dev/null > /proc/sys/net/ipv6/conf/eth0/accept_dad
  ip link set eth0 up
  NODE=$(arg ulnic.node)
  [ -n "$NODE" ] && ip addr add 10.81.0.$((NODE + 1))/24 dev eth0
  echo "ulnic-guest: net eth0 $(cat /sys/class/net/eth0/address) ${NODE:+10.81.0.$((NODE + 1))}"
fi
for d in /sys/bus/virtio/devices/*; do
  [ -e "$d/device" ] || continue
  echo "ulnic-guest: virtio $(basename "$d") device=$(cat "$d/device") driver=$(basename "$(readlink "$d/driver" 2>/dev/null)" 2>/dev/null)"
done
if [ -x /bin/ulnic ]; then
  echo "ulnic-guest: tool: $(/bin/ulnic --version 2>&1)"
fi
echo "ulnic-guest: ready kernel=$(uname -r)"
# A command from the cluster launcher: ulnic.cmd=<base64>, run with
# ULNIC_NODE / ULNIC_NODES set; its output is framed for the host.
CMD64=$(arg ulnic.cmd)
if [ -n "$CMD64" ]; then
  export ULNIC_NODE=$(arg ulnic.node) ULNIC_NODES=$(arg ulnic.nodes) HOME=/tmp
  echo "ulnic-guest: run: begin"
  echo "$CMD64" | base64 -d > /tmp/cmd
  { sh /tmp/cmd 2>&1; echo $? > /tmp/status; } | sed 's/^/ulnic-out: /'
  echo "ulnic-guest: exit=$(cat /tmp/status)"
fi
if grep -q ulnic.selftest /proc/cmdline; then
  /bin/ulnic selftest 2>&1
  echo "ulnic-guest: selftest exit=$?"
fi
if grep -q ulnic.poweroff /proc/cmdline; then
  poweroff -f
fi
# A persistent cluster (ulnic cluster up): serve the host's exec/put
# requests over the virtio-serial port for as long as the guest runs.
if grep -q ulnic.agent /proc/cmdline; then
  export ULNIC_NODE=$(arg ulnic.node) ULNIC_NODES=$(arg ulnic.nodes) HOME=/tmp
  cd /tmp
  while true; do
    /bin/ulnic agent
    echo "ulnic-guest: agent exited ($?); restarting"
    sleep 1
  done
fi
exec setsid cttyhack sh
