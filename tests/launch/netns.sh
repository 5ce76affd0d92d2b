# Several hosts on one machine for hpcrun's tests and benchmark, each a real SSH server: a network
# namespace on a bridge with its own address, running its own sshd (Debian's openssh-server) with
# its own host key, host name (a UTS namespace), /tmp and /dev/shm (a mount namespace with private
# tmpfs). Everything sshd starts (mpirun's daemons, the ranks) lives in those namespaces, so nothing
# host-local is shared by accident. The keys, known_hosts and ssh client config are the test's own,
# made in its scratch directory; the machine's ~/.ssh and /etc/ssh are never read.
# Sourced by tests/launch/*.sh and bench/hpcrun_recovery.sh; needs root, iproute2 and openssh.
#
#   netns_setup ID N     hosts 1..N as namespaces hpt<ID>h<k> (also their host names) with addresses
#                        10.231.<ID>.(10+k) (ID 1..250: distinct for tests that run at the same
#                        time); everything is removed when the sourcing script exits
#   NETNS_HOSTS[k]       the address of host k
#   NETNS_DIR            a scratch directory (removed): the hosts' shared storage, so under /var/tmp
#                        (each host has a /tmp of its own)
#   NETNS_SSH_CONFIG     the ssh client config (key, known_hosts, strict host key checking)
#   NETNS_AGENT          "ssh -F NETNS_SSH_CONFIG": the launch agent, as a user would give it
#   NETNS_MPI_ARGS       mpirun options for the hosts
#   netns_kill_host K    SIGKILL every process of host K, sshd included: it loses everything, and
#                        ssh to it is refused at once (the address still answers)
#   netns_boot_host K    start host K's sshd again, with a fresh /tmp and /dev/shm (a reboot)
#   netns_rekey_host K   give host K a new host key and reboot it (a reinstalled machine)
#   netns_cut_host K     take host K's link down (its processes live on, cut off; packets to it
#                        vanish, so ssh waits for its connect timeout, as on a routed network)
#   netns_mend_host K    bring host K's link up again (after netns_cut_host)
#   netns_sshd_logins K  how many logins with the test's key host K's sshd accepted
#   NETNS_KILL_AT_EXIT   pids to SIGKILL at exit, before the hosts are removed
#   netns_require        exit 77 (CTest: skipped) with a message where namespaces are unavailable

NETNS_SSHD=/usr/sbin/sshd

netns_require() {
  if [[ $EUID -ne 0 ]]; then echo "SKIPPED: network namespaces need root"; exit 77; fi
  if ! command -v ip > /dev/null; then echo "SKIPPED: no ip command (Debian package iproute2)"; exit 77; fi
  if ! ip netns add "hpt-check-$$" 2> /dev/null; then echo "SKIPPED: cannot create network namespaces here"; exit 77; fi
  ip netns del "hpt-check-$$"
  # Missing, these are a broken installation (setup.sh installs them), not a reason to skip.
  local p
  for p in "$NETNS_SSHD" ssh ssh-keygen unshare; do
    command -v "$p" > /dev/null || { echo "FAIL: no $p (run ./setup.sh: openssh-server, openssh-client)" >&2; exit 1; }
  done
}

netns_cleanup() {
  local pid
  # Programs the script left running on these hosts (an hpcrun it started in the background).
  for pid in ${NETNS_KILL_AT_EXIT:-}; do kill -9 "$pid" 2> /dev/null || true; done
  netns_remove_hosts
  # The keys go with it.
  [[ -n "${NETNS_DIR:-}" ]] && rm -rf "$NETNS_DIR"
  return 0
}

