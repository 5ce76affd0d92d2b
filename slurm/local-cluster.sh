#!/usr/bin/env bash
# A real Slurm cluster on this one machine, from Debian's slurm-wlm and munge: a munged, a
# slurmctld and several slurmd (`slurmd -N name`, each on its own port, with `%n` in its spool,
# log and pid paths), configured in a private directory. For trying the sbatch scripts in slurm/
# and for the tests. Needs root (slurmd runs jobs as their users).
#
#   slurm/local-cluster.sh up [--nodes N] [--cpus-per-node C] [--preemption GRACE] [--netns]
#                                  [--dir DIR]
#                                  boot it and wait until every node is idle
#   slurm/local-cluster.sh env     print the export line(s) that point Slurm's commands at it:
#                                  eval "$(slurm/local-cluster.sh env)"; sbatch ...
#   slurm/local-cluster.sh status  its daemons, nodes and jobs (exit 0: up, 1: degraded, 3: down)
#   slurm/local-cluster.sh down    stop everything it started, jobs included, and remove DIR
#   slurm/local-cluster.sh kill-node NAME
#                                  SIGKILL one node's slurmd and its jobs' processes there (a node
#                                  failure: the controller marks it down after SlurmdTimeout)
#   slurm/local-cluster.sh start-node NAME
#                                  start that node's slurmd again (it rejoins by itself), after a
#                                  kill-node as a rebooted node: without its dead steps' files
#
# Options: --dir DIR (default $HPCTRAIN_SLURM_DIR, else /run/hpctrain-slurm: root sources files
# there, so it must be root's own and writable by no one else), for every command; --nodes N
# (default 2, at most 64) nodes named n1..nN; --cpus-per-node C (at most 4096; default: this
# machine's cores / N, at least 1); --preemption GRACE (seconds): Slurm's own preemption, as sites
# configure it (PreemptType=preempt/partition_prio, PreemptMode=REQUEUE): two partitions over all
# nodes, 'low' (the default, GraceTime=GRACE) and 'high', whose jobs preempt low ones: Slurm sends
# the low job's tasks SIGTERM, gives them GRACE seconds, then kills and requeues the job; without
# it, one partition 'local'; --netns: each node's slurmd (and so every job process there) in a
# network namespace of its own, with its own address on a bridge (10.232.ID.10+k; slurmctld at .1),
# so that traffic between nodes (srun, PMIx wire-up, MPI) crosses a network path, not loopback.
# Short timeouts suit a machine where nothing is slow: SlurmdTimeout 10 s, a requeued
# job waits 10 s (AuthInfo cred_expire) instead of 2 minutes, KillWait 30 s as on real clusters
# (HPCTRAIN_SLURM_KILL_WAIT=S in the environment of 'up' sets another, whole seconds from 1 to
# 300: the tests whose jobs Slurm kills after a node failure use a shorter one).
# Every node runs slurm/epilog.sh at a job's end (Epilog=), as a site running hpctrain would.
# Job ids start from a range of the cluster's own (FirstJobId, from its port base), not from 1, so
# that the MPI jobs of two clusters on this machine never share a name (see write_config).
set -euo pipefail
# Nothing it makes is others' to write, whatever the umask (root sources its files and runs its
# daemons from them): under umask 000 its directories came out 0777, which it then refused as
# others' to write, leaving them behind.
umask "$(printf '%04o' $(($(umask) | 8#022)))"

me=local-cluster.sh
epilog=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/epilog.sh
die() { echo "$me: error: $1" >&2; exit "${2:-1}"; }  # die MESSAGE [CODE]
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

cmd=${1:-}
[[ -n "$cmd" ]] || { usage >&2; exit 2; }
shift
case "$cmd" in
  -h | --help | help) usage; exit 0 ;;
  up | env | status | down | kill-node | start-node) ;;
  *) die "unknown command '$cmd' (up, env, status, down, kill-node, start-node)" 2 ;;
esac

