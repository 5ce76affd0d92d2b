# Several hosts on one machine for hpcrun's tests and benchmark: network namespaces on a bridge,
# each with its own address, and a launch agent that runs a command "on" one of them the way
# ssh does (exit code 255 when the host cannot be reached: unknown, or its link is down).
# Sourced by tests/launch/*.sh and bench/hpcrun_recovery.sh; needs root and iproute2.
#
#   netns_setup ID N     hosts 1..N as namespaces hpt<ID>h<k> with addresses 10.231.<ID>.(10+k)
#                        (ID 1..250: distinct for tests that run at the same time); everything is
#                        removed when the sourcing script exits
#   NETNS_HOSTS[k]       the address of host k          NETNS_AGENT   the launch agent
#   NETNS_DIR            a scratch directory (removed)  NETNS_MPI_ARGS  mpirun options for the hosts
#   netns_kill_host K    SIGKILL every process of host K (its sshd-less "node" loses everything)
#   netns_cut_host K     take host K's link down (its processes live on, cut off)
#   NETNS_KILL_AT_EXIT   pids to SIGKILL at exit, before the hosts are removed
#   netns_require        exit 77 (CTest: skipped) with a message where namespaces are unavailable

netns_require() {
  if [[ $EUID -ne 0 ]]; then echo "SKIPPED: network namespaces need root"; exit 77; fi
  if ! command -v ip > /dev/null; then echo "SKIPPED: no ip command (Debian package iproute2)"; exit 77; fi
  if ! ip netns add "hpt-check-$$" 2> /dev/null; then echo "SKIPPED: cannot create network namespaces here"; exit 77; fi
  ip netns del "hpt-check-$$"
}

netns_cleanup() {
  local pid
  # Programs the script left running on these hosts (an hpcrun it started in the background).
  for pid in ${NETNS_KILL_AT_EXIT:-}; do kill -9 "$pid" 2> /dev/null || true; done
  netns_remove_hosts
  [[ -n "${NETNS_DIR:-}" ]] && rm -rf "$NETNS_DIR"
  return 0
}

netns_setup() {
  NETNS_ID=$1
  NETNS_COUNT=$2
  NETNS_DIR=$(mktemp -d /tmp/hpcrun-netns-XXXXXX)
  NETNS_HOSTS=()
  trap 'netns_cleanup' EXIT
  trap 'exit 130' INT TERM
  netns_remove_hosts
  local br="hpt${NETNS_ID}br" net="10.231.${NETNS_ID}" k
  ip link add "$br" type bridge
  ip addr add "$net.1/24" dev "$br"
  ip link set "$br" up
  : > "$NETNS_DIR/hosts"
  for ((k = 1; k <= NETNS_COUNT; ++k)); do
    local ns="hpt${NETNS_ID}h$k" veth="hpt${NETNS_ID}v$k" addr="$net.$((10 + k))"
    ip netns add "$ns"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip link set "$veth" master "$br" up
    ip netns exec "$ns" ip addr add "$addr/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    NETNS_HOSTS[k]=$addr
    echo "$addr $ns $veth" >> "$NETNS_DIR/hosts"
  done
  NETNS_AGENT="$NETNS_DIR/agent"
  cat > "$NETNS_AGENT" << AGENT
#!/bin/sh
# agent [ssh options] HOST COMMAND...: runs COMMAND in HOST's namespace, as ssh would on HOST.
while [ \$# -gt 0 ]; do
  case "\$1" in -o | -p | -l | -i) shift 2 ;; -*) shift ;; *) break ;; esac
done
host=\$1; shift
entry=\$(grep "^\$host " "$NETNS_DIR/hosts")
if [ -z "\$entry" ]; then echo "ssh: Could not resolve hostname \$host: Name or service not known" >&2; exit 255; fi
ns=\$(echo "\$entry" | cut -d' ' -f2); veth=\$(echo "\$entry" | cut -d' ' -f3)
if [ "\$(cat /sys/class/net/\$veth/operstate 2>/dev/null)" != up ]; then
  echo "ssh: connect to host \$host port 22: No route to host" >&2; exit 255
fi
# Its own host name too (a UTS namespace), as a real host has: Open MPI names its session
# directories in the shared /tmp after it.
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$ns; \$*"
AGENT
  chmod +x "$NETNS_AGENT"
  # Open MPI between the namespaces: over the bridge, one daemon launch per host, no core binding
  # (the "hosts" share this machine's cores).
  NETNS_MPI_ARGS="--mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include $net.0/24 --mca btl_tcp_if_include $net.0/24 --bind-to none"
}

# Every namespace, link and bridge of NETNS_ID, with their processes: this run's at exit, and at
# setup those a test killed before its EXIT trap ran left behind.
netns_remove_hosts() {
  local ns
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep "^hpt${NETNS_ID}h" || true); do
    ip netns pids "$ns" | xargs -r kill -9 2> /dev/null || true
    ip netns del "$ns" 2> /dev/null || true
  done
  # A namespace outlives its name while a dying process is still in it: remove its link now.
  ip -o link show 2> /dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^hpt${NETNS_ID}v" |
    xargs -r -n1 ip link del 2> /dev/null || true
  ip link del "hpt${NETNS_ID}br" 2> /dev/null || true
}

netns_kill_host() { ip netns pids "hpt${NETNS_ID}h$1" | xargs -r kill -9; }
netns_cut_host() { ip link set "hpt${NETNS_ID}v$1" down; }
