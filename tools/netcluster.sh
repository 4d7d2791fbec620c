#!/bin/sh
# tools/netcluster.sh -- a test cluster of hosts on this one machine: network
# namespaces PREFIX0..PREFIX{N-1}, each with interface zteth and its own
# address, joined by veth pairs to a bridge PREFIXbr in the root namespace
# (where mpirun runs, so Open MPI's out-of-band channel reaches every host).
# tc shapes each host's link in both directions (htb). See docs/cluster.md.
#
#   up N [--rate RATE] [--slots S]   make N hosts (S slots each, default 1)
#   down                             remove everything `up` made (idempotent)
#   shape RATE [HOST]                set link bandwidth (1gbit, 10gbit, 5mbit;
#                                    "none" removes the limit), all hosts or one
#   link HOST down|up                cut or restore one host's link
#   status                           hosts, addresses, links, shaping, counters
#   hostfile                         an Open MPI hostfile (HOST slots=S)
#   env                              what a launch needs (ztrain: nothing;
#                                    a hand-written mpirun: flags)
#   exec HOST CMD...                 run CMD inside a host (as the launch agent)
#
# env: ZTRAIN_NETCLUSTER=PREFIX (default ztn; 3-8 of [a-z0-9], first and
# last a letter) so clusters never collide; ZTRAIN_NETCLUSTER_SUBNET=A.B.C
# (a /24; default 10.213.0 for ztn, else 10.213.K, K from the prefix). Root only, iproute2 + tc only.
# Nothing routes out: the hosts have no default route and there is no NAT;
# the subnet is reachable only inside this machine.
set -u

P=${ZTRAIN_NETCLUSTER:-ztn}
STATE_DIR=${ZTRAIN_NETCLUSTER_STATE:-/run/ztrain-netcluster}
STATE=$STATE_DIR/$P

die() { echo "netcluster: $*" >&2; exit 1; }

# 3 characters at least: `down` removes every namespace PREFIX<digits>, and a
# short prefix (a, ab) would take other clusters' hosts with it
case $P in
  [a-z][a-z0-9][a-z0-9]|[a-z][a-z0-9][a-z0-9][a-z0-9]|\
  [a-z][a-z0-9][a-z0-9][a-z0-9][a-z0-9]|[a-z][a-z0-9][a-z0-9][a-z0-9][a-z0-9][a-z0-9]|\
  [a-z][a-z0-9][a-z0-9][a-z0-9][a-z0-9][a-z0-9][a-z0-9]|\
  [a-z][a-z0-9][a-z0-9][a-z0-9][a-z0-9][a-z0-9][a-z0-9][a-z0-9]) ;;
  *) die "ZTRAIN_NETCLUSTER=$P: a prefix is 3-8 characters [a-z0-9], starting with a letter (interface names are 15 at most)" ;;
esac
# a prefix that ends in a digit would make PREFIX1 + 0 and PREFIX + 10 the same name
case $P in *[0-9]) die "ZTRAIN_NETCLUSTER=$P: a prefix must end in a letter (hosts are PREFIX0, PREFIX1, ...)" ;; esac

subnet() {
  if [ -n "${ZTRAIN_NETCLUSTER_SUBNET:-}" ]; then
    s=$ZTRAIN_NETCLUSTER_SUBNET
    # A.B.C, three numbers 0-255 (the hosts are A.B.C.1.., the bridge A.B.C.254)
    echo "$s" | grep -qxE '([0-9]{1,3}\.){2}[0-9]{1,3}' &&
      [ "$(echo "$s" | awk -F. '$1 <= 255 && $2 <= 255 && $3 <= 255')" = "$s" ] ||
      die "ZTRAIN_NETCLUSTER_SUBNET=$s is not a /24 written A.B.C (three numbers 0-255, e.g. 10.213.7)"
    echo "$s"; return
  fi
  if [ "$P" = ztn ]; then echo 10.213.0; return; fi
  k=$(printf %s "$P" | cksum | cut -d' ' -f1)
  echo "10.213.$((k % 250 + 1))"
}

