#!/usr/bin/env bash
# Plain mpirun over ssh, without hpcrun, as the README shows it: two hosts, the program by its
# absolute path, a variable passed to the ranks with -x, to completion. A remote rank's environment
# is what sshd gives a login plus what -x passed, not the launcher's: the build directory is put in
# mpirun's PATH here and must not reach the ranks'.
source "$(dirname "$0")/common.sh"
netns_require
netns_setup 16 2
export TRAIN_SAMPLES=6000

build_dir=$(dirname "$HPCTRAIN")
export HPCRUN_TEST_PASSED_WITH_X="arrived-$$"
agent=$NETNS_AGENT
say "mpirun --host ${NETNS_HOSTS[1]}:1,${NETNS_HOSTS[2]}:1, launch agent '$agent'"
# shellcheck disable=SC2046,SC2086
PATH="$build_dir:$PATH" mpirun --allow-run-as-root --tag-output --host "${NETNS_HOSTS[1]}:1,${NETNS_HOSTS[2]}:1" \
  -x HPCRUN_TEST_PASSED_WITH_X --mca plm_rsh_agent "$agent" $NETNS_MPI_ARGS \
  "$HPCTRAIN" $(train_args) --checkpoint-dir "$NETNS_DIR/plain" > "$NETNS_DIR/plain.out" 2> "$NETNS_DIR/plain.err" &
HPCRUN_PID=$!  # the job's pid, for common.sh's waits
NETNS_KILL_AT_EXIT+=" $HPCRUN_PID"
wait_for_step plain 1 60

# Each host's rank, read from its /proc while it trains.
for k in 1 2; do
  pid=""
  for p in $(ip netns pids "hpt${NETNS_ID}h$k"); do
    [[ "$(cat "/proc/$p/comm" 2> /dev/null)" == hpctrain ]] && pid=$p
  done
  [[ -n "$pid" ]] || fail "no hpctrain process on host $k"
  env=$(tr '\0' '\n' < "/proc/$pid/environ")
  grep -qx "HPCRUN_TEST_PASSED_WITH_X=$HPCRUN_TEST_PASSED_WITH_X" <<< "$env" ||
    fail "the variable passed with -x did not reach the rank on host $k"
  path=$(sed -n 's/^PATH=//p' <<< "$env")
  [[ ":$path:" != *":$build_dir:"* ]] || fail "the rank on host $k got the launcher's PATH ($path)"
  say "host $k: hpctrain (pid $pid) has HPCRUN_TEST_PASSED_WITH_X=$HPCRUN_TEST_PASSED_WITH_X and the ssh login's PATH=$path"
done

hpcrun_wait 120 mpirun
[[ $RC == 0 ]] || fail "mpirun ended with $RC"
[[ -n "$(accuracy_of plain)" ]] || fail "the job printed no final accuracy"
say "finished: test accuracy $(accuracy_of plain)%"
expect_sshd_logins 1 2
say "PASS"