netns_setup() {
  NETNS_ID=$1
  NETNS_COUNT=$2
  NETNS_HOSTS=()
  trap 'netns_cleanup' EXIT
  trap 'exit 130' INT TERM
  netns_remove_hosts
  # And the scratch directory (keys included) of one killed before it could remove it.
  rm -rf "/var/tmp/hpcrun-netns-$NETNS_ID-"*
  NETNS_DIR=$(mktemp -d "/var/tmp/hpcrun-netns-$NETNS_ID-XXXXXX")
  local br="hpt${NETNS_ID}br" net="10.231.${NETNS_ID}" k
  ip link add "$br" type bridge
  ip addr add "$net.1/24" dev "$br"
  ip link set "$br" up
  for ((k = 1; k <= NETNS_COUNT; ++k)); do
    local ns="hpt${NETNS_ID}h$k" veth="hpt${NETNS_ID}v$k" addr="$net.$((10 + k))"
    ip netns add "$ns"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip link set "$veth" master "$br" up
    ip netns exec "$ns" ip addr add "$addr/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    NETNS_HOSTS[k]=$addr
  done
  netns_fix_neighbours
  netns_make_keys
  for ((k = 1; k <= NETNS_COUNT; ++k)); do netns_boot_host "$k"; done
  netns_check_hosts
  # Open MPI between the namespaces: over the bridge, one daemon launch per host (no tree spawn),
  # no core binding (the "hosts" share this machine's cores), and a rank waiting in MPI yields its
  # core: each "host" has one slot, so Open MPI does not see that 3 ranks share 2 cores, and ranks
  # spinning in an all-reduce took the core from the one they waited for (a 3-rank cnn trained at
  # 1369 img/s, 2979 with yielding; the same bits).
  NETNS_MPI_ARGS="--mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include $net.0/24 --mca btl_tcp_if_include $net.0/24 --bind-to none"
  NETNS_MPI_ARGS+=" --mca mpi_yield_when_idle 1"
}

# Every host's address fixed to its link-layer address, in the launcher's namespace and each
# host's: a cut host's packets then vanish (the bridge has no way to it) and ssh waits for its
# connect timeout, as on a real routed network, instead of learning in 3 s from ARP that the host is
# gone ("No route to host").
netns_fix_neighbours() {
  local k j mac
  for ((k = 1; k <= NETNS_COUNT; ++k)); do
    mac=$(ip netns exec "hpt${NETNS_ID}h$k" cat /sys/class/net/eth0/address)
    ip neigh replace "${NETNS_HOSTS[k]}" lladdr "$mac" dev "hpt${NETNS_ID}br" nud permanent
    for ((j = 1; j <= NETNS_COUNT; ++j)); do
      ((j == k)) || ip netns exec "hpt${NETNS_ID}h$j" ip neigh replace "${NETNS_HOSTS[k]}" lladdr "$mac" dev eth0 nud permanent
    done
  done
}

# The test's keys: a client key pair (authorized on every host), a host key per host and a
# known_hosts naming each host's, and the client config that uses them with strict checking.
netns_make_keys() {
  local d="$NETNS_DIR/ssh" k
  mkdir -m 700 "$d"
  ssh-keygen -q -t ed25519 -N '' -C "hpcrun-test-client" -f "$d/id_ed25519"
  cp "$d/id_ed25519.pub" "$d/authorized_keys"
  NETNS_CLIENT_KEY=$(ssh-keygen -l -f "$d/id_ed25519.pub" | awk '{print $2}')
  : > "$d/known_hosts"
  for ((k = 1; k <= NETNS_COUNT; ++k)); do
    mkdir "$d/h$k"
    netns_host_key "$k"
    netns_sshd_config "$k" > "$d/h$k/sshd_config"
  done
  NETNS_SSH_CONFIG="$d/config"
  cat > "$NETNS_SSH_CONFIG" << CONFIG
# The test's own: its key, its known_hosts, and no prompt that would wait for a person.
Host *
  User root
  IdentityFile $d/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $d/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
CONFIG
  NETNS_AGENT="ssh -F $NETNS_SSH_CONFIG"
}

# A new host key for host K, and known_hosts naming it.
netns_host_key() {
  local d="$NETNS_DIR/ssh" addr=${NETNS_HOSTS[$1]}
  rm -f "$d/h$1/host_key" "$d/h$1/host_key.pub"
  ssh-keygen -q -t ed25519 -N '' -C "hpt${NETNS_ID}h$1" -f "$d/h$1/host_key"
  grep -v "^$addr " "$d/known_hosts" > "$d/known_hosts.new" || true
  echo "$addr $(cut -d' ' -f1,2 "$d/h$1/host_key.pub")" >> "$d/known_hosts.new"
  mv "$d/known_hosts.new" "$d/known_hosts"
}