need_root() {
  [ "$(id -u)" = 0 ] || die "must run as root (network namespaces and tc need CAP_NET_ADMIN)"
  command -v ip >/dev/null 2>&1 || die "ip (iproute2) not found: apt-get install iproute2"
  ip netns list >/dev/null 2>&1 || die "ip netns does not work here (no network namespaces in this kernel or container?)"
}

# hosts: this prefix's namespaces, in order (from the state file, else from ip netns)
hosts() {
  if [ -f "$STATE" ]; then
    n=$(sed -n 's/^n=//p' "$STATE")
    i=0; while [ "$i" -lt "$n" ]; do echo "$P$i"; i=$((i + 1)); done
  else
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$P[0-9]+\$" | sed "s/^$P//" | sort -n | sed "s/^/$P/"
  fi
}

state_get() { [ -f "$STATE" ] && sed -n "s/^$1=//p" "$STATE"; }

host_index() {
  i=${1#"$P"}
  case $i in ''|*[!0-9]*) die "$1 is not a host of this cluster (hosts are ${P}0..; ZTRAIN_NETCLUSTER=$P)" ;; esac
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$1" || die "no host $1 (is the cluster up? tools/netcluster.sh status)"
  echo "$i"
}

# check_rate RATE: dies unless RATE is "none" or a rate tc takes (bits or
# bytes per second, any case: 10gbit, 5Mbit, 100kbps), so a bad one is
# refused before any qdisc is touched (no link left half-shaped)
check_rate() {
  [ "$1" = none ] && return 0
  echo "$1" | grep -qixE '[0-9]+(\.[0-9]+)?([kmgt]?bit|[kmgt]?bps)' ||
    die "$2 $1: a rate looks like 100gbit, 10gbit, 1gbit, 5mbit or 100kbps (bits or bytes per second), or none"
}

# shape_dev NS DEV RATE: htb on DEV's egress in namespace NS ("" = root); "none" clears
shape_dev() {
  ns=$1; dev=$2; rate=$3
  command -v tc >/dev/null 2>&1 || die "tc not found (it comes with iproute2): apt-get install iproute2"
  if [ -n "$ns" ]; then T="ip netns exec $ns tc"; else T=tc; fi
  $T qdisc del dev "$dev" root 2>/dev/null
  [ "$rate" = none ] && return 0
  # tc's own complaint is its whole usage text: the line below says it
  err=$( { $T qdisc add dev "$dev" root handle 1: htb default 10 &&
    $T class add dev "$dev" parent 1: classid 1:10 htb rate "$rate" ceil "$rate" quantum 60000; } 2>&1 >/dev/null) ||
    die "tc cannot set rate $rate on $dev${ns:+ in $ns}: $(echo "$err" | head -1)"
}

