#!/usr/bin/env bash
# slurm/local-cluster.sh itself: bad input gets one error line and exit 2; up, env, status,
# kill-node, start-node and down do what they say; down leaves no daemon, job or file behind.
source "$(dirname "$0")/common.sh"
if ((EUID != 0)); then echo "SKIPPED: the local Slurm cluster needs root"; exit 77; fi
command -v slurmctld > /dev/null || { echo "SKIPPED: no slurmctld (Debian package slurm-wlm)"; exit 77; }
TEST_DIR=$(mktemp -d /tmp/hpctrain-slurm-test-XXXXXX)
CLUSTER_DIR="$TEST_DIR/cluster"
WORK="$TEST_DIR"
trap slurm_cleanup EXIT
lc() { "$LOCAL_CLUSTER" "$@" --dir "$CLUSTER_DIR"; }

# expect_error CODE TEXT ARGS...: exit CODE and a single 'local-cluster.sh: error:' line with TEXT.
expect_error() {
  local code=$1 text=$2 rc=0 err
  shift 2
  err=$("$LOCAL_CLUSTER" "$@" 2>&1 > /dev/null) || rc=$?
  [[ $rc == "$code" ]] || fail "'$*' exited $rc, not $code ($err)"
  [[ $(wc -l <<< "$err") == 1 && "$err" == "local-cluster.sh: error: "*"$text"* ]] ||
    fail "'$*' said '$err', not one error line with '$text'"
  [[ "$err" != *" $code" ]] || fail "'$*' printed its exit code as part of the message: '$err'"
}
expect_error 2 "unknown command 'start'" start
expect_error 2 "--nodes must be a number from 1 to 64, not '0'" up --nodes 0 --dir "$CLUSTER_DIR"
expect_error 2 "--nodes must be a number from 1 to 64, not 'two'" up --nodes two --dir "$CLUSTER_DIR"
expect_error 2 "--cpus-per-node must be a number" up --cpus-per-node -1x --dir "$CLUSTER_DIR"
expect_error 2 "--dir needs a directory" up --dir
expect_error 2 "--preemption must be a grace time in whole seconds, not '30s'" up --preemption 30s --dir "$CLUSTER_DIR"
expect_error 2 "--preemption needs a grace time in seconds" up --preemption
HPCTRAIN_SLURM_KILL_WAIT=30s expect_error 2 "HPCTRAIN_SLURM_KILL_WAIT must be a whole number of seconds from 1 to 300, not '30s'" \
  up --dir "$CLUSTER_DIR"
expect_error 2 "--nodes, --cpus-per-node, --preemption and --netns belong to 'up'" down --preemption 10 --dir "$CLUSTER_DIR"
expect_error 2 "--nodes, --cpus-per-node, --preemption and --netns belong to 'up'" kill-node n1 --netns --dir "$CLUSTER_DIR"
expect_error 2 "unknown option '--node'" up --node 3
expect_error 2 "--nodes, --cpus-per-node, --preemption and --netns belong to 'up'" status --nodes 3
expect_error 2 "kill-node needs a node name" kill-node --dir "$CLUSTER_DIR"
expect_error 3 "no local cluster is up in $CLUSTER_DIR" env --dir "$CLUSTER_DIR"
mkdir "$TEST_DIR/precious" && echo keep > "$TEST_DIR/precious/file"
expect_error 2 "is not a local cluster's directory" up --dir "$TEST_DIR/precious"
# A directory that is not the script's own is refused by every command before anything is
# touched: "/" (also as an unset variable's "$UNSET/", or spelled otherwise), a user's directory.
# (A cluster.env there is not the script's to read: status must not run it.)
echo "touch $TEST_DIR/sourced" > "$TEST_DIR/precious/cluster.env"
for root in / "${UNSET_DIR-}/" // /tmp/.. /./; do
  expect_error 2 "--dir is the root directory '/'" up --dir "$root"
  expect_error 2 "--dir is the root directory '/'" down --dir "$root"
done
for c in down "kill-node n1" "start-node n1"; do
  # shellcheck disable=SC2086  # the command and its node, split on purpose
  expect_error 2 "$TEST_DIR/precious exists and is not a local cluster's directory" $c --dir "$TEST_DIR/precious/"