dir=${HPCTRAIN_SLURM_DIR:-/run/hpctrain-slurm}  # not /tmp: any user could make it first
nodes=2
cpus=0
grace=""
netns=0
node_arg=""
while (($#)); do
  case "$1" in
    --dir) (($# >= 2)) || die "--dir needs a directory" 2; dir=$2; shift 2 ;;
    --dir=*) dir=${1#--dir=}; shift ;;
    --nodes) (($# >= 2)) || die "--nodes needs a number" 2; nodes=$2; shift 2 ;;
    --nodes=*) nodes=${1#--nodes=}; shift ;;
    --cpus-per-node) (($# >= 2)) || die "--cpus-per-node needs a number" 2; cpus=$2; shift 2 ;;
    --cpus-per-node=*) cpus=${1#--cpus-per-node=}; shift ;;
    --preemption) (($# >= 2)) || die "--preemption needs a grace time in seconds" 2; grace=$2; shift 2 ;;
    --preemption=*) grace=${1#--preemption=}; shift ;;
    --netns) netns=1; shift ;;
    -*) die "unknown option '$1' (try --help)" 2 ;;
    *)
      [[ "$cmd" == *-node && -z "$node_arg" ]] || die "unexpected argument '$1'" 2
      node_arg=$1; shift ;;
  esac
done
# The directory is checked before anything is touched: 'up' creates it and 'down' removes it, so
# it must be one this script made. An unset variable ("$UNSET/") or "/" must never become the
# root directory; realpath -s spells one directory one way (no "//", "/./" or trailing slash)
# without following links, so that the marker in the daemons' environment is unique.
[[ -n "$dir" ]] || die "--dir is empty" 2
dir=$(realpath -m -s -- "$dir")
[[ "$dir" != / ]] || die "--dir is the root directory '/' (an unset variable?); give a directory of its own, such as /run/hpctrain-slurm" 2
# Root runs the cluster's daemons from files in the directory and sources its cluster.env: one
# that another user made (first, in a shared /tmp) or may write in is refused by every command.
# Each refusal says which of these is wrong (it said "not root's own (owner root, a link or not a
# directory)" of a file of root's).
require_own_dir() {
  [[ -e "$dir" || -L "$dir" ]] || return 0
  local f
  for f in "$dir" "$dir/cluster.env" "$dir/.hpctrain-local-cluster"; do
    [[ -e "$f" || -L "$f" ]] || continue
    [[ ! -L "$f" ]] ||
      die "$f is a link (to $(readlink -- "$f")): a local cluster's directory and files must be root's own, not links; choose another --dir" 2
    [[ "$f" != "$dir" || -d "$f" ]] || die "--dir $f exists and is not a directory; choose another --dir" 2
    [[ "$(stat -c %u -- "$f")" == 0 ]] ||
      die "$f is not root's own (owner $(stat -c %U -- "$f")): a local cluster's files must be; choose another --dir" 2
    (((8#$(stat -c %a "$f") & 8#022) == 0)) ||
      die "$f is writable by others ($(stat -c %a "$f")): a local cluster's files must not be; choose another --dir" 2
  done
}
require_own_dir
if [[ -e "$dir" && ! -f "$dir/.hpctrain-local-cluster" ]]; then
  case "$cmd" in
    env | status) ;;  # nothing there to read: they say no cluster is up
    *) die "$dir exists and is not a local cluster's directory (one '$me up' made); choose another with --dir" 2 ;;
  esac
fi
if [[ "$cmd" != up ]]; then
  [[ "$nodes$cpus$grace$netns" == "200" ]] || die "--nodes, --cpus-per-node, --preemption and --netns belong to 'up'" 2
fi
if [[ "$cmd" == *-node ]]; then
  [[ -n "$node_arg" ]] || die "$cmd needs a node name" 2
fi

marker="HPCTRAIN_SLURM_CLUSTER=$dir"  # in the environment of every daemon this cluster runs
conf="$dir/etc/slurm.conf"
state_file="$dir/cluster.env"         # what 'up' chose: node names, ports, namespaces
NETNS_ID=0                            # with --netns: namespaces hpcs<ID>n<k>, bridge hpcs<ID>br

# ---------------------------------------------------------------------------------------------
# Processes

# A process that exists and has not exited (daemons are reparented to init, which in a container
# may never reap them: a zombie is dead).
alive() { [[ -n "${1:-}" ]] && kill -0 "$1" 2> /dev/null && [[ "$(ps -o stat= -p "$1")" != Z* ]]; }
pid_in() { [[ -s "$1" ]] && tr -dc '0-9' < "$1" || true; }

# Pids whose environment holds every one of the given NAME=VALUE entries.
pids_with_env() {
  local p env want ok
  for p in /proc/[0-9]*; do
    env=$(tr '\0' '\n' 2> /dev/null < "$p/environ") || continue
    ok=1
    for want in "$@"; do grep -qxF -- "$want" <<< "$env" || { ok=0; break; }; done
    ((ok)) && echo "${p#/proc/}"
  done
  return 0
}

# slurmstepd processes (one per job step and node) serving nodes whose spool directory starts with
# SPOOL: slurmd starts them through a double fork and they overwrite their environment, so they
# are known by the socket each one listens on in its node's spool directory, or, for one that has
# not opened its socket yet or has already closed it, by the node's log file it writes to (LOG, a
# path prefix: the whole log directory, or one node's log).
stepd_pids() {
  local inodes p fd
  for p in /proc/[0-9]*; do
    [[ "$(cat "$p/comm" 2> /dev/null)" == slurmstepd ]] || continue
    # The sockets of its own network namespace (a node's, with --netns).
    inodes=" $(awk -v d="$1" 'index($8, d) == 1 {print $7}' "$p/net/unix" 2> /dev/null | tr '\n' ' ') "
    for fd in "$p"/fd/*; do
      fd=$(readlink "$fd" 2> /dev/null) || continue
      if [[ "$fd" == socket:* && "$inodes" == *" ${fd//[^0-9]/} "* ]] || [[ "$fd" == "$2"* ]]; then
        echo "${p#/proc/}"
        break
      fi
    done
  done
  return 0
}

# Every process in the mount namespace of pid $1, a node's slurmd: each node's slurmd runs in a
# namespace of its own (its own /dev/shm, start_slurmd), and everything it starts stays there,
# slurmstepd and the job's tasks included, whatever they do to their environment or sockets.
# Nothing when that namespace is this script's own (it would be every process here). Quick: no
# command per process (-ef compares the namespaces' inodes), so that a kill-node lands while the
# job still runs.
in_mount_namespace_of() {
  local p ns=/proc/${1:-none}/ns/mnt
  [[ -e "$ns" && ! "$ns" -ef /proc/$$/ns/mnt ]] || return 0
  for p in /proc/[0-9]*; do
    [[ "$p/ns/mnt" -ef "$ns" ]] && echo "${p#/proc/}"
  done
  return 0
}

# The given pids and all their descendants (a step's tasks, a batch script and its srun).
with_descendants() {
  local all=" $* " added=1 pid ppid
  while ((added)); do
    added=0
    while read -r pid ppid; do
      if [[ "$all" == *" $ppid "* && "$all" != *" $pid "* ]]; then all+="$pid "; added=1; fi
    done < <(ps -e -o pid= -o ppid=)
  done
  echo "$all"
}

# kill_and_wait SECONDS PID...: SIGTERM, then SIGKILL what is left after SECONDS.
kill_and_wait() {
  local grace=$1 p left t
  shift
  (($#)) || return 0
  kill "$@" 2> /dev/null || true
  for ((t = 0; t < grace * 10; ++t)); do
    left=0
    for p in "$@"; do alive "$p" && left=1; done
    ((left)) || return 0
    sleep 0.1
  done
  kill -9 "$@" 2> /dev/null || true
  for ((t = 0; t < 50; ++t)); do
    left=0
    for p in "$@"; do alive "$p" && left=1; done
    ((left)) || return 0
    sleep 0.1
  done
}

load_state() {
  [[ -f "$dir/.hpctrain-local-cluster" && -f "$state_file" ]] || return 1  # never a file of a directory not ours
  # shellcheck disable=SC1090
  source "$state_file"
}

is_up() { load_state && alive "$(pid_in "$dir/run/slurmctld.pid")"; }

# ---------------------------------------------------------------------------------------------
# up

free_port_base() {  # a base port P with P..P+$1-1 all free on this machine
  local used base k ok
  used=" $(ss -Htan 2> /dev/null | awk '{n = split($4, a, ":"); print a[n]}' | tr '\n' ' ') "
  for ((try = 0; try < 200; ++try)); do
    base=$((20000 + (RANDOM % 400) * 25))
    ok=1
    for ((k = 0; k < $1; ++k)); do [[ "$used" == *" $((base + k)) "* ]] && { ok=0; break; }; done
    ((ok)) && { echo "$base"; return 0; }
  done
  die "no $1 free TCP ports found between 20000 and 30000"
}

# FirstJobId: each cluster's job ids from its own range (the port base's index times 100000), not
# from 1. Open MPI names a job launched by srun after the Slurm job and step ids alone, and its TCP
# transport takes any connection from that name: two clusters on one machine whose jobs both
# were 1.0 crossed, a rank of one cluster answering the connection a rank of the other made to a
# port its lost peer had held (a segfault in MPI_Init, the message's handler not yet there:
# slurm_time_limit in CI, with another cluster's tests beside it, 2026-12-05).
write_config() {
  local base=$1 k
  cat > "$conf" << EOF
# Generated by hpctrain's slurm/local-cluster.sh: $nodes nodes on this one machine.
ClusterName=hpctrain-local
SlurmctldHost=localhost($(node_addr 0))
SlurmctldPort=$base
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=10
KillWait=$kill_wait
Epilog=$epilog
MinJobAge=600
FirstJobId=$(((base - 20000) / 25 * 100000 + 1000))
InactiveLimit=0
EOF
  for ((k = 1; k <= nodes; ++k)); do
    echo "NodeName=n$k NodeHostname=localhost NodeAddr=$(node_addr "$k") Port=$((base + k)) CPUs=$cpus State=UNKNOWN" >> "$conf"
  done
  if [[ -n "$grace" ]]; then
    # A job of the higher PriorityTier takes the nodes of lower ones: those get SIGTERM (every
    # task), GraceTime to checkpoint, then SIGKILL, and are requeued (they must be requeueable).
    cat >> "$conf" << EOF
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=low Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=$grace
PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF
  else
    echo "PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$conf"
  fi
  # Every slurmd reads its own copy of the directory: the PMIx plugin puts a step's client
  # directory under PMIxCliTmpDirBase by user, job and step only, so two nodes of one machine
  # would collide in a shared one.
  for ((k = 1; k <= nodes; ++k)); do
    mkdir -p "$dir/etc/n$k" "$dir/spool/n$k" "$dir/tmp/n$k"
    chmod 1777 "$dir/tmp/n$k"
    ln -sf ../slurm.conf "$dir/etc/n$k/slurm.conf"
    echo "PMIxCliTmpDirBase=$dir/tmp/n$k" > "$dir/etc/n$k/mpi.conf"
  done
}

start_slurmd() {  # start_slurmd NAME
  local in_ns=()
  # nsenter, not `ip netns exec`, which mounts a sysfs of its own without /sys/fs/cgroup, and
  # slurmd then fails to start its cgroup plugin.
  ((NETNS_ID)) && in_ns=(nsenter "--net=/run/netns/hpcs${NETNS_ID}$1")
  # Each node has a /dev/shm of its own (a private mount namespace), as separate machines do:
  # what a node keeps in memory (hpctrain's snapshots, MPI's shared-memory segments) is not
  # another node's, and goes with the node when kill-node ends its processes.
  local own_shm=(unshare --mount --propagation private -- sh -c 'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"' sh)
  "${in_ns[@]}" "${own_shm[@]}" env "$marker" "HPCTRAIN_SLURM_NODE=$1" slurmd -f "$dir/etc/$1/slurm.conf" -N "$1" ||
    die "slurmd for $1 did not start; see $dir/log/slurmd-$1.log"
}

# ---------------------------------------------------------------------------------------------
# --netns: a bridge with slurmctld's address, and per node a namespace on it

node_addr() {  # node_addr K: node nK's address (0: slurmctld's)
  if ((NETNS_ID == 0)); then echo 127.0.0.1
  elif (($1 == 0)); then echo "10.232.$NETNS_ID.1"
  else echo "10.232.$NETNS_ID.$((10 + $1))"; fi
}

free_netns_id() {
  local id
  for ((id = 1; id <= 250; ++id)); do
    [[ -e "/sys/class/net/hpcs${id}br" ]] || ip netns list | grep -q "^hpcs${id}n" || { echo "$id"; return 0; }
  done
  die "no free namespace id (bridges hpcs1br to hpcs250br all exist)"
}

make_netns() {
  local br="hpcs${NETNS_ID}br" k ns veth
  ip link add "$br" type bridge || die "cannot create the bridge $br (--netns)"
  ip addr add "$(node_addr 0)/24" dev "$br"
  ip link set "$br" up
  for ((k = 1; k <= nodes; ++k)); do
    ns="hpcs${NETNS_ID}n$k" veth="hpcs${NETNS_ID}v$k"
    ip netns add "$ns" || die "cannot create the network namespace $ns (--netns)"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip link set "$veth" master "$br" up
    ip netns exec "$ns" ip addr add "$(node_addr "$k")/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
  done
}

remove_netns() {  # whatever of NETNS_ID's namespaces, links and bridge exists, with their processes
  ((NETNS_ID)) || return 0
  local ns
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep "^hpcs${NETNS_ID}n" || true); do
    ip netns pids "$ns" | xargs -r kill -9 2> /dev/null || true
    ip netns del "$ns" 2> /dev/null || true
  done
  ip -o link show 2> /dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^hpcs${NETNS_ID}v" |
    xargs -r -n1 ip link del 2> /dev/null || true
  ip link del "hpcs${NETNS_ID}br" 2> /dev/null || true
}

node_states() { SLURM_CONF=$conf sinfo -h -N -o '%N %T' 2> /dev/null | sort -u; }

wait_idle() {  # wait_idle SECONDS NAME...: until every named node is idle (or allocated/mixed)
  local deadline=$((SECONDS + $1)) n states ok
  shift
  while :; do
    states=$(node_states)
    ok=1
    for n in "$@"; do
      grep -qE "^$n (idle|allocated|mixed|completing)\$" <<< "$states" || { ok=0; break; }
    done
    ((ok)) && return 0
    ((SECONDS < deadline)) || return 1
    sleep 0.3
  done
}

up() {
  # The arguments first, also where there is no root or Slurm to go further. Read in decimal (bash
  # took 08 for octal, and said "value too great for base" besides the error line) from a few
  # digits (20 of them wrapped, and passed into slurm.conf), and written back so: slurm.conf and
  # the loops below get 8. CPUs: Slurm keeps a node's in 16 bits, and no machine has 4096 cores
  # to share out.
  [[ "$nodes" =~ ^[0-9]{1,4}$ ]] && ((10#$nodes >= 1 && 10#$nodes <= 64)) ||
    die "--nodes must be a number from 1 to 64, not '$nodes'" 2
  [[ "$cpus" =~ ^[0-9]{1,5}$ ]] && ((10#$cpus <= 4096)) ||
    die "--cpus-per-node must be a number from 1 to 4096 (0: this machine's cores / N), not '$cpus'" 2
  [[ -z "$grace" || ("$grace" =~ ^[0-9]+$ && ${#grace} -le 5) ]] ||
    die "--preemption must be a grace time in whole seconds, not '$grace'" 2
  # A --dir under a file: mkdir printed its error once per subdirectory (seven lines), exit 1.
  local part=$dir
  while [[ ! -e "$part" && ! -L "$part" ]]; do part=${part%/*}; part=${part:-/}; done
  [[ -d "$part" ]] || die "--dir $dir: $part exists and is not a directory" 2
  kill_wait=${HPCTRAIN_SLURM_KILL_WAIT:-30}
  [[ "$kill_wait" =~ ^[1-9][0-9]{0,2}$ ]] && ((kill_wait >= 1 && kill_wait <= 300)) ||
    die "HPCTRAIN_SLURM_KILL_WAIT must be a whole number of seconds from 1 to 300, not '$kill_wait'" 2
  nodes=$((10#$nodes)) cpus=$((10#$cpus))
  [[ -z "$grace" ]] || grace=$((10#$grace))
  ((EUID == 0)) || die "needs root: slurmd runs jobs as the users who submit them (try sudo)" 2
  local c
  for c in munged munge slurmctld slurmd sinfo scontrol sbatch ss ip; do
    command -v "$c" > /dev/null ||
      die "'$c' not found: install Debian's slurm-wlm, munge and iproute2 (./setup.sh does)" 2
  done
  ((cpus > 0)) || cpus=$(($(nproc) / nodes))
  ((cpus > 0)) || cpus=1
  if is_up; then die "a local cluster is already up in $dir ('$me down' first)"; fi
  if [[ -e "$dir" ]]; then stop_everything quiet; fi  # a cluster's directory left behind (checked above)
  # munged serves everyone through a socket in DIR/munge, and insists that every directory
  # above it be searchable by all.
  local up_to=${dir%/*}
  while [[ -n "$up_to" ]]; do
    if [[ -d "$up_to" ]] && ! (((8#$(stat -c %a "$up_to") & 1) == 1)); then
      die "$up_to is not searchable by all ($(stat -c %a "$up_to")), which munged requires of the directories above its socket: chmod o+x it, or choose another --dir" 2
    fi
    up_to=${up_to%/*}
  done
  local made
  made=$(mkdir -p "$dir"/{etc,munge,state,spool,log,run,tmp} 2>&1) || {
    made=${made%%$'\n'*}
    die "cannot create --dir $dir: ${made##*: }" 2
  }
  require_own_dir  # again: in a shared parent another user may have made it in the meantime
  : > "$dir/.hpctrain-local-cluster"
  chmod 755 "$dir" "$dir/munge"
  # From here a failure stops what was started and removes the directory.
  trap 'if (($? != 0)); then stop_everything quiet; fi' EXIT

  (umask 077 && head -c 1024 /dev/urandom > "$dir/munge/munge.key")
  env "$marker" munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed" ||
    die "munged did not start: $(tail -1 "$dir/log/munged.log" 2> /dev/null)"

  local base
  base=$(free_port_base $((nodes + 1)))
  local names=() k
  for ((k = 1; k <= nodes; ++k)); do names+=("n$k"); done
  ((netns)) && NETNS_ID=$(free_netns_id)
  # Written first: a failure from here on removes what it names.
  printf 'NODES="%s"\nPORT_BASE=%s\nCPUS=%s\nNETNS_ID=%s\n' "${names[*]}" "$base" "$cpus" "$NETNS_ID" > "$state_file"
  ((netns)) && make_netns
  write_config "$base"

  env "$marker" slurmctld -f "$conf" -i || die "slurmctld did not start; see $dir/log/slurmctld.log"
  for n in "${names[@]}"; do start_slurmd "$n"; done
  if ! wait_idle 60 "${names[@]}"; then
    echo "$me: nodes: $(node_states | tr '\n' ' ')" >&2
    tail -n 5 "$dir/log/slurmctld.log" >&2 || true
    die "the nodes did not all become idle within 60 s"
  fi
  trap - EXIT
  echo "$me: up: $nodes node(s) (${names[*]}) with $cpus CPU(s) each, in $dir$( ((netns)) && echo ", each in its own network namespace (hpcs${NETNS_ID}n1...) at $(node_addr 1)...")"
  echo "$me: use it with: eval \"\$($0 env${dir:+ --dir $dir})\""
}

# ---------------------------------------------------------------------------------------------
# down, kill-node, start-node, status

stop_everything() {
  # Job steps first (SIGKILL: the cluster goes away, there is nothing to save), then the daemons,
  # which are marked through their environment, and munged last, which the others talk to.
  local steps daemons munged_pid p
  # shellcheck disable=SC2046  # lists of pids, split on purpose
  steps=$(with_descendants $(stepd_pids "$dir/spool/" "$dir/log/"))
  # shellcheck disable=SC2086
  [[ -n "${steps// /}" ]] && kill -9 $steps 2> /dev/null || true
  munged_pid=$(pid_in "$dir/munge/munged.pid")
  daemons=$(for p in $(pids_with_env "$marker"); do [[ "$p" == "$munged_pid" || "$p" == "$$" ]] || echo "$p"; done)
  # shellcheck disable=SC2086
  kill_and_wait 5 $daemons
  alive "$munged_pid" && kill_and_wait 5 "$munged_pid"
  load_state || true
  remove_netns
  if [[ -f "$dir/.hpctrain-local-cluster" ]]; then rm -rf "$dir"; fi
  [[ "${1:-}" == quiet ]] || echo "$me: down: stopped and removed $dir"
}

down() {
  if [[ ! -e "$dir" ]]; then echo "$me: nothing to stop in $dir"; return 0; fi
  stop_everything
}

known_node() {
  load_state || die "no local cluster in $dir" 1
  [[ " $NODES " == *" $1 "* ]] || die "no node '$1' in this cluster (nodes: $NODES)" 2
}

kill_node() {
  known_node "$node_arg"
  local first rest
  # At once, all of the node that lives in its slurmd's namespace; then what the slower searches
  # find besides (a node whose slurmd had died already). The searches below take seconds (a few
  # commands per process): a job that trains fast had ended before them.
  first=$(in_mount_namespace_of "$(pid_in "$dir/run/slurmd-$node_arg.pid")")
  # shellcheck disable=SC2086
  [[ -n "${first//[[:space:]]/}" ]] && kill -9 $first 2> /dev/null || true
  # shellcheck disable=SC2046  # lists of pids, split on purpose
  rest=$(with_descendants $(pids_with_env "$marker" "HPCTRAIN_SLURM_NODE=$node_arg") \
    $(stepd_pids "$dir/spool/$node_arg/" "$dir/log/slurmd-$node_arg.log"))
  # shellcheck disable=SC2086
  [[ -n "${rest// /}" ]] && kill -9 $rest 2> /dev/null || true
  # Gone when this returns: a process SIGKILLed in the middle of a system call lives on until the
  # call ends (a busy machine, I/O), and a start-node right after found "node n2's slurmd is
  # already running" (seen once in CI). Up to 10 s, then said.
  local p left deadline=$((SECONDS + 10))
  while :; do
    left=""
    for p in $first $rest; do alive "$p" && left+=" $p"; done
    [[ -z "$left" ]] && break
    ((SECONDS < deadline)) || { echo "$me: warning: node $node_arg: process(es)$left still alive 10 s after SIGKILL" >&2; break; }
    sleep 0.1
  done
  echo "$me: killed node $node_arg ($(printf '%s\n' $first $rest | sort -u | grep -c .) process(es): its slurmd, slurmstepd and job tasks)"
}

start_node() {
  known_node "$node_arg"
  alive "$(pid_in "$dir/run/slurmd-$node_arg.pid")" && die "node $node_arg's slurmd is already running"
  # A node whose steps all died with it (kill-node) starts as a rebooted machine would: without
  # what they left in its spool and tmp directories. The PMIx plugin's socket stepd.slurm.pmix.JOB.STEP
  # matters: Slurm 22.05 does not remove a stale one, so the same step of the requeued job could
  # never start on this node again (bind: Address already in use; the launch fails every time).
  local steps
  steps=$(stepd_pids "$dir/spool/$node_arg/" "$dir/log/slurmd-$node_arg.log")
  if [[ -z "${steps// /}" ]]; then
    rm -rf "$dir/spool/$node_arg"/stepd.slurm.pmix.* "$dir/spool/$node_arg"/pmix.*
    find "$dir/tmp/$node_arg" -mindepth 1 -delete
  fi
  start_slurmd "$node_arg"
  wait_idle 60 "$node_arg" || die "node $node_arg did not come back: $(node_states | tr '\n' ' ')"
  echo "$me: node $node_arg is back"
}

status() {
  if ! load_state; then echo "$me: no local cluster in $dir"; return 3; fi
  local bad=0 p n
  p=$(pid_in "$dir/munge/munged.pid")
  if alive "$p"; then echo "munged     pid $p"; else echo "munged     not running"; bad=1; fi
  p=$(pid_in "$dir/run/slurmctld.pid")
  if alive "$p"; then echo "slurmctld  pid $p, port $PORT_BASE"; else echo "slurmctld  not running"; return 3; fi
  for n in $NODES; do
    p=$(pid_in "$dir/run/slurmd-$n.pid")
    if alive "$p"; then echo "slurmd $n  pid $p"; else echo "slurmd $n  not running"; bad=1; fi
  done
  SLURM_CONF=$conf sinfo -N -o '%N %T %c %E' || bad=1
  SLURM_CONF=$conf squeue || bad=1
  return "$bad"
}

case "$cmd" in
  up) up ;;
  env)
    is_up || die "no local cluster is up in $dir ('$me up' first)" 3
    printf "export SLURM_CONF=%q\n" "$conf"  # quoted: a --dir with spaces or $ stays one word under eval
    ;;
  status) status ;;
  down) down ;;
  kill-node) kill_node ;;
  start-node) start_node ;;
esac