# shape_host HOST RATE: both directions of one host's link
shape_host() {
  i=${1#"$P"}
  shape_dev "$1" zteth "$2"            # host -> bridge
  shape_dev "" "${P}${i}b" "$2"         # bridge -> host
}

netem_note() {
  # latency and loss need the netem qdisc; probe once per `up` and say so
  if ip netns exec "$1" tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then
    ip netns exec "$1" tc qdisc del dev lo root 2>/dev/null
    echo "netem=yes"
  else
    echo "netcluster: netem (latency, loss) is not available in this kernel: links get bandwidth limits only" >&2
    echo "netem=no"
  fi
}

cmd_down() {
  need_root
  # (only this prefix's hosts: the prefix is 3 characters at least, above)
  for h in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$P[0-9]+\$"); do
    # processes left inside (a crashed run) go with the namespace
    pids=$(ip netns pids "$h" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    ip netns del "$h" 2>/dev/null
  done
  for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^$P([0-9]+b|br)\$"); do
    ip link del "$l" 2>/dev/null
  done
  rm -f "$STATE"
  return 0
}

cmd_up() {
  need_root
  n=${1:-}; [ $# -gt 0 ] && shift    # (dash: a shift with nothing to shift ends the script)
  case $n in ''|*[!0-9]*|0) die "up needs a host count >= 1: tools/netcluster.sh up N [--rate RATE] [--slots S]" ;; esac
  [ "$n" -le 200 ] || die "up $n: at most 200 hosts"
  rate=none; slots=1
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) [ $# -ge 2 ] || die "up: --rate needs a rate (e.g. 10gbit)"; rate=$2; shift 2 ;;
      --slots) [ $# -ge 2 ] || die "up: --slots needs a count (e.g. 2)"; slots=$2; shift 2 ;;
      *) die "up: unknown argument $1 (expected --rate RATE, --slots S)" ;;
    esac
  done
  case $slots in ''|*[!0-9]*|0) die "--slots $slots: give a count >= 1" ;; esac
  check_rate "$rate" "up: --rate"
  # what exists, not the state file (a stale one, hosts deleted by hand, is overwritten)
  if ip netns list 2>/dev/null | awk '{print $1}' | grep -qE "^$P[0-9]+\$" ||
     ip link show "${P}br" >/dev/null 2>&1; then
    die "a cluster with prefix $P is already up (tools/netcluster.sh down first, or set ZTRAIN_NETCLUSTER=another)"
  fi
  net=$(subnet) || exit 1
  # the subnet must be this cluster's alone (another cluster, or a real
  # network); its dots escaped (in a pattern a dot is any character)
  if ip -4 route show | grep -q "^$(echo "$net" | sed 's/\./\\./g')\.0/24\( \|\$\)"; then
    die "subnet $net.0/24 is already routed here (another cluster?): set ZTRAIN_NETCLUSTER_SUBNET=A.B.C"
  fi
  mkdir -p "$STATE_DIR"
  printf 'n=%s\nsubnet=%s\nslots=%s\nrate=%s\n' "$n" "$net" "$slots" "$rate" > "$STATE"
  # on any failure: undo what was made
  trap 'cmd_down >/dev/null 2>&1' EXIT
  ip link add "${P}br" type bridge || die "cannot create bridge ${P}br"
  # IPv4 only: no IPv6 link-local chatter on the links (their counters are
  # what the specs compare with the formulas)
  sysctl -qw "net.ipv6.conf.${P}br.disable_ipv6=1" 2>/dev/null
  # every step checked: a failed one ends the script, and the trap above
  # removes what was made (docs/cluster.md)
  ip addr add "$net.254/24" dev "${P}br" || die "cannot add address $net.254/24 to bridge ${P}br"
  ip link set "${P}br" up || die "cannot bring up bridge ${P}br"
  i=0
  while [ "$i" -lt "$n" ]; do
    h=$P$i
    ip netns add "$h" || die "cannot create namespace $h"
    ip link add "${P}${i}b" type veth peer name zteth netns "$h" || die "cannot create veth ${P}${i}b"
    sysctl -qw "net.ipv6.conf.${P}${i}b.disable_ipv6=1" 2>/dev/null
    ip netns exec "$h" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 2>/dev/null
    ip link set "${P}${i}b" master "${P}br" || die "cannot attach ${P}${i}b to bridge ${P}br"
    ip link set "${P}${i}b" up || die "cannot bring up ${P}${i}b"
    ip -n "$h" link set lo up || die "cannot bring up lo in $h"
    ip -n "$h" addr add "$net.$((i + 1))/24" dev zteth || die "cannot add address $net.$((i + 1))/24 to zteth in $h"
    ip -n "$h" link set zteth up || die "cannot bring up zteth in $h"
    # a cut link must end a connection in seconds, not the default ~15 min
    # (net.ipv4.tcp_retries2 is per namespace); the watchdog acts first anyway
    ip netns exec "$h" sysctl -qw net.ipv4.tcp_retries2=5 2>/dev/null
    [ "$rate" != none ] && shape_host "$h" "$rate"
    i=$((i + 1))
  done
  netem_note "${P}0" >> "$STATE"
  trap - EXIT
  echo "netcluster: $n host(s) ${P}0..$P$((n - 1)) on $net.0/24 (bridge ${P}br = $net.254), rate $rate, $slots slot(s) each"
}

