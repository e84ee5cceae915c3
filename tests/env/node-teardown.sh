#!/usr/bin/env bash
# Tears down what a real test node (policy-host-testenv's node.rs) leaves outside its own
# processes: its pods' processes (found through their cgroups), the runc shims of its
# containerd (found by the socket in their command line; they leave containerd's process
# group), mounts under its directory, the pods' network namespaces, the pods' cgroups,
# kube-proxy's nftables tables, the bridge, and the volumes its claims got from the hostPath
# provisioner (MariaDB's data directories are 126 MiB each; a suite left gigabytes in /tmp). Every step tolerates "already gone".
#
# Usage: node-teardown.sh now   DIR SOCKET CGROUP_ROOT BRIDGE IP_FORWARD
#        node-teardown.sh watch DIR SOCKET CGROUP_ROOT BRIDGE IP_FORWARD
# `now` tears down at once (the node's Drop). `watch` waits until it gets SIGTERM, which the
# kernel sends when the test process that started it dies (setpriv --pdeathsig TERM), and then
# tears down under the machine-wide node lock: test processes end without running destructors
# of their shared environment, and nothing of their node may outlive them.
set -uo pipefail
mode=$1 dir=$2 socket=$3 cgroup_root=$4 bridge=$5 ip_forward=$6
lock=/run/lock/policy-host-node.lock
# The in-tree hostPath provisioner's directory, and what was in it when the node started (the
# watchdog starts with the node, under the node lock): anything else there is this node's.
volumes=/tmp/hostpath_pv volumes_before=$dir/hostpath-volumes-before

teardown() {
  echo "node-teardown: $mode $(date +%T.%N)"
  local kubepods=/sys/fs/cgroup/memory${cgroup_root}/kubepods procs pid p
  # Pods' processes, by cgroup; twice, in case one forked meanwhile.
  for _ in 1 2; do
    if [ -d "$kubepods" ]; then
      procs=$(find "$kubepods" -name cgroup.procs -exec cat {} + 2>/dev/null)
      for pid in $procs; do kill -KILL "$pid" 2>/dev/null; done
    fi
  done
  for p in /proc/[0-9]*; do
    if [ "$(tr '\0' '\n' 2>/dev/null <"$p/cmdline" | grep -cxF -- "$socket")" != 0 ]; then
      case "$(tr '\0' '\n' 2>/dev/null <"$p/cmdline" | head -1)" in
        *containerd-shim-runc-v2) kill -KILL "${p#/proc/}" 2>/dev/null ;;
      esac
    fi
  done
  # Deepest mounts first.
  awk -v d="$dir" 'index($5, d) == 1 { print length($5), $5 }' /proc/self/mountinfo \
    | sort -rn | cut -d' ' -f2- | while read -r point; do umount -l "$point" 2>/dev/null; done
  for netns in /var/run/netns/cni-*; do
    [ -e "$netns" ] || continue
    umount -l "$netns" 2>/dev/null; rm -f "$netns"
  done
  for h in memory cpu cpuacct cpuset devices freezer blkio pids systemd; do
    [ -d "/sys/fs/cgroup/$h$cgroup_root/kubepods" ] || continue
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      find "/sys/fs/cgroup/$h$cgroup_root/kubepods" -depth -type d -exec rmdir {} + 2>/dev/null
      [ -d "/sys/fs/cgroup/$h$cgroup_root/kubepods" ] || break
      sleep 0.1
    done
  done
  nft delete table ip kube-proxy 2>/dev/null
  nft delete table ip6 kube-proxy 2>/dev/null
  # The kubelet's iptables(-nft) chains (KUBE-FIREWALL, canaries, hints) and the rules jumping
  # to them; a table left with only empty chains by that goes too (the kubelet made it).
  local family table chain handle
  for family in ip ip6; do
    for table in mangle nat filter; do
      nft list table "$family" "$table" >/dev/null 2>&1 || continue
      for chain in $(nft list table "$family" "$table" 2>/dev/null | awk '$1 == "chain" { print $2 }'); do
        for handle in $(nft -a list chain "$family" "$table" "$chain" 2>/dev/null \
                         | awk '/jump KUBE-/ { print $NF }'); do
          nft delete rule "$family" "$table" "$chain" handle "$handle" 2>/dev/null
        done
      done
      for chain in $(nft list table "$family" "$table" 2>/dev/null | awk '$1 == "chain" && $2 ~ /^KUBE-/ { print $2 }'); do
        nft delete chain "$family" "$table" "$chain" 2>/dev/null
      done
      if ! nft list table "$family" "$table" 2>/dev/null | grep -vE '^\s*(table|chain|type|\}|#|$)' | grep -q .; then
        nft delete table "$family" "$table" 2>/dev/null
      fi
    done
  done
  ip link del "$bridge" 2>/dev/null
  echo "$ip_forward" >/proc/sys/net/ipv4/ip_forward
  if [ -f "$volumes_before" ] && [ -d "$volumes" ]; then
    local volume
    for volume in "$volumes"/*; do
      [ -e "$volume" ] || continue
      grep -qxF -- "${volume##*/}" "$volumes_before" || { rm -rf -- "$volume"; echo "removed volume $volume"; }
    done
  fi
}

case "$mode" in
  now) teardown ;;
  watch)
    ls -1 "$volumes" >"$volumes_before" 2>/dev/null || : >"$volumes_before"
    trap 'kill "$sleeper" 2>/dev/null; exec 9>"$lock"; flock 9; teardown; exit 0' TERM
    # `wait` returns at once on a trapped signal, unlike a foreground sleep.
    while :; do sleep 3600 & sleeper=$!; wait "$sleeper"; done ;;
  *) echo "usage: $0 now|watch DIR SOCKET CGROUP_ROOT BRIDGE IP_FORWARD" >&2; exit 2 ;;
esac