netns_sshd_config() {
  local d="$NETNS_DIR/ssh"
  # StrictModes off: the authorized keys live under /var/tmp, which is world-writable (sticky), and
  # sshd would refuse them there; PAM off: no session set-up of this machine's in the hosts.
  cat << CONFIG
ListenAddress ${NETNS_HOSTS[$1]}
HostKey $d/h$1/host_key
PidFile $d/h$1/sshd.pid
AuthorizedKeysFile $d/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
X11Forwarding no
PrintMotd no
LogLevel INFO
CONFIG
}

# What every host must see as the cluster's shared file system does (the build, the data) but
# lies in a host-local place (/tmp, /dev/shm: a checkout under /tmp): the first folder of each
# under that place, once.
netns_shared_local_dirs() {
  local p top seen=" "
  for p in "$@"; do
    case "$p" in /tmp/?* | /dev/shm/?*) ;; *) continue ;; esac
    top=${p#/tmp/}
    [[ "$p" == /tmp/* ]] && top=/tmp/${top%%/*} || { top=${p#/dev/shm/}; top=/dev/shm/${top%%/*}; }
    [[ "$seen" == *" $top "* ]] || { seen+="$top "; echo "$top"; }
  done
}

# Starts host K's sshd in its namespaces: its own host name, and a fresh tmpfs on /tmp and
# /dev/shm that nobody else sees and that goes when the host's last process does. The folders
# netns_shared_local_dirs names are carried over into the fresh tmpfs (moved there from a holding
# place outside it), as a shared mount would be on a real host.
netns_boot_host() {
  local d="$NETNS_DIR/ssh/h$1" i hold="$NETNS_DIR/ssh/h$1/hold" shared=()
  # Its privilege separation directory (Debian's init script makes it; a container may lack it).
  mkdir -p /run/sshd
  rm -f "$d/sshd.pid"
  mapfile -t shared < <(netns_shared_local_dirs "$HPCRUN" "$HPCTRAIN" "${FASHION_MNIST:-}")
  for ((i = 0; i < ${#shared[@]}; ++i)); do mkdir -p "$hold/$i"; done
  # A login's home is this machine's, but pyenv's shims there are each host's own copy (as on
  # separate machines): a root .bashrc running `pyenv rehash` takes a lock file in that folder,
  # so logins on the hosts at once waited for each other (seconds of a job's start-up), and a
  # login killed mid-rehash (a host stopped or killed by a test) left the lock behind: every
  # later login then waited 60 s for it.
  local shims="" home
  home=$(getent passwd "$(id -u)" | cut -d: -f6)
  if [[ -n "$home" && -d "$home/.pyenv/shims" ]]; then
    shims="$home/.pyenv/shims"
    rm -rf "$d/shims" && cp -a "$shims" "$d/shims" && rm -f "$d/shims/.pyenv-shim"
  fi
  # shellcheck disable=SC2016  # $1... are the inner sh's arguments
  ip netns exec "hpt${NETNS_ID}h$1" unshare --uts --mount --propagation private sh -c '
    name=$1 sshd=$2 config=$3 log=$4 hold=$5 shims=$6 own_shims=$7; shift 7
    i=0; for p in "$@"; do mount --bind "$p" "$hold/$i" || exit 1; i=$((i + 1)); done
    hostname "$name" && mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /dev/shm || exit 1
    [ -z "$shims" ] || mount --bind "$own_shims" "$shims" || exit 1
    i=0; for p in "$@"; do mkdir -p "$p" && mount --move "$hold/$i" "$p" || exit 1; i=$((i + 1)); done
    exec "$sshd" -f "$config" -E "$log"' sh "hpt${NETNS_ID}h$1" "$NETNS_SSHD" "$d/sshd_config" "$d/sshd.log" \
    "$hold" "$shims" "$d/shims" "${shared[@]}" ||
    { cat "$d/sshd.log" >&2 2> /dev/null; echo "FAIL: cannot start sshd on host $1" >&2; exit 1; }
  # sshd writes its pid file once it listens.
  for ((i = 0; i < 100; ++i)); do
    [[ -s "$d/sshd.pid" ]] && return 0
    sleep 0.05
  done
  cat "$d/sshd.log" >&2
  echo "FAIL: sshd of host $1 did not start listening within 5 s" >&2
  exit 1
}

netns_rekey_host() {
  netns_kill_host "$1"
  # The old key stays in known_hosts: the new one is what a reinstalled machine presents.
  cp "$NETNS_DIR/ssh/known_hosts" "$NETNS_DIR/ssh/known_hosts.kept"
  netns_host_key "$1"
  mv "$NETNS_DIR/ssh/known_hosts.kept" "$NETNS_DIR/ssh/known_hosts"
  netns_boot_host "$1"
}

# Every host answers ssh with the test's key, as itself, in a mount namespace (its /tmp and
# /dev/shm) of its own: says so, or fails the setup. Only the answer's stdout is read: a login
# shell's start-up files may write to stderr (pyenv's rehash, run by root's .bashrc on two hosts
# at once, complained there), as on real hosts.
netns_check_hosts() {
  local k out mine pids=()
  mine=$(readlink /proc/self/ns/mnt)
  for ((k = 1; k <= NETNS_COUNT; ++k)); do
    ssh -F "$NETNS_SSH_CONFIG" "${NETNS_HOSTS[k]}" 'echo $(hostname) $(readlink /proc/self/ns/mnt) $(stat -f -c %T /tmp /dev/shm)' \
      > "$NETNS_DIR/ssh/h$k/check" 2> "$NETNS_DIR/ssh/h$k/check.err" &
    pids+=($!)
  done
  wait "${pids[@]}" || true
  for ((k = 1; k <= NETNS_COUNT; ++k)); do
    read -r out < "$NETNS_DIR/ssh/h$k/check" || true
    [[ "$out" == "hpt${NETNS_ID}h$k mnt:"*" tmpfs tmpfs" && "$out" != *" $mine "* ]] ||
      { echo "FAIL: host $k (${NETNS_HOSTS[k]}) did not answer ssh as hpt${NETNS_ID}h$k with its own tmpfs: $(cat "$NETNS_DIR/ssh/h$k/check" "$NETNS_DIR/ssh/h$k/check.err")" >&2; exit 1; }
    echo "host $k: sshd (pid $(cat "$NETNS_DIR/ssh/h$k/sshd.pid")) on ${NETNS_HOSTS[k]}; ssh answers: $out"
  done
}

netns_sshd_logins() {
  grep -c "Accepted publickey for root .* $NETNS_CLIENT_KEY" "$NETNS_DIR/ssh/h$1/sshd.log" || true
}

# Every namespace, link and bridge of NETNS_ID, with their processes (sshd included): this run's
# at exit, and at setup those a test killed before its EXIT trap ran left behind.
netns_remove_hosts() {
  local ns
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep "^hpt${NETNS_ID}h" || true); do
    netns_kill_ns "$ns"
    ip netns del "$ns" 2> /dev/null || true
  done
  # A namespace outlives its name while a dying process is still in it: remove its link now.
  ip -o link show 2> /dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^hpt${NETNS_ID}v" |
    xargs -r -n1 ip link del 2> /dev/null || true
  ip link del "hpt${NETNS_ID}br" 2> /dev/null || true
}

# SIGKILL to every process of a namespace, until none is left (sshd may be forking a session).
netns_kill_ns() {
  local i pids
  for ((i = 0; i < 50; ++i)); do
    pids=$(ip netns pids "$1" 2> /dev/null) || return 0
    [[ -n "$pids" ]] || return 0
    # shellcheck disable=SC2086
    kill -9 $pids 2> /dev/null || true
    sleep 0.02
  done
}

netns_kill_host() { netns_kill_ns "hpt${NETNS_ID}h$1"; }
netns_cut_host() { ip link set "hpt${NETNS_ID}v$1" down; }
netns_mend_host() { ip link set "hpt${NETNS_ID}v$1" up; }