done
# Root's files only: a directory another user made (first, in a shared /tmp) or may write in,
# or a cluster directory whose cluster.env (which root sources) is someone else's.
mkdir -m 755 "$TEST_DIR/theirs" "$TEST_DIR/open" "$TEST_DIR/planted"
chown 65534 "$TEST_DIR/theirs"
chmod 777 "$TEST_DIR/open"
: > "$TEST_DIR/planted/.hpctrain-local-cluster"
echo "touch $TEST_DIR/sourced" > "$TEST_DIR/planted/cluster.env"
chown 65534 "$TEST_DIR/planted/cluster.env"
for c in up down status env; do
  expect_error 2 "$TEST_DIR/theirs is not root's own (owner nobody" $c --dir "$TEST_DIR/theirs"
  expect_error 2 "$TEST_DIR/open is writable by others (777)" $c --dir "$TEST_DIR/open"
  expect_error 2 "$TEST_DIR/planted/cluster.env is not root's own (owner nobody" $c --dir "$TEST_DIR/planted"
done
# A file of root's, or a link, is not "root's own (owner root, a link or not a directory)": each
# refusal says what is wrong.
: > "$TEST_DIR/a-file"
ln -s "$TEST_DIR/precious" "$TEST_DIR/a-link"
for c in up down status env; do
  expect_error 2 "--dir $TEST_DIR/a-file exists and is not a directory;" $c --dir "$TEST_DIR/a-file"
  expect_error 2 "$TEST_DIR/a-link is a link (to $TEST_DIR/precious):" $c --dir "$TEST_DIR/a-link"
done
[[ ! -e "$TEST_DIR/sourced" && -z "$(ls -A "$TEST_DIR/theirs")$(ls -A "$TEST_DIR/open")" ]] ||
  fail "a command used a directory that is not root's own"
rc=0; "$LOCAL_CLUSTER" status --dir "$TEST_DIR/precious" > /dev/null || rc=$?
[[ $rc == 3 && ! -e "$TEST_DIR/sourced" ]] || fail "status of a user's directory exited $rc or ran its cluster.env"
for f in /munge /state /spool /.hpctrain-local-cluster /cluster.env /etc/slurm.conf; do
  [[ ! -e "$f" ]] || fail "a refused --dir / left $f"
done
expect_error 2 "$TEST_DIR is not searchable by all (700)" up --dir "$CLUSTER_DIR"
[[ ! -e "$CLUSTER_DIR" ]] || fail "a failed up left $CLUSTER_DIR"
chmod 755 "$TEST_DIR"
[[ "$(cat "$TEST_DIR/precious/file")" == keep && "$(ls -A "$TEST_DIR/precious" | tr '\n' ' ')" == "cluster.env file " ]] ||
  fail "a command touched a directory that was not its own: $(ls -A "$TEST_DIR/precious")"
rc=0; lc status > /dev/null || rc=$?
[[ $rc == 3 ]] || fail "status of no cluster exited $rc, not 3"
[[ "$(lc down)" == *"nothing to stop"* ]] || fail "down with nothing up did not say so"
say "bad input: one error line and the right exit code each"

lc up --nodes 3 > /dev/null
eval "$(lc env)"
[[ "$SLURM_CONF" == "$CLUSTER_DIR/etc/slurm.conf" ]] || fail "env printed SLURM_CONF=$SLURM_CONF"
[[ "$(sinfo -h -N -o '%N %T' | tr '\n' ' ')" == "n1 idle n2 idle n3 idle " ]] || fail "nodes: $(sinfo -h -N -o '%N %T')"
expect_error 1 "already up" up --dir "$CLUSTER_DIR"
lc status > "$TEST_DIR/status" || fail "status of a healthy cluster failed: $(cat "$TEST_DIR/status")"
grep -q "slurmd n3  pid" "$TEST_DIR/status" || fail "status lacks n3's slurmd"
expect_error 2 "no node 'n4'" kill-node n4 --dir "$CLUSTER_DIR"

# A job on n2 when the node dies: its processes die with it.
job=$(sbatch --parsable -o /dev/null -w n2 --wrap 'srun sleep 317')
wait_state "$job" RUNNING 30
deadline=$((SECONDS + 20))
until pgrep -f '^(/usr/bin/)?sleep 317$' > /dev/null; do ((SECONDS < deadline)) || fail "the job's sleep did not start"; sleep 0.2; done
lc kill-node n2 > /dev/null
pgrep -f '^(/usr/bin/)?sleep 317$' > /dev/null && fail "the job's task on n2 survived kill-node"
rc=0; lc status > /dev/null || rc=$?
[[ $rc == 1 ]] || fail "status with a dead slurmd exited $rc, not 1"
scancel "$job"
lc start-node n2 > /dev/null
lc status > /dev/null || fail "status after start-node n2 is not healthy"
say "up, env, status, kill-node, start-node: as documented"