cmd_shape() {
  need_root
  rate=${1:-}; [ -n "$rate" ] || die "shape needs a rate: tools/netcluster.sh shape RATE [HOST] (e.g. 10gbit, none)"
  check_rate "$rate" shape
  if [ -n "${2:-}" ]; then
    host_index "$2" >/dev/null
    shape_host "$2" "$rate"
  else
    [ -n "$(hosts)" ] || die "no cluster with prefix $P is up (tools/netcluster.sh up N)"
    for h in $(hosts); do shape_host "$h" "$rate"; done
    [ -f "$STATE" ] && sed -i "s/^rate=.*/rate=$rate/" "$STATE"
  fi
  return 0
}

cmd_link() {
  need_root
  h=${1:-}; what=${2:-}
  [ -n "$h" ] && { [ "$what" = down ] || [ "$what" = up ]; } || die "usage: tools/netcluster.sh link HOST down|up"
  i=$(host_index "$h") || exit 1
  ip link set "${P}${i}b" "$what"
}

cmd_status() {
  need_root
  [ -n "$(hosts)" ] || { echo "netcluster: no cluster with prefix $P"; return 0; }
  echo "cluster $P: subnet $(state_get subnet).0/24 slots $(state_get slots) rate $(state_get rate) netem $(state_get netem)"
  for h in $(hosts); do
    i=${h#"$P"}
    addr=$(ip -n "$h" -4 -o addr show dev zteth 2>/dev/null | awk '{print $4}')
    st=$(ip -o link show "${P}${i}b" 2>/dev/null | grep -q 'state UP\|,UP' && echo up || echo down)
    q=$(tc qdisc show dev "${P}${i}b" 2>/dev/null | head -1 | awk '{print $2}')
    r=$(tc class show dev "${P}${i}b" 2>/dev/null | sed -n 's/.* rate \([^ ]*\).*/\1/p' | head -1)
    tx=$(cat "/sys/class/net/${P}${i}b/statistics/rx_bytes" 2>/dev/null)  # host's sends = bridge side's receives
    rx=$(cat "/sys/class/net/${P}${i}b/statistics/tx_bytes" 2>/dev/null)
    echo "$h $addr link=$st qdisc=${q:-none} rate=${r:-unlimited} sent=${tx:-?} received=${rx:-?}"
  done
}

cmd_hostfile() {
  [ -n "$(hosts)" ] || die "no cluster with prefix $P is up (tools/netcluster.sh up N)"
  s=$(state_get slots); s=${s:-1}
  for h in $(hosts); do echo "$h slots=$s"; done
}

# What a launch needs: ztrain --hostfile nothing (it sees the hosts are
# namespaces and adds the flags itself); a hand-written mpirun the agent
# and the subnet Open MPI's TCP keeps to.
cmd_env() {
  [ -n "$(hosts)" ] || die "no cluster with prefix $P is up (tools/netcluster.sh up N)"
  net=$(state_get subnet); net=${net:-$(subnet)}
  here=$(cd "$(dirname "$0")" && pwd)
  echo "# ztrain --hostfile FILE needs nothing more; a hand-written mpirun --hostfile FILE needs these flags:"
  echo "ZTRAIN_NETCLUSTER=$P"
  echo "NETCLUSTER_MPIRUN_FLAGS='--mca plm_rsh_agent $here/netns_agent --mca plm_rsh_no_tree_spawn 1 --mca btl tcp,self --mca btl_tcp_if_include $net.0/24 --mca oob_tcp_if_include $net.0/24'"
}

cmd_exec() {
  h=${1:-}; [ $# -gt 0 ] && shift
  [ -n "$h" ] && [ $# -gt 0 ] || die "usage: tools/netcluster.sh exec HOST CMD..."
  exec "$(dirname "$0")/netns_agent" "$h" "$@"
}

usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; }

c=${1:-}; [ $# -gt 0 ] && shift      # (dash: a shift with nothing to shift ends the script)
case $c in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  shape) cmd_shape "$@" ;;
  link) cmd_link "$@" ;;
  status) cmd_status ;;
  hostfile) cmd_hostfile ;;
  env) cmd_env ;;
  exec) cmd_exec "$@" ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
