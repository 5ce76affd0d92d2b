#!/usr/bin/env bash
# Hosts ssh cannot use: one whose sshd is dead while the machine answers (connection refused), one
# that does not answer at all (its link cut: a timeout), one whose host key changed (a reinstalled
# machine), and a name that does not resolve. Each is one line from hpcrun naming the host, within
# --probe-timeout, and the job runs on the healthy hosts; with too few of those, exit code 2 at once.
# mpirun's own start-up, through the launch agent hpcrun gives it, gives up on a host that does not
# answer in bounded time too (ssh's connect timeout), rather than ssh's default two minutes.
# A host that ssh reaches but where Open MPI's daemon cannot start (a library of it broken there):
# mpirun names no host, hpcrun finds it by asking each host to start a daemon alone, blames it, and
# the job runs on the others instead of failing the same way on every restart.
source "$(dirname "$0")/common.sh"
netns_require
netns_setup 17 5
export TRAIN_SAMPLES=6000
# hpcrun's default. 3 s failed the healthy hosts beside two busy loops on two cores: an ssh login
# runs root's shell start-up, over 3 s under that load (bench/chaos.sh says the same).
probe=10

netns_kill_host 3
netns_cut_host 4
netns_rekey_host 5
H=("" "${NETNS_HOSTS[@]:1}")
bad="nohost.invalid"

probe_failed() {  # probe_failed HOST REASON_REGEX: exactly one line about HOST, saying REASON
  local n
  n=$(grep -c "host $1 failed its health probe" "$NETNS_DIR/bad.err" || true)
  [[ $n == 1 ]] || fail "$n lines about host $1's probe, not 1"
  grep -qE "host $1 failed its health probe \($2\); blacklisted for" "$NETNS_DIR/bad.err" ||
    fail "hpcrun's line about host $1 does not say $2: $(grep "host $1 " "$NETNS_DIR/bad.err")"
  say "$(grep "host $1 failed" "$NETNS_DIR/bad.err")"
}

started=$SECONDS
hpcrun_start bad -H "$(hpcrun_hosts "1 2 3 4 5"),$bad" -np 2 --probe-timeout ${probe}s
wait_for_text bad "attempt 1:" $((probe + 10))
took=$((SECONDS - started))
say "attempt 1 started ${took} s after hpcrun (--probe-timeout ${probe} s)"
hpcrun_wait 120
[[ $RC == 0 ]] || fail "the job ended with $RC"
expect_in bad "attempt 1: 2 rank(s) on ${H[1]}:1,${H[2]}:1"
expect_in bad "summary: 1 attempt(s), 0 failure(s)"
probe_failed "${H[3]}" "exit code 255: ssh: connect to host ${H[3]} port 22: Connection refused"
probe_failed "${H[4]}" "no answer \(timed out\)|exit code 255: ssh: connect to host ${H[4]} port 22: Connection timed out"
probe_failed "${H[5]}" "exit code 255: Host key verification failed\."
probe_failed "$bad" "exit code 255: ssh: Could not resolve hostname $bad: .*"
[[ -n "$(accuracy_of bad)" ]] || fail "the job printed no final accuracy"
expect_ssh_used bad 1 2

say "too few healthy hosts for --min-np: exit code 2, within --probe-timeout"
started=$SECONDS
hpcrun_start few -H "$(hpcrun_hosts "1 3 4 5"),$bad" -np 2 --probe-timeout ${probe}s
hpcrun_wait $((probe + 10))
[[ $RC == 2 ]] || fail "hpcrun ended with $RC, not 2"
expect_in few "cannot start: 1 healthy slot(s) (${H[1]}:1), --min-np 2 needed"
say "$(tail -1 "$NETNS_DIR/few.err") (after $((SECONDS - started)) s)"

# The agent exactly as hpcrun passed it to mpirun (from the attempt log's mpirun command), against
# the host that does not answer: mpirun ends by itself, ssh naming the host, within the connect
# timeout hpcrun put into the agent (a few seconds more for a loaded machine).
agent=$(grep -m1 "^hpcrun: .*plm_rsh_agent" "$NETNS_DIR/bad/hpcrun/attempt-1.log" | awk '{
  for (i = 1; i <= NF; ++i) if ($i == "plm_rsh_agent") {
    for (j = i + 1; j <= NF && $j != "-x" && $j != "--mca"; ++j) s = s (s == "" ? "" : " ") $j
    print s; exit
  } }')
say "mpirun with hpcrun's launch agent '$agent' on ${H[1]} and the cut ${H[4]}"
started=$SECONDS
# shellcheck disable=SC2086
mpirun --allow-run-as-root --host "${H[1]}:1,${H[4]}:1" --mca plm_rsh_agent "$agent" $NETNS_MPI_ARGS hostname \
  > "$NETNS_DIR/startup.out" 2> "$NETNS_DIR/startup.err" &
HPCRUN_PID=$!
NETNS_KILL_AT_EXIT+=" $HPCRUN_PID"
hpcrun_wait $((probe + 8)) mpirun
[[ $RC != 0 ]] || fail "mpirun succeeded with a host that cannot be reached"
grep -q "ssh: connect to host ${H[4]} port 22: Connection timed out" "$NETNS_DIR/startup.err" ||
  fail "mpirun's ssh did not time out on ${H[4]}: $(head -3 "$NETNS_DIR/startup.err")"
say "mpirun gave up after $((SECONDS - started)) s with exit code $RC: $(head -1 "$NETNS_DIR/startup.err")"
say "host 2 passes its health probe but cannot start Open MPI's daemon: a library of it broken there"
lib=$(readlink -f "$(ldd "$(readlink -f "$(command -v orted)")" | awk '/libopen-rte/ {print $3}')")
[[ -f "$lib" ]] || fail "cannot find orted's libopen-rte"
# In host 2's mount namespace alone (its sshd's): an empty file over the library.
ssh -F "$NETNS_SSH_CONFIG" "${H[2]}" ": > /tmp/empty-lib && mount --bind /tmp/empty-lib $lib" ||
  fail "cannot break Open MPI on host 2"
ssh -F "$NETNS_SSH_CONFIG" "${H[2]}" orted --version > "$NETNS_DIR/orted.out" 2>&1 &&
  fail "orted still runs on host 2: $(cat "$NETNS_DIR/orted.out")"
hpcrun_start daemon -H "$(hpcrun_hosts "1 2")" -np 2 --min-np 1 --max-restarts 1
hpcrun_wait 120
[[ $RC == 0 ]] || fail "the job ended with $RC"
grep -E "daemon|blacklisted" "$NETNS_DIR/daemon.err" | head -5
expect_in daemon "host ${H[2]} cannot start mpirun's daemon (exit code 127: orted: error while loading shared libraries: .*libopen-rte"
expect_in daemon "attempt 1 failed after .*: mpirun could not start its daemon on ${H[2]}$"
expect_in daemon "host ${H[2]} blacklisted"
expect_in daemon "attempt 2: 1 rank(s) on ${H[1]}:1"
[[ -n "$(accuracy_of daemon)" ]] || fail "the job printed no final accuracy"
say "PASS"