# A requeued job's step starts again on a node that died under it and came back: start-node
# leaves none of the killed step's files behind (its PMIx socket would refuse the same step).
job=$(sbatch --parsable --requeue -o "$TEST_DIR/again.out" -w n3 --wrap 'srun --mpi=pmix sleep 318')
wait_state "$job" RUNNING 30
deadline=$((SECONDS + 20))
until pgrep -f '^(/usr/bin/)?sleep 318$' > /dev/null; do ((SECONDS < deadline)) || fail "the pmix job's sleep did not start"; sleep 0.2; done
[[ -S "$CLUSTER_DIR/spool/n3/stepd.slurm.pmix.$job.0" ]] || fail "no PMIx socket of step $job.0 in n3's spool"
lc kill-node n3 > /dev/null
deadline=$((SECONDS + 60))
until [[ "$(sinfo -h -N -n n3 -o %T | head -n 1)" == down* ]]; do ((SECONDS < deadline)) || fail "n3 not marked down"; sleep 0.5; done
lc start-node n3 > /dev/null
wait_restarts "$job" 1 60
wait_state "$job" RUNNING 60
deadline=$((SECONDS + 30))
until pgrep -f '^(/usr/bin/)?sleep 318$' > /dev/null; do
  ((SECONDS < deadline)) || fail "the requeued job's step did not start again on n3: $(grep -h 'Cannot bind' "$CLUSTER_DIR/log/slurmd-n3.log" | tail -n 1)"
  sleep 0.2
done
scancel "$job"
say "after kill-node and start-node, the requeued job's step started again on the node"

# The epilog (slurm/epilog.sh, which every node runs at a job's end): the user's snapshots last
# written over an hour ago go, younger ones stay. (Each node has a /dev/shm of its own: the
# jobs themselves make and read them there.)
shm=/dev/shm/hpctrain-$(id -u)
job=$(sbatch --parsable -o "$TEST_DIR/make.out" -w n1 --wrap "mkdir -p $shm/0123456789abcdef $shm/fedcba9876543210 &&
  head -c 1000000 /dev/zero > $shm/0123456789abcdef/ckpt-000000001.hpck && touch -d '2 hours ago' $shm/0123456789abcdef")
wait_state "$job" COMPLETED 30
job=$(sbatch --parsable -o "$TEST_DIR/left.out" -w n1 --wrap "ls $shm")
wait_state "$job" COMPLETED 30
[[ "$(tr '\n' ' ' < "$TEST_DIR/left.out")" == "fedcba9876543210 " ]] ||
  fail "after the epilog, n1's $shm holds '$(cat "$TEST_DIR/left.out")', not the younger run's alone"
say "the epilog removed the snapshots over an hour old and kept the younger ones"

# down leaves nothing: no process of the cluster (daemons are known by its directory in their
# environment, job steps by their sockets), no directory.
job=$(sbatch --parsable -o /dev/null -N 3 --wrap 'srun sleep 317')
wait_state "$job" RUNNING 30
deadline=$((SECONDS + 20))
until [[ $(pgrep -c -f '^(/usr/bin/)?sleep 317$') == 3 ]]; do ((SECONDS < deadline)) || fail "the job's tasks did not start"; sleep 0.2; done
# This cluster's slurmstepd (another test's cluster may be running beside it): those holding a
# file of its directory open.
steps=$(for p in $(pgrep -x slurmstepd); do
  ls -l "/proc/$p/fd" 2> /dev/null | grep -q -- "$CLUSTER_DIR/" && echo "$p"
done)
[[ -n "$steps" ]] || fail "no slurmstepd of this cluster found while its job runs"
lc down > /dev/null
left=""
for p in /proc/[0-9]*; do
  env=$(tr '\0' '\n' 2> /dev/null < "$p/environ") || continue
  [[ $'\n'"$env"$'\n' == *$'\n'"HPCTRAIN_SLURM_CLUSTER=$CLUSTER_DIR"$'\n'* ]] && left+=" ${p#/proc/}"
done
[[ -z "$left" ]] || fail "processes left after down: $left"
pgrep -f '^(/usr/bin/)?sleep 317$' > /dev/null && fail "a job's process survived down"
for p in $steps; do
  [[ "$(ps -o stat= -p "$p")" == "" || "$(ps -o stat= -p "$p")" == Z* ]] || fail "slurmstepd $p survived down"
done
[[ ! -e "$CLUSTER_DIR" ]] || fail "down left $CLUSTER_DIR"
say "PASS"
