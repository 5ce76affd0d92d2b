#!/usr/bin/env bash
# A flapping host: host 3 crashes (every process, sshd included) and reboots, is blacklisted for the
# cooldown's minimum, is tried again once it has passed (the job grows back onto it), crashes again
# for good and is blacklisted for twice as long; the job still finishes. (MAX is 10m: a host that
# runs the job that long since its last failure starts its count over, and the attempt between
# the crashes is shorter.)
source "$(dirname "$0")/common.sh"
netns_require
netns_setup 14 3
export EPOCHS=2

hpcrun_start flap -H "$(hpcrun_hosts "1 2 3")" -np 3 --min-np 2 --blacklist-cooldown 2s:10m \
  --discovery-interval 1s --max-restarts 3
wait_for_step flap 10 60
say "host 3 crashes and reboots"
netns_kill_host 3
netns_boot_host 3
wait_for_text flap "attempt 3: 3 rank(s)" 60
s=$(step_of flap)
wait_for_step flap $((s + 10)) 60
say "host 3 crashes again, and stays down"
netns_kill_host 3
hpcrun_wait 240
[[ $RC == 0 ]] || fail "the job ended with $RC"
expect_in flap "host ${NETNS_HOSTS[3]} blacklisted for 2 s (failure 1 of this host)"
expect_in flap "host ${NETNS_HOSTS[3]} is back after its cooldown"
expect_in flap "host ${NETNS_HOSTS[3]} blacklisted for 4 s (failure 2 of this host)"
expect_in flap "attempt 4: 2 rank(s)"
[[ -n "$(accuracy_of flap)" ]] || fail "the job printed no final accuracy"
expect_ssh_used flap 1 2 3
say "PASS"
