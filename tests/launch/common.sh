# What hpcrun's namespace tests share: the binaries and data (from CTest's environment), a short
# real training job, and ways to wait for and read its progress.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=netns.sh
source "$here/netns.sh"

: "${HPCRUN:?set HPCRUN to the hpcrun binary}" "${HPCTRAIN:?set HPCTRAIN to the hpctrain binary}"
FASHION_MNIST=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
SECONDS=0

# HPCRUN_TEST_KEEP=DIR keeps every log there (the private keys stay behind): of a failed run, or
# wherever a script calls keep_logs.
keep_logs() {
  if [[ -n "${HPCRUN_TEST_KEEP:-}" ]]; then
    mkdir -p "$HPCRUN_TEST_KEEP" && cp -r "$NETNS_DIR"/. "$HPCRUN_TEST_KEEP"/
    rm -f "$HPCRUN_TEST_KEEP"/ssh/id_ed25519 "$HPCRUN_TEST_KEEP"/ssh/h*/host_key
  fi
}

fail() {
  echo "FAIL: $*" >&2
  keep_logs
  for f in "${NETNS_DIR:-/nonexistent}"/*.err "${NETNS_DIR:-/nonexistent}"/ssh/h*/sshd.log; do
    [[ -f "$f" ]] && { echo "--- $f"; tail -40 "$f"; } >&2
  done
  exit 1
}
say() { echo "[$SECONDS s] $*"; }

# A real job, short: cnn on part of Fashion-MNIST, one thread per rank, batch norm over the global
# batch (so the world size changes no result beyond rounding), a checkpoint every 10 steps.
# Global batch 192: 64 per rank on 3 hosts, 96 on 2.
train_args() {
  echo --device cpu --threads 1 --data-dir "$FASHION_MNIST" --model cnn --global-batch-size 192 \
    --train-samples "${TRAIN_SAMPLES:-12000}" --test-samples 2000 --epochs "${EPOCHS:-1}" --sync-batch-norm \
    --checkpoint-every-steps 10 --checkpoint-interval 0 --step-timeout "${STEP_TIMEOUT:-30s}" ${TRAIN_EXTRA:-}
}

# hpcrun on the namespace hosts (hosts named by index: hpcrun_on "1 2 3" ...).
hpcrun_hosts() {
  local list="" k
  for k in $1; do list+="${list:+,}${NETNS_HOSTS[k]}"; done
  echo "$list"
}

# Starts hpcrun in the background: hpcrun_start NAME HPCRUN_ARGS... -- (then the job's checkpoint dir
# is $NETNS_DIR/NAME, its output $NETNS_DIR/NAME.out/.err, its pid in HPCRUN_PID).
hpcrun_start() {
  local name=$1
  shift
  local ck="$NETNS_DIR/$name"
  say "hpcrun $name, launch agent '$NETNS_AGENT'"
  # shellcheck disable=SC2046
  "$HPCRUN" --launch-agent "$NETNS_AGENT" --mpi-args "$NETNS_MPI_ARGS" --log-dir "$ck/hpcrun" "$@" \
    "$HPCTRAIN" $(train_args) --checkpoint-dir "$ck" > "$NETNS_DIR/$name.out" 2> "$NETNS_DIR/$name.err" &
  HPCRUN_PID=$!
  NETNS_KILL_AT_EXIT+=" $HPCRUN_PID"
}

hpcrun_wait() {  # hpcrun_wait SECONDS [WHAT]: its exit code in RC (fails the test on a hang)
  local deadline=$((SECONDS + $1))
  while kill -0 "$HPCRUN_PID" 2> /dev/null; do
    ((SECONDS < deadline)) || { kill -9 "$HPCRUN_PID"; fail "${2:-hpcrun} still running after $1 s"; }
    sleep 0.2
  done
  RC=0
  wait "$HPCRUN_PID" || RC=$?
}

# The global step in a job's heartbeat (0 before the first).
step_of() { sed -n 's/^step=//p' "$NETNS_DIR/$1/heartbeat" 2> /dev/null || true; }

# wait_for NAME "attempt 2:" SECONDS: until hpcrun's stderr shows the text.
wait_for_text() {
  local deadline=$((SECONDS + $3))
  until grep -q -- "$2" "$NETNS_DIR/$1.err" 2> /dev/null; do
    ((SECONDS < deadline)) || fail "no '$2' from hpcrun within $3 s"
    kill -0 "$HPCRUN_PID" 2> /dev/null || fail "hpcrun ended before '$2'"
    sleep 0.1
  done
}

# wait_for_step NAME STEP SECONDS [AFTER]: until the heartbeat shows at least STEP (and, with
# AFTER, a heartbeat newer than the file AFTER).
wait_for_step() {
  local deadline=$((SECONDS + $3)) s
  while :; do
    s=$(step_of "$1")
    ((${s:-0} >= $2)) && return 0
    ((SECONDS < deadline)) || fail "the job did not reach step $2 within $3 s (at ${s:-none})"
    kill -0 "$HPCRUN_PID" 2> /dev/null || fail "hpcrun ended before step $2"
    sleep 0.1
  done
}

# expect_relaunch NAME SINCE: attempt 2 starts, said with the seconds since SINCE (a $SECONDS
# reading taken when the failure was caused). The event is waited for; 120 s only ends a hang.
# (A bound of the timeouts plus 6 s failed beside two busy loops on two cores: 24 s, its ssh
# probes and mpirun's start-up taking the seconds the machine had, not hpcrun.)
expect_relaunch() {
  wait_for_text "$1" "attempt 2:" 120
  say "relaunched $((SECONDS - $2)) s after the failure began"
}

# The final test accuracy (percent) the job printed.
accuracy_of() { sed -n 's/.*done: .* test accuracy \([0-9.]*\)%.*/\1/p' "$NETNS_DIR/$1.out" | tail -1; }

expect_in() {  # expect_in NAME TEXT: hpcrun's stderr contains TEXT
  grep -q -- "$2" "$NETNS_DIR/$1.err" || fail "hpcrun's output lacks '$2'"
}

# expect_ssh_used NAME HOST_INDEX...: hpcrun's mpirun started the job's daemons through ssh (the
# attempt log's mpirun command names it as plm_rsh_agent, with the options hpcrun adds), and each
# host's sshd accepted logins with the test's key.
expect_ssh_used() {
  local name=$1
  shift
  grep -q -- "--mca plm_rsh_agent ssh -o BatchMode=yes -o ConnectTimeout=[0-9]* -F $NETNS_SSH_CONFIG " \
    "$NETNS_DIR/$name/hpcrun/attempt-1.log" || fail "mpirun's launch agent in attempt 1 of $name was not ssh with the test's config"
  expect_sshd_logins "$@"
}

expect_sshd_logins() {  # expect_sshd_logins HOST_INDEX...
  local k n
  for k in "$@"; do
    n=$(netns_sshd_logins "$k")
    ((n > 0)) || fail "the sshd of host $k logged no login with the test's key"
    say "sshd of host $k (${NETNS_HOSTS[k]}): $n login(s) with the test's key"
  done
}
