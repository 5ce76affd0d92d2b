#!/usr/bin/env bash
# slurm/chain.sh's and slurm/job.sh's own checks, which happen before Slurm is asked anything:
# stand-ins for sbatch, scancel and scontrol on PATH record what would be submitted. The number
# of segments is read in decimal and within 1..1000 (bash took 010 for 8 and wrapped a 20-digit
# number to 1), and so are slurm/local-cluster.sh up's --nodes and --cpus-per-node (no cluster is
# started); sbatch's abbreviations of the options chain.sh sets (--depend, --req, -dVALUE)
# are refused, and so is a CHECKPOINT_DIR that is a file or lies under one; job.sh refuses a REQUEUE, MAX_REQUEUES, MAX_FAILURES_IN_A_ROW, SRUN_WAIT (under srun) or MPIRUN_KILL_WAIT (under mpirun) it cannot use before the training runs,
# a LAUNCHER, HPCRUN, HPCTRAIN or staging setting it cannot use before it makes or stages anything,
# an empty --checkpoint-dir, and a --metrics-file that is a stream (its last line tells how the
# run ended); a stop with MAX_REQUEUES=0 on a job's first run exits with the
# trainer's code (it died on an unset SLURM_RESTART_COUNT); the options of a --config file count
# as given (the script added its own --checkpoint-dir over the file's), and one it cannot read is
# refused. Each refusal: one line, exit 2.
# slurm/epilog.sh ends a cleanup that ignores SIGTERM, refuses (one line, exit 0) a CLEAN_TIMEOUT,
# CLEAN_KILL_AFTER or HPCTRAIN it cannot use, and cleans every user's snapshots as that user.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d /tmp/hpctrain-slurm-scripts-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
cat > "$work/bin/sbatch" << 'EOF'
#!/bin/sh
# Options it does not know, refused as Slurm 22.05's sbatch (getopt's words), before the script.
for a in "$@"; do
  case "$a" in
    --epochs* | --lr*) printf "sbatch: unrecognized option '%s'\nTry \"sbatch --help\" for more information\n" "$a" >&2; exit 255 ;;
    -j) printf "sbatch: invalid option -- 'j'\nTry \"sbatch --help\" for more information\n" >&2; exit 255 ;;
    -*) ;;
    *) break ;;
  esac
done
if [ -n "${SBATCH_FAIL_AFTER:-}" ] && [ "$(wc -l < "$SUBMITTED")" -ge "$SBATCH_FAIL_AFTER" ]; then
  echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation" >&2
  exit 1
fi
# SBATCH_SLEEP=N:S: a submission after N others takes S seconds (SUBMITTED.sleeping made as it begins).
[ -z "${SBATCH_SLEEP:-}" ] || [ "$(wc -l < "$SUBMITTED")" -lt "${SBATCH_SLEEP%%:*}" ] ||
  { : > "$SUBMITTED.sleeping"; sleep "${SBATCH_SLEEP#*:}"; }
echo "$*" >> "$SUBMITTED"
[ -z "${DIRS:-}" ] || echo "$CHECKPOINT_DIR" >> "$DIRS"
[ -z "${SEGMENTS:-}" ] || echo "${CHAIN_SEGMENT:-}" >> "$SEGMENTS"
[ -z "${SBATCH_SAYS:-}" ] || { printf '%s\n' "$SBATCH_SAYS"; exit 0; }
echo "$(($(wc -l < "$SUBMITTED") + 100))"
EOF
printf '#!/bin/sh\n[ -z "${SCANCELLED:-}" ] || echo "$*" >> "$SCANCELLED"\n[ -z "${SCANCEL_FAILS:-}" ]\n' > "$work/bin/scancel"
# srun [OPTIONS] PROGRAM ARGS...: runs PROGRAM here (one task); its options recorded in SRUN_LOG.
cat > "$work/bin/srun" << 'EOF'
#!/usr/bin/env bash
options=()
for a in "$@"; do [[ "$a" == -* ]] || break; options+=("$a"); done
echo "${options[*]}" >> "${SRUN_LOG:-/dev/null}"
while [[ "$1" == -* ]]; do shift; done
exec "$@"
EOF
# scontrol: `show job -o ID` as Slurm answers it (ID 100, an array's id, lists each of its tasks;
# SCONTROL_DOWN: slurmctld does not answer; SCONTROL_SLEEP: it answers that many seconds late;
# SCONTROL_COMMAND: the job's script); every call recorded in SCONTROL_LOG. SCONTROL_REFUSE_REQUEUE:
# `requeue` is refused, and the job's state from then on is the one in SCONTROL_STATE_AFTER, if set
# (Slurm requeueing it itself meanwhile); SCONTROL_STATE: the job's state before (and the fields
# after it: "COMPLETING Reason=TimeLimit").
cat > "$work/bin/scontrol" << 'EOF'
#!/bin/sh
echo "$*" >> "${SCONTROL_LOG:-/dev/null}"
case "$1" in
requeue)
  if [ -n "${SCONTROL_REFUSE_REQUEUE:-}" ]; then
    [ -z "${SCONTROL_STATE_AFTER:-}" ] || echo "$SCONTROL_STATE_AFTER" > "$SCONTROL_LOG.state"
    for id; do :; done
    echo "scontrol: error: Requested operation is presently disabled for job $id" >&2
    exit 1
  fi
  ;;
show)
  [ -z "${SCONTROL_SLEEP:-}" ] || sleep "$SCONTROL_SLEEP"
  if [ -n "${SCONTROL_DOWN:-}" ]; then
    echo "slurm_load_jobs error: Socket timed out on send/recv operation" >&2
    exit 1
  fi
  if [ "$4" = 100 ]; then
    echo "JobId=101 ArrayJobId=100 ArrayTaskId=0 JobState=RUNNING"
    echo "JobId=100 ArrayJobId=100 ArrayTaskId=1 JobState=RUNNING"
  else
    state=${SCONTROL_STATE:-RUNNING}
    [ ! -f "${SCONTROL_LOG:-/nonexistent}.state" ] || state=$(cat "$SCONTROL_LOG.state")
    echo "JobId=$4 JobState=$state${SCONTROL_COMMAND:+ Command=$SCONTROL_COMMAND WorkDir=/tmp}"
  fi
  ;;
esac
EOF
chmod +x "$work/bin/"*
export PATH="$work/bin:$PATH" SUBMITTED="$work/submitted" CHECKPOINT_DIR="$work/ck"
failed=0
fail() { echo "FAIL: $*"; failed=1; }

# refused WHAT COMMAND...: exit 2 and one line on stderr; nothing submitted.
refused() {
  local what=$1 err rc
  shift
  : > "$SUBMITTED"
  err=$(timeout 30 "$@" 2>&1 > /dev/null)
  rc=$?
  if ((rc != 2)) || [[ $(printf '%s\n' "$err" | grep -c .) != 1 ]]; then
    fail "$what: exit $rc, want 2 and one line: $err"
  elif [[ -s "$SUBMITTED" ]]; then
    fail "$what: refused, but submitted $(wc -l < "$SUBMITTED") job(s)"
  else
    echo "ok: $what -> $err"
  fi
}

# segments ARG WANT: chain.sh ARG submits WANT jobs and says so.
segments() {
  local out
  : > "$SUBMITTED"
  out=$(timeout 30 "$repo/slurm/chain.sh" "$1" --time=10 -- --epochs 1 2>&1) || { fail "chain.sh $1: $out"; return; }
  local n
  n=$(wc -l < "$SUBMITTED")
  if ((n != $2)) || [[ "$out" != *"chain.sh: $2 segment(s)"* ]]; then
    fail "chain.sh $1 submitted $n job(s), want $2: $out"
  else
    echo "ok: chain.sh $1 -> $n segments"
  fi
}

segments 3 3
segments 010 10
segments 08 8
refused "chain.sh 0" "$repo/slurm/chain.sh" 0
refused "chain.sh 1001" "$repo/slurm/chain.sh" 1001
refused "chain.sh 18446744073709551617" "$repo/slurm/chain.sh" 18446744073709551617
refused "chain.sh 1e3" "$repo/slurm/chain.sh" 1e3
for option in --dependency=afterok:5 --depend=afterok:5 -d -dafterany:5 --requeue --reque --export=NONE --export; do
  refused "chain.sh 2 $option" "$repo/slurm/chain.sh" 2 "$option"
done
# hpctrain's options without the -- before them went to sbatch, which refused them (exit 255 and
# its two lines), and chain.sh said only "submitting segment 1 failed" (exit 1); --threads there
# sbatch took for its --threads-per-core, silently. Each: one line naming it, and where it goes.
for args in "--epochs 90" "--time=10 --lr=0.1 -- --epochs 1" "-j 2" "--threads 4 -- --epochs 1" "--threads=4"; do
  # shellcheck disable=SC2086  # the arguments as words
  refused "chain.sh 2 $args" "$repo/slurm/chain.sh" 2 $args
  # shellcheck disable=SC2086
  err=$("$repo/slurm/chain.sh" 2 $args 2>&1 > /dev/null)
  option=${args%% *} option=${option/#--time=10/--lr=0.1}
  [[ "$err" == *"'$option'"* && "$err" == *"hpctrain's options go after --"* ]] ||
    fail "chain.sh 2 $args: the error does not name '$option' and say hpctrain's options go after --: $err"
done
# A CHECKPOINT_DIR that is a file, or lies under one, failed every segment at its start, after all
# of them were submitted.
for bad in "$work/bin/sbatch" "$work/bin/sbatch/run" "$work/bin/sbatch/a/b/"; do
  refused "chain.sh with CHECKPOINT_DIR=$bad" env CHECKPOINT_DIR="$bad" "$repo/slurm/chain.sh" 2 -- --epochs 1
done
# An sbatch that prints more than the job id (a site's wrapper) had its words taken for the id.
for says in "Submitted batch job 7" $'7\nwarning: queue busy' " "; do
  : > "$SUBMITTED"
  err=$(SBATCH_SAYS=$says timeout 30 "$repo/slurm/chain.sh" 1 -- --epochs 1 2>&1 > /dev/null)
  rc=$?
  if ((rc != 1)) || [[ $(printf '%s\n' "$err" | grep -c .) != 1 || "$err" != *"not a job id"* ]]; then
    fail "chain.sh with sbatch printing '$says': exit $rc, want 1 and one line: $err"
  else
    echo "ok: chain.sh with sbatch printing '${says//$'\n'/\\n}' -> $err"
  fi
done
# A segment whose submission fails after others were submitted: those are cancelled, and the
# line says so; where scancel fails too, it says they stay queued (set -e ended the script at the
# failing scancel, before its line).
for scancel_fails in "" 1; do
  : > "$SUBMITTED"
  err=$(SBATCH_FAIL_AFTER=1 SCANCEL_FAILS=$scancel_fails timeout 30 "$repo/slurm/chain.sh" 2 -- --epochs 1 2>&1 > /dev/null)
  rc=$?
  want="cancelled the 1 segment(s) already submitted (101)"
  [[ -z "$scancel_fails" ]] || want="could not cancel (scancel failed: scancel them) the 1 segment(s) already submitted (101)"
  if ((rc != 1)) || [[ "$err" != *"submitting segment 2 failed; $want"* ]]; then
    fail "chain.sh whose second submission fails (scancel fails: ${scancel_fails:-no}): exit $rc, want 1 and '$want': $err"
  else
    echo "ok: chain.sh whose second submission fails (scancel fails: ${scancel_fails:-no})"
  fi
done
# A checkpoint directory every segment refuses (writable by others, or in a folder others may
# write to that is not sticky): all N were submitted, and each ended at once.
mkdir -p "$work/ww" && chmod 777 "$work/ww"
refused "chain.sh with CHECKPOINT_DIR in a folder others may write to" env CHECKPOINT_DIR="$work/ww/run" \
  "$repo/slurm/chain.sh" 2 -- --epochs 1
chmod 755 "$work/ww"
# Its output's reader gone (`| head -n 1`): SIGPIPE ended it after two of four submissions, the
# rest never submitted and the two left queued. Now every segment is submitted.
: > "$SUBMITTED"
(cd "$work" && timeout 30 "$repo/slurm/chain.sh" 4 -- --epochs 1 | head -n 1 > /dev/null; exit "${PIPESTATUS[0]}")
rc=$?
((rc == 0 && $(wc -l < "$SUBMITTED") == 4)) ||
  fail "chain.sh 4 | head -n 1: exit $rc, $(wc -l < "$SUBMITTED") of 4 segments submitted"
# A signal while it submits (a closed terminal: SIGHUP; SIGTERM): the segments submitted so far,
# the one under way included, are cancelled and the line says so. They were left queued.
for sig in TERM HUP; do
  : > "$SUBMITTED"
  : > "$work/scancelled"
  rm -f "$SUBMITTED.sleeping"
  (cd "$work" && SBATCH_SLEEP=2:1 SCANCELLED="$work/scancelled" exec "$repo/slurm/chain.sh" 5 -- --epochs 1 \
    > /dev/null 2> "$work/chain.err") &
  chain=$!
  for _ in $(seq 100); do [[ -e "$SUBMITTED.sleeping" ]] && break; sleep 0.05; done
  kill -"$sig" "$chain"
  wait "$chain"
  rc=$?
  want=$((128 + $(kill -l "$sig")))
  if ((rc != want)) || [[ "$(cat "$work/scancelled")" != "101 102 103" ]] ||
    ! grep -q "stopped by SIG$sig while submitting segment 3 of 5; cancelled the 3 segment(s) already submitted (101 102 103)" "$work/chain.err"; then
    fail "chain.sh sent SIG$sig while submitting: exit $rc (want $want), scancel got '$(cat "$work/scancelled")': $(cat "$work/chain.err")"
  else
    echo "ok: chain.sh sent SIG$sig while submitting segment 3 -> $(cat "$work/chain.err")"
  fi
done
# slurm/local-cluster.sh up's arguments, checked before it needs root or Slurm: --nodes 08 (or 080)
# printed bash's "value too great for base" besides the error line, and a 20-digit
# --cpus-per-node went into slurm.conf. HPCTRAIN_SLURM_KILL_WAIT=x, checked last, keeps arguments
# that pass from booting a cluster (a machine with root and Slurm would start one).
# cluster_refused WANT ARGS...: `local-cluster.sh up ARGS` exits 2 with one line holding WANT.
cluster_refused() {
  local want=$1 err rc
  shift
  err=$(HPCTRAIN_SLURM_KILL_WAIT=x timeout 30 "$repo/slurm/local-cluster.sh" up --dir "$work/cluster" "$@" 2>&1 > /dev/null)
  rc=$?
  if ((rc != 2)) || [[ $(printf '%s\n' "$err" | grep -c .) != 1 || "$err" != "local-cluster.sh: error: $want"* ]]; then
    fail "local-cluster.sh up $*: exit $rc, want 2 and one line '$want...': $err"
  else
    echo "ok: local-cluster.sh up $* -> $err"
  fi
}
cluster_refused "--nodes must be a number from 1 to 64, not '080'" --nodes 080
cluster_refused "--nodes must be a number from 1 to 64, not '00000000000000000000008'" --nodes 00000000000000000000008
cluster_refused "--cpus-per-node must be a number from 1 to 4096" --nodes 09 --cpus-per-node x
cluster_refused "--cpus-per-node must be a number from 1 to 4096" --cpus-per-node 99999999999999999999
cluster_refused "--cpus-per-node must be a number from 1 to 4096" --cpus-per-node 4097
cluster_refused "HPCTRAIN_SLURM_KILL_WAIT must be" --nodes 08 --cpus-per-node 08 --preemption 09
# A --dir under a file: seven lines of mkdir's (as root with Slurm there), exit 1.
: > "$work/not-a-dir"
cluster_refused "--dir $work/not-a-dir/c: $work/not-a-dir exists and is not a directory" --dir "$work/not-a-dir/c"
# A --dir that is a file, or a link: it said "is not root's own (owner root, a link or not a
# directory)" of a file of root's. Each says what is wrong.
cluster_refused "--dir $work/not-a-dir exists and is not a directory;" --dir "$work/not-a-dir"
ln -s "$work/bin" "$work/dir-link"
cluster_refused "$work/dir-link is a link (to $work/bin):" --dir "$work/dir-link"
[[ ! -e "$work/cluster" ]] || fail "local-cluster.sh up with bad arguments made $work/cluster"

# Two chains submitted at once (a loop over learning rates) shared the default directory, named
# to the second, and resumed each other's checkpoints; a site's SBATCH_EXPORT=NONE kept the
# segments from learning theirs.
: > "$SUBMITTED"
: > "$work/dirs"
for lr in 0.1 0.2; do
  (cd "$work" && DIRS="$work/dirs" SBATCH_EXPORT=NONE timeout 30 env -u CHECKPOINT_DIR "$repo/slurm/chain.sh" 1 -- --lr $lr > /dev/null)
done
if [[ $(sort -u "$work/dirs" | wc -l) != 2 ]]; then
  fail "two chains at once share a checkpoint directory: $(tr '\n' ' ' < "$work/dirs")"
elif [[ $(grep -c -- "--export=ALL " "$SUBMITTED") != 2 ]]; then
  fail "chain.sh passes no --export=ALL (a site's SBATCH_EXPORT=NONE): $(cat "$SUBMITTED")"
else
  echo "ok: two chains at once: $(tr '\n' ' ' < "$work/dirs")"
fi

# job.sh, sourced as train.sbatch sources it (set -euo pipefail); the trainer a stand-in that
# stops with 75, started by the srun stand-in.
cat > "$work/trainer" << 'EOF'
#!/bin/sh
exit 75
EOF
chmod +x "$work/trainer"
# job ENV... -- ARGS...: job_run_trainer ARGS with ENV, as a program (timeout runs no function).
cat > "$work/job" << 'EOF'
#!/usr/bin/env bash
env=()
while [[ "$1" != -- ]]; do env+=("$1"); shift; done
shift
exec env "${env[@]}" bash -c 'set -euo pipefail; source "$0/slurm/job.sh"; job_run_trainer "$@"' "$REPO" "$@"
EOF
chmod +x "$work/job"
export REPO=$repo
job="$work/job"
for bad in REQUEUE=yes MAX_REQUEUES=abc MAX_REQUEUES=1e3 MAX_REQUEUES=-1 MAX_REQUEUES=08x MAX_FAILURES_IN_A_ROW=0 MAX_FAILURES_IN_A_ROW=x \
  SRUN_WAIT=-1 SRUN_WAIT=1m SRUN_WAIT=86401 SRUN_WAIT=x; do
  refused "job.sh with $bad" "$job" HPCTRAIN="$work/trainer" LAUNCHER=srun SLURM_JOB_ID=1 "$bad" --
done
for bad in MPIRUN_KILL_WAIT=abc MPIRUN_KILL_WAIT=1m MPIRUN_KILL_WAIT=-5 MPIRUN_KILL_WAIT=86401 MPIRUN_KILL_WAIT=010x; do
  refused "job.sh with LAUNCHER=mpirun $bad" "$job" HPCTRAIN="$work/trainer" LAUNCHER=mpirun SLURM_JOB_ID=1 "$bad" --
done
# Each launcher's own setting is looked at under that launcher only: a stray bad MPIRUN_KILL_WAIT
# (a site's default environment) refused every srun job, which never reads it, and SRUN_WAIT every
# mpirun job. (Each runs: the trainer under srun, the stand-in mpirun, stops with 75; not requeued.)
mkdir -p "$work/stray-bin"
printf '#!/bin/sh\nexit 75\n' > "$work/stray-bin/mpirun"  # as its ranks would: checkpointed and stopped
chmod +x "$work/stray-bin/mpirun"
for stray in "LAUNCHER=srun MPIRUN_KILL_WAIT=abc" "LAUNCHER=mpirun SRUN_WAIT=1m"; do
  # shellcheck disable=SC2086  # the settings as words
  out=$(PATH="$work/stray-bin:$PATH" timeout 30 "$job" HPCTRAIN="$work/trainer" CHECKPOINT_DIR="$work/stray-ck" \
    REQUEUE=0 SLURM_JOB_ID=1 $stray -- 2>&1)
  rc=$?
  if ((rc != 75)) || [[ "$out" != *"the trainer checkpointed and stopped (exit 75)"* ]]; then
    fail "job.sh with $stray: exit $rc, want 75 (the trainer ran): $out"
  else
    echo "ok: job.sh with $stray -> runs (not its launcher's setting)"
  fi
done
refused "job.sh --checkpoint-dir ''" "$job" HPCTRAIN="$work/trainer" SLURM_JOB_ID=1 -- --checkpoint-dir ""
refused "job.sh --checkpoint-dir=" "$job" HPCTRAIN="$work/trainer" SLURM_JOB_ID=1 -- --checkpoint-dir=
# A checkpoint directory that cannot be made: one line with mkdir's reason (it was mkdir's line and ours).
refused "job.sh CHECKPOINT_DIR a file" "$job" HPCTRAIN="$work/trainer" SLURM_JOB_ID=1 CHECKPOINT_DIR="$work/trainer/ck" --
refused "job.sh --checkpoint-dir a file" "$job" HPCTRAIN="$work/trainer" SLURM_JOB_ID=1 -- --checkpoint-dir "$work/trainer"
# A metrics file that is a stream keeps no last line: every finished job was requeued.
mkfifo "$work/fifo"
refused "job.sh --metrics-file /dev/stdout" "$job" HPCTRAIN="$work/trainer" SLURM_JOB_ID=1 -- --metrics-file /dev/stdout
refused "job.sh --metrics-file=FIFO" "$job" HPCTRAIN="$work/trainer" SLURM_JOB_ID=1 -- "--metrics-file=$work/fifo"
# Under sbatch the script's stdout is a regular file (slurm-JOB.out): /dev/stdout is one then, and
# reading its last line inside $(...) read the reader's own pipe, for ever.
err=$(timeout 30 "$job" HPCTRAIN="$work/trainer" SLURM_JOB_ID=1 -- --metrics-file /dev/stdout 2>&1 > "$work/slurm-1.out")
rc=$?
[[ $rc == 2 && "$err" == *"--metrics-file /dev/stdout is not a regular file of its own"* ]] ||
  fail "job.sh --metrics-file /dev/stdout with stdout a file: exit $rc, want 2: $err"

# The job's output file full (a quota, a full disk, which is where the checkpoints often are too):
# job_log's first line failed under set -e and ended the batch shell before the trainer ran, and
# in the USR1 trap before the signal was passed on; Slurm then ended the job, unsaved. Here stdout
# and stderr are /dev/full, and the trainer still gets the warning signal and checkpoints (75).
cat > "$work/waiting-trainer" << 'EOF'
#!/bin/sh
trap 'echo stopped > "$MARK"; exit 75' USR1
echo started > "$MARK"
i=0
while [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
echo "not stopped" > "$MARK"
EOF
chmod +x "$work/waiting-trainer"
rm -f "$work/mark"
MARK="$work/mark" "$job" HPCTRAIN="$work/waiting-trainer" CHECKPOINT_DIR="$work/full-ck" REQUEUE=0 SLURM_JOB_ID=1 \
  LAUNCHER=srun -- > /dev/full 2>&1 &
full_job=$!
for _ in $(seq 100); do [[ "$(cat "$work/mark" 2> /dev/null)" == started ]] && break; sleep 0.1; done
kill -USR1 "$full_job"
wait "$full_job"
rc=$?
if [[ $rc != 75 || "$(cat "$work/mark" 2> /dev/null)" != stopped ]]; then
  fail "job.sh writing to a full output file: exit $rc, the trainer: $(cat "$work/mark" 2> /dev/null || echo never ran)"
else
  echo "ok: job.sh writing to a full output file -> the trainer ran, got SIGUSR1 and stopped (75)"
fi

# A --resume FILE or --resume none given to the job was given again to every requeued run (and
# chain segment): each started over from FILE, and hpctrain moved the newer checkpoints aside.
# A run that carries on an earlier one continues the newest checkpoint; a first run, or one with
# no checkpoint yet, keeps the option. The stand-in trainer records its arguments.
printf '#!/bin/sh\nprintf "%%s\\n" "$#" "$@" > "%s"\nexit 75\n' "$work/args" > "$work/recorder-trainer"
chmod +x "$work/recorder-trainer"
# resumes WHAT WANT ENV... -- ARGS...: the trainer gets WANT (the words of its --resume) from
# job_run_trainer ARGS under ENV, with one checkpoint in the directory unless ENV says EMPTY=1.
resumes() {
  local what=$1 want=$2 got out
  shift 2
  rm -rf "$work/resume-ck" "$work/args"
  mkdir -p "$work/resume-ck"
  [[ " $* " == *" EMPTY=1 "* ]] || : > "$work/resume-ck/ckpt-000000040.hpck"
  : > "$work/resume-ck/ckpt-000000900.hpck.tmp.77"  # unfinished: never the one continued
  out=$("$job" HPCTRAIN="$work/recorder-trainer" CHECKPOINT_DIR="$work/resume-ck" REQUEUE=0 SLURM_JOB_ID=1 "$@" 2>&1)
  got=$(awk 'value { print; value = 0 } $0 == "--resume" { printf "%s ", $0; value = 1 } /^--resume=/' "$work/args")
  if [[ "$got" != "$want" ]]; then
    fail "$what: the trainer got '$got', want '$want': $out"
  elif [[ "$want" == *auto* && "$out" != *"this one continues $work/resume-ck/ckpt-000000040.hpck (--resume auto)"* ]]; then
    fail "$what: no line says the run continues the newest checkpoint: $out"
  else
    echo "ok: $what -> $want"
  fi
}
resumes "--resume FILE on a requeued run" "--resume auto" SLURM_RESTART_COUNT=1 -- --resume /x/start.hpck --epochs 1
resumes "--resume=none on a requeued run" "--resume=auto" SLURM_RESTART_COUNT=3 -- --epochs 1 --resume=none
resumes "--resume FILE on chain segment 2" "--resume auto" SLURM_RESTART_COUNT=0 CHAIN_SEGMENT=2 -- --resume /x/start.hpck
resumes "--resume FILE on a first run" "--resume /x/start.hpck" SLURM_RESTART_COUNT=0 CHAIN_SEGMENT=1 -- --resume /x/start.hpck
resumes "--resume FILE on a requeued run with no checkpoint yet" "--resume /x/start.hpck" \
  SLURM_RESTART_COUNT=2 EMPTY=1 -- --resume /x/start.hpck
# The other arguments reach the trainer as they were: a value holding a newline was read back
# as two arguments, and the trainer refused the run (exit 2, never requeued).
resumes "--resume FILE on a requeued run, beside a value of two lines" "--resume auto" SLURM_RESTART_COUNT=1 \
  -- --resume /x/start.hpck --log-file $'two\nlines'
# (The trainer's first line is its number of arguments, the ones the job adds included.)
if ! grep -qx -A1 two "$work/args" || (($(head -n 1 "$work/args") != $(wc -l < "$work/args") - 2)); then
  fail "a value of two lines beside --resume: the trainer got $(head -n 1 "$work/args") arguments: $(cat "$work/args")"
fi
# A requeued run of a training begun with --resume none (or FILE) continued a checkpoint that was
# in the directory before its first run (a training before it, which hpctrain moves aside as it
# sets up) when that first run ended before then. The first run notes the newest checkpoint; a
# requeued run continues only one written since (another name, or the same name in a new file).
# first_then_requeued WHAT WANT BETWEEN: the requeued run's trainer gets WANT, BETWEEN run between.
first_then_requeued() {
  local what=$1 want=$2 between=$3 got out
  rm -rf "$work/resume-ck" "$work/args"
  mkdir -p "$work/resume-ck"
  : > "$work/resume-ck/ckpt-000000040.hpck"
  "$job" HPCTRAIN="$work/recorder-trainer" CHECKPOINT_DIR="$work/resume-ck" REQUEUE=0 SLURM_JOB_ID=1 \
    SLURM_RESTART_COUNT=0 -- --resume none > /dev/null 2>&1
  eval "$between"
  out=$("$job" HPCTRAIN="$work/recorder-trainer" CHECKPOINT_DIR="$work/resume-ck" REQUEUE=0 SLURM_JOB_ID=1 \
    SLURM_RESTART_COUNT=1 -- --resume none 2>&1)
  got=$(awk 'value { print; value = 0 } $0 == "--resume" { printf "%s ", $0; value = 1 }' "$work/args")
  if [[ "$got" != "$want" ]]; then
    fail "$what: the trainer got '$got', want '$want': $out"
  else
    echo "ok: $what -> $want"
  fi
}
first_then_requeued "a requeued run after a first run that wrote no checkpoint" "--resume none" ":"
first_then_requeued "a requeued run after a first run that wrote one" "--resume auto" \
  ': > "$work/resume-ck/ckpt-000000050.hpck"'
first_then_requeued "a requeued run after a first run that wrote one of the same name" "--resume auto" \
  ': > "$work/resume-ck/new" && mv "$work/resume-ck/new" "$work/resume-ck/ckpt-000000040.hpck"'
# HPCTRAIN or HPCRUN set to a program that is not there was replaced by the one on PATH, which
# ran without a word; one left unset still falls back to PATH's.
mkdir -p "$work/path-bin"
printf '#!/bin/sh\necho path-trainer > "%s"\nexit 75\n' "$work/ran" > "$work/path-bin/hpctrain"
chmod +x "$work/path-bin/hpctrain"
for set_to in "HPCTRAIN=$work/typo/hpctrain" "LAUNCHER=hpcrun HPCRUN=$work/typo/hpcrun"; do
  rm -f "$work/ran"
  # shellcheck disable=SC2086  # the settings as words
  refused "job.sh with $set_to" env PATH="$work/path-bin:$PATH" $set_to SLURM_JOB_ID=5 CHECKPOINT_DIR="$work/typo-ck" \
    bash -c 'set -euo pipefail; HPCTRAIN_HOME=$0; source "$0/slurm/job.sh"; job_find_programs; job_run_trainer' "$repo"
  [[ ! -e "$work/ran" ]] || fail "job.sh with $set_to ran the hpctrain on PATH"
done
rm -f "$work/ran"
env -u HPCTRAIN PATH="$work/path-bin:$PATH" SLURM_JOB_ID=5 CHECKPOINT_DIR="$work/typo-ck" REQUEUE=0 bash -c \
  'set -euo pipefail; HPCTRAIN_HOME=$0; source "$1/slurm/job.sh"; job_find_programs; job_run_trainer' "$work/no-home" \
  "$repo" > /dev/null 2>&1
[[ "$(cat "$work/ran" 2> /dev/null)" == path-trainer ]] || fail "HPCTRAIN unset: the hpctrain on PATH did not run"
# An install's scripts (HPCTRAIN_HOME PREFIX/share/hpctrain) run PREFIX/bin's programs, not
# PATH's first (HPCToolkit's hpcrun, an older install's in /usr/local/bin).
mkdir -p "$work/prefix/bin" "$work/prefix/share/hpctrain"
printf '#!/bin/sh
echo installed-trainer > "%s"
exit 75
' "$work/ran" > "$work/prefix/bin/hpctrain"
chmod +x "$work/prefix/bin/hpctrain"
rm -f "$work/ran"
env -u HPCTRAIN PATH="$work/path-bin:$PATH" SLURM_JOB_ID=5 CHECKPOINT_DIR="$work/typo-ck" REQUEUE=0 bash -c \
  'set -euo pipefail; HPCTRAIN_HOME=$0; source "$1/slurm/job.sh"; job_find_programs; job_run_trainer' \
  "$work/prefix/share/hpctrain" "$repo" > /dev/null 2>&1
[[ "$(cat "$work/ran" 2> /dev/null)" == installed-trainer ]] ||
  fail "an install's job.sh did not run the install's hpctrain: $(cat "$work/ran" 2> /dev/null)"
# The AWS cluster's data credentials, for train.sbatch's and sweep.sbatch's staging alike (only
# train.sbatch pointed AWS_SHARED_CREDENTIALS_FILE at them: every sweep task's staging failed).
printf '#!/bin/sh\necho "${AWS_SHARED_CREDENTIALS_FILE:-unset}" > "%s"\nexit 75\n' "$work/ran" > "$work/aws-trainer"
chmod +x "$work/aws-trainer"
: > "$work/credentials"
rm -f "$work/ran"
env -u AWS_SHARED_CREDENTIALS_FILE job_aws_credentials_file="$work/credentials" "$job" HPCTRAIN="$work/aws-trainer" \
  CHECKPOINT_DIR="$work/aws-ck" REQUEUE=0 SLURM_JOB_ID=1 -- > /dev/null 2>&1
[[ "$(cat "$work/ran" 2> /dev/null)" == "$work/credentials" ]] ||
  fail "job_run_trainer: the trainer's AWS_SHARED_CREDENTIALS_FILE is '$(cat "$work/ran" 2> /dev/null)', want $work/credentials"
: > "$work/segments"
(cd "$work" && SEGMENTS="$work/segments" timeout 30 "$repo/slurm/chain.sh" 3 -- --resume none > /dev/null)
[[ $(tr '\n' ' ' < "$work/segments") == "1 2 3 " ]] ||
  fail "chain.sh's segments are told CHAIN_SEGMENT '$(tr '\n' ' ' < "$work/segments")', want '1 2 3 '"

# sweep.sbatch: an option naming a run's own files, given to every task, was shared by them all
# (they resumed each other's checkpoints).
for option in "--checkpoint-dir=$work/x" "--metrics-file $work/x" "--timeline-file $work/x" "--prometheus-file=$work/x"; do
  # shellcheck disable=SC2086  # the option and its value as two words
  refused "sweep.sbatch $option" env HPCTRAIN_HOME="$repo" HPCTRAIN="$work/trainer" SLURM_JOB_ID=5 \
    SLURM_ARRAY_JOB_ID=5 SLURM_ARRAY_TASK_ID=0 SLURM_JOB_NAME=sweep SLURM_SUBMIT_DIR="$work" \
    bash "$repo/slurm/sweep.sbatch" --epochs 1 $option
done
# SWEEP set but empty ran the script's example grid (6 points) without a word; an option named
# twice gave every task both values. Outside sbatch (SLURM_JOB_NAME or SLURM_ARRAY_JOB_ID unset)
# the scripts ended on bash's "unbound variable". A SWEEP of blanks alone is empty too, newlines and
# tabs as spaces (it ran one task without any option of the sweep).
for grid in "" " " $'\n' $'\t\n ' "lr=0.1 lr=0.2" "lr=0.1,0.2 wd=1 lr=3"; do
  refused "sweep.sbatch with SWEEP='$grid'" env HPCTRAIN_HOME="$repo" HPCTRAIN="$work/trainer" SLURM_JOB_ID=5 \
    SLURM_ARRAY_JOB_ID=5 SLURM_ARRAY_TASK_ID=0 SLURM_JOB_NAME=sweep SLURM_SUBMIT_DIR="$work" SWEEP="$grid" \
    SWEEP_DIR="$work/sweep-empty" bash "$repo/slurm/sweep.sbatch" --epochs 1
done
# An array task id read in decimal: '08' printed bash's "value too great for base" too.
refused "sweep.sbatch task 08 of 8" env HPCTRAIN_HOME="$repo" HPCTRAIN="$work/trainer" SLURM_JOB_ID=5 \
  SLURM_ARRAY_JOB_ID=5 SLURM_ARRAY_TASK_ID=08 SLURM_JOB_NAME=sweep SLURM_SUBMIT_DIR="$work" SWEEP="lr=1,2,3,4,5,6,7,8" \
  SWEEP_DIR="$work/sweep-empty" bash "$repo/slurm/sweep.sbatch" --epochs 1
rm -f "$work/args"
env HPCTRAIN_HOME="$repo" HPCTRAIN="$work/recorder-trainer" SLURM_JOB_ID=5 REQUEUE=0 SLURM_ARRAY_JOB_ID=5 \
  SLURM_ARRAY_TASK_ID=08 SLURM_JOB_NAME=sweep SLURM_SUBMIT_DIR="$work" SWEEP="lr=1,2,3,4,5,6,7,8,9" \
  SWEEP_DIR="$work/sweep-08" bash "$repo/slurm/sweep.sbatch" --epochs 1 > "$work/sweep-08.out" 2>&1
[[ "$(grep -x -A1 -- --lr "$work/args" 2> /dev/null | tail -1)" == 9 ]] ||
  fail "sweep.sbatch task 08 of 9 did not run --lr 9: $(cat "$work/sweep-08.out")"
# SWEEP over several lines (a grid written one entry a line): the size counted every line, but
# each task read only the first line's entry, so the points of the others were never run.
rm -f "$work/args"
(cd "$work" && env HPCTRAIN_HOME="$repo" HPCTRAIN="$work/recorder-trainer" SLURM_JOB_ID=5 REQUEUE=0 \
  SLURM_ARRAY_JOB_ID=5 SLURM_ARRAY_TASK_ID=3 SLURM_JOB_NAME=sweep SLURM_SUBMIT_DIR="$work" \
  SWEEP=$'lr=1,2\nwd=3,4\n' SWEEP_DIR="$work/sweep-lines" bash "$repo/slurm/sweep.sbatch" --epochs 1 > "$work/sweep-lines.out" 2>&1)
got=$(grep -x -A1 -e --lr -e --wd "$work/args" 2> /dev/null | grep -v -- '^--$' | tr '\n' ' ')
if [[ "$got" != "--lr 2 --wd 4 " ]]; then
  fail "sweep.sbatch task 3 of SWEEP='lr=1,2<newline>wd=3,4' ran '$got', want '--lr 2 --wd 4': $(cat "$work/sweep-lines.out")"
else
  echo "ok: sweep.sbatch with SWEEP on two lines: task 3 -> $got"
fi
# A '/' in a value (a sweep over paths) split the task's name into directories, and with '..'
# (/../../escaped) put its checkpoints outside SWEEP_DIR: '/' is %2F there (and '%' %25);
# hpctrain gets the value as it is.
for task in "0 /../../escaped task-0_data-dir=%2F..%2F..%2Fescaped_seed=1%25" "1 d/e task-1_data-dir=d%2Fe_seed=1%25"; do
  read -r index value want <<< "$task"
  rm -f "$work/args"
  env HPCTRAIN_HOME="$repo" HPCTRAIN="$work/recorder-trainer" SLURM_JOB_ID=5 REQUEUE=0 SLURM_ARRAY_JOB_ID=5 \
    SLURM_ARRAY_TASK_ID="$index" SLURM_JOB_NAME=sweep SLURM_SUBMIT_DIR="$work" SWEEP="data-dir=/../../escaped,d/e seed=1%" \
    SWEEP_DIR="$work/sweep-paths/in" bash "$repo/slurm/sweep.sbatch" --epochs 1 > "$work/sweep-paths.out" 2>&1
  got=$(grep -x -A1 -- --checkpoint-dir "$work/args" 2> /dev/null | tail -1)
  if [[ "$got" != "$work/sweep-paths/in/$want" || ! -d "$got" ]] || [[ -n "$(find "$work/sweep-paths" -maxdepth 1 -name "escaped*")" ]] ||
    [[ "$(grep -x -A1 -- --data-dir "$work/args" | tail -1)" != "$value" ]]; then
    fail "sweep.sbatch task $index with data-dir=$value: checkpoints in '$got', want $work/sweep-paths/in/$want: $(cat "$work/sweep-paths.out")"
  else
    echo "ok: sweep.sbatch task $index with data-dir=$value -> ${got#"$work/"}"
  fi
done
refused "sweep.sbatch without SLURM_ARRAY_JOB_ID" env -u SLURM_ARRAY_JOB_ID -u SWEEP_DIR -u CHECKPOINT_DIR \
  HPCTRAIN_HOME="$repo" HPCTRAIN="$work/trainer" SLURM_JOB_ID=5 SLURM_ARRAY_TASK_ID=0 SLURM_JOB_NAME=sweep \
  SLURM_SUBMIT_DIR="$work" bash "$repo/slurm/sweep.sbatch" --epochs 1
for script in train sweep; do
  refused "$script.sbatch without SLURM_JOB_NAME" env -u SLURM_JOB_NAME -u SWEEP_DIR -u CHECKPOINT_DIR \
    HPCTRAIN_HOME="$repo" HPCTRAIN="$work/trainer" SLURM_JOB_ID=5 SLURM_ARRAY_TASK_ID=0 SLURM_ARRAY_JOB_ID=5 \
    SLURM_SUBMIT_DIR="$work" bash "$repo/slurm/$script.sbatch" --epochs 1
done
[[ ! -e "$work/sweep-empty" && ! -e "$work/runs" ]] || fail "a refused sweep.sbatch or train.sbatch made a directory"
# chain.sh with CHAIN_SCRIPT=slurm/sweep.sbatch gives every segment one CHECKPOINT_DIR, but each
# segment (an array of its own) put its tasks under a new runs/<name>-<array id>: every segment
# started from scratch. The tasks' directories are under CHECKPOINT_DIR where it is set.
rm -f "$work/args"
env -u SWEEP_DIR HPCTRAIN_HOME="$repo" HPCTRAIN="$work/recorder-trainer" CHECKPOINT_DIR="$work/chained" REQUEUE=0 \
  SLURM_JOB_ID=12 SLURM_ARRAY_JOB_ID=12 SLURM_ARRAY_TASK_ID=1 SLURM_JOB_NAME=sweep SLURM_SUBMIT_DIR="$work" \
  SWEEP="lr=0.1,0.2" bash "$repo/slurm/sweep.sbatch" --epochs 1 > "$work/chained.out" 2>&1
got=$(grep -x -A1 -- --checkpoint-dir "$work/args" 2> /dev/null | tail -1)
if [[ "$got" == "$work/chained/task-1_lr=0.2" ]]; then
  echo "ok: sweep.sbatch with CHECKPOINT_DIR (chain.sh's): task 1 in $got"
else
  fail "sweep.sbatch with CHECKPOINT_DIR (chain.sh's) and no SWEEP_DIR: task 1 in '$got': $(cat "$work/chained.out")"
fi

# Outside a Slurm job (or with SLURM_SUBMIT_DIR unset) the scripts said two lines, or "unbound
# variable".
for script in train sweep; do
  refused "$script.sbatch outside Slurm" env -u SLURM_JOB_ID -u SLURM_SUBMIT_DIR HPCTRAIN_HOME= bash "$repo/slurm/$script.sbatch"
  refused "$script.sbatch without SLURM_SUBMIT_DIR" env -u SLURM_SUBMIT_DIR SLURM_JOB_ID=5 SLURM_JOB_NAME=x \
    SLURM_ARRAY_TASK_ID=0 SLURM_ARRAY_JOB_ID=5 HPCTRAIN_HOME="$repo" HPCTRAIN="$work/trainer" bash "$repo/slurm/$script.sbatch"
done
# --metrics-file - names a file "-": tail read its stdin instead, and a finished job was requeued.
mkdir -p "$work/dash"
cat > "$work/done-trainer" << 'EOF'
#!/bin/sh
echo '{"event":"done","step":1}' > ./-
EOF
chmod +x "$work/done-trainer"
out=$(cd "$work/dash" && timeout 30 "$job" HPCTRAIN="$work/done-trainer" CHECKPOINT_DIR="$work/dash-ck" SLURM_JOB_ID=1 \
  JOB_STATE_RETRY_SECONDS=0 -- --metrics-file - 2>&1 < /dev/null)
rc=$?
if ((rc != 0)) || [[ "$out" != *"the training finished"* ]]; then
  fail "job.sh --metrics-file - after the training finished: exit $rc, want 0: $out"
else
  echo "ok: job.sh --metrics-file - -> the training finished"
fi

# stop_ends WHAT SAYS ENV...: a stop (75) under ENV is not requeued: job_requeue_or_exit exits 75
# and its line holds SAYS.
stop_ends() {
  local what=$1 says=$2 out rc
  shift 2
  out=$(env "$@" SLURM_JOB_ID=1 \
    bash -c 'set -euo pipefail; source "$0/slurm/job.sh"; job_requeue_or_exit 75 "the trainer stopped"' "$repo" 2>&1)
  rc=$?
  if ((rc != 75)) || [[ "$out" != *"$says"* ]]; then
    fail "$what: exit $rc, want 75: $out"
  else
    echo "ok: $what -> 75"
  fi
}
# requeues WHAT ASKS SAYS ENV...: a stop (75) under ENV is requeued: job_requeue_or_exit runs
# `scontrol requeue ASKS`, exits 0, and its lines hold SAYS.
requeues() {
  local what=$1 asks=$2 says=$3 out rc
  shift 3
  : > "$work/scontrol.log"
  out=$(env "$@" SCONTROL_LOG="$work/scontrol.log" JOB_STATE_RETRY_SECONDS=0 \
    bash -c 'set -euo pipefail; source "$0/slurm/job.sh"; job_requeue_or_exit 75 "the trainer stopped"' "$repo" 2>&1)
  rc=$?
  if ((rc != 0)) || ! grep -qx "requeue $asks" "$work/scontrol.log" || [[ "$out" != *"$says"* ]]; then
    fail "$what: exit $rc, want 0 and 'scontrol requeue $asks': $out; scontrol ran: $(tr '\n' ';' < "$work/scontrol.log")"
  else
    echo "ok: $what -> scontrol requeue $asks"
  fi
}
# The sweep task whose job id is the array's own: that id lists every task (it read "RUNNING
# RUNNING" and ended 75), and `scontrol requeue` of it requeues them all.
requeues "an array task whose job id is the array's" "Incomplete 100_1" "requeueing" \
  SLURM_JOB_ID=100 SLURM_ARRAY_JOB_ID=100 SLURM_ARRAY_TASK_ID=1
requeues "a job" "Incomplete 7" "requeueing" -u SLURM_ARRAY_JOB_ID -u SLURM_ARRAY_TASK_ID SLURM_JOB_ID=7
# slurmctld not answering at the time limit's warning: set -e ended the script, exit 1, no requeue.
requeues "slurmctld not answering" 7 "did not say the job's state" -u SLURM_ARRAY_JOB_ID -u SLURM_ARRAY_TASK_ID \
  SLURM_JOB_ID=7 SCONTROL_DOWN=1
# A job that reached its time limit before the warning signal came (or with none asked for):
# Slurm shows it COMPLETING (Reason=TimeLimit) while it sends SIGTERM, on which the trainer
# checkpoints and exits 75. The script left it as a job Slurm was ending, and the training ended
# there, checkpointed. A cancelled one (COMPLETING for another reason, CANCELLED) is left as it was.
for state in "COMPLETING Reason=TimeLimit" "TIMEOUT Reason=TimeLimit"; do
  requeues "a job at its time limit ($state)" 7 "the job reached its time limit in Slurm" \
    -u SLURM_ARRAY_JOB_ID -u SLURM_ARRAY_TASK_ID SLURM_JOB_ID=7 SCONTROL_STATE="$state"
done
# (The reason is the one right after the state: a Comment the user set may say Reason=TimeLimit.)
# Nor the last JobState=: a Comment's said RUNNING, and the cancelled job was requeued.
for state in "COMPLETING Reason=None" "CANCELLED Reason=None" "COMPLETING Reason=None Comment=see Reason=TimeLimit" \
  "CANCELLED Reason=None Comment=was JobState=RUNNING before"; do
  stop_ends "a cancelled job (${state})" "the job is ${state%% *} in Slurm, so this script does not requeue it" \
    SCONTROL_STATE="$state"
done
stop_ends "a requeue refused at the time limit" \
  "'scontrol requeue' refused as Slurm ends the job at its time limit (a site without requeue: see slurm/chain.sh): exit 75" \
  SCONTROL_STATE="COMPLETING Reason=TimeLimit" SCONTROL_REFUSE_REQUEUE=1 JOB_STATE_RETRY_SECONDS=0

# slurmctld not answering train.sbatch's own `scontrol show job` (which names the script sbatch
# ran): the checkout is the submission directory (`sbatch slurm/train.sbatch` from its root). It
# was that directory's parent, where no slurm/job.sh is, and the job failed for good (exit 2).
# So does an answer of Command=(null) (a script sent on stdin: sbatch < slurm/train.sbatch), whose
# "directory" was taken for the script's.
for answer in SCONTROL_DOWN=1 "SCONTROL_COMMAND=(null)"; do
  rm -f "$work/args"
  out=$(cd "$repo" && env -u HPCTRAIN_HOME -u SLURM_ARRAY_JOB_ID -u SLURM_ARRAY_TASK_ID "$answer" \
    HPCTRAIN="$work/recorder-trainer" CHECKPOINT_DIR="$work/fallback-ck" REQUEUE=0 SLURM_JOB_ID=5 \
    SLURM_SUBMIT_DIR="$repo" JOB_STATE_RETRY_SECONDS=0 timeout 60 bash slurm/train.sbatch --epochs 1 2>&1)
  if [[ ! -f "$work/args" ]]; then
    fail "train.sbatch with $answer did not run the trainer from the submission directory: $out"
  else
    echo "ok: train.sbatch with $answer runs from the submission directory"
  fi
done

# Under umask 000 the checkpoint directory job.sh made was 0777 (hpctrain then refused it, and it
# stayed for anyone to fill), and its slurm-requeues 0666 (anyone could reset the counts that bound
# the requeues): neither is others' to write now.
out=$(umask 000 && timeout 30 "$job" -u SLURM_ARRAY_JOB_ID -u SLURM_ARRAY_TASK_ID HPCTRAIN="$work/trainer" \
  CHECKPOINT_DIR="$work/umask-ck/deeper" SLURM_JOB_ID=7 JOB_STATE_RETRY_SECONDS=0 -- 2>&1)
rc=$?
open=$(find "$work/umask-ck" -perm -o+w)
if ((rc != 0)) || [[ ! -f "$work/umask-ck/deeper/slurm-requeues" || -n "$open" ]]; then
  fail "job.sh under umask 000: exit $rc (want 0, requeued), writable by others: '${open//$'\n'/ }': $out"
else
  echo "ok: job.sh under umask 000 -> nothing it made is others' to write"
fi

# A checkpoint directory every user may write to (or one to be made in such a folder, not sticky)
# is refused before the staging, as hpctrain refuses it: a failed staging wrote slurm-requeues
# there first, through the slurm-requeues.tmp.PID links another user had planted for the PIDs
# to come, over a file of the job's user's. A folder above it that is sticky (/tmp) will do.
mkdir -p "$work/shared" "$work/home-stage/datasets"
chmod 777 "$work/shared"
printf '#!/bin/sh\necho "no credentials" >&2\nexit 1\n' > "$work/home-stage/datasets/hpcdata"
chmod +x "$work/home-stage/datasets/hpcdata"
echo precious > "$work/precious"
# (One process plants them all: an ln each would use up the PIDs planted for.)
python3 -c 'import os, sys
first = int(open("/proc/sys/kernel/ns_last_pid").read())
for p in range(first, first + 400): os.symlink(sys.argv[1], "%s/slurm-requeues.tmp.%d" % (sys.argv[2], p))' \
  "$work/precious" "$work/shared"
for dir in "$work/shared" "$work/shared/run"; do
  out=$("$job" -u SLURM_ARRAY_JOB_ID -u SLURM_ARRAY_TASK_ID HPCTRAIN="$work/trainer" CHECKPOINT_DIR="$dir" \
    SLURM_JOB_ID=7 JOB_STATE_RETRY_SECONDS=0 HPCTRAIN_HOME="$work/home-stage" STAGE_FROM=s3://data/x \
    STAGE_TO="$work/data" -- 2>&1)
  rc=$?
  if ((rc != 2)) || [[ "$(cat "$work/precious")" != precious || -e "$work/shared/run" ||
    "$out" != "hpctrain-slurm: error: the checkpoint directory $dir: "*"writable by others (mode 777)"* ]]; then
    fail "job.sh with CHECKPOINT_DIR=$dir in a folder all may write to: exit $rc (want 2), the planted link's target holds '$(cat "$work/precious")': $out"
  else
    echo "ok: job.sh with CHECKPOINT_DIR=$dir in a folder all may write to -> refused before it writes there"
  fi
done
chmod 1777 "$work/shared"
out=$(timeout 30 "$job" -u SLURM_ARRAY_JOB_ID -u SLURM_ARRAY_TASK_ID HPCTRAIN="$work/trainer" \
  CHECKPOINT_DIR="$work/shared/run" SLURM_JOB_ID=7 JOB_STATE_RETRY_SECONDS=0 -- 2>&1)
rc=$?
if ((rc != 0)) || [[ ! -f "$work/shared/run/slurm-requeues" ]]; then
  fail "job.sh with CHECKPOINT_DIR in a sticky folder all may write to: exit $rc (want 0, requeued): $out"
else
  echo "ok: job.sh with CHECKPOINT_DIR in a sticky folder all may write to -> runs"
fi

# MAX_REQUEUES=0 on the first run (no SLURM_RESTART_COUNT): it died on the unset variable.
stop_ends "MAX_REQUEUES=0 on a first run" "already requeued 0 times without a new checkpoint (MAX_REQUEUES): exit 75" \
  -u SLURM_RESTART_COUNT MAX_REQUEUES=0 CHECKPOINT_DIR="$work/none"
# A leading zero is decimal there too: 08 requeues are allowed, not a bash error.
mkdir -p "$work/stalled"
echo "1 0 8" > "$work/stalled/slurm-requeues"
stop_ends "MAX_REQUEUES=08 after 8 requeues" "already requeued 8 times" MAX_REQUEUES=08 SLURM_RESTART_COUNT=8 \
  CHECKPOINT_DIR="$work/stalled"

# A run that fails without a new checkpoint (the launcher's bad options, a staging without
# credentials) fails the same way every time: every exit but 0, 2 and 75 was requeued, up to
# MAX_REQUEUES (20) times. MAX_FAILURES_IN_A_ROW (3) such runs in a row end the job with the
# code; a run that wrote a checkpoint starts the count again, and is requeued however many runs
# came before it (MAX_REQUEUES counted the time limit's stops too). The stand-in trainer exits
# TRAINER_EXIT, writing NEW_CHECKPOINT first where it is set.
cat > "$work/failing-trainer" << 'EOF'
#!/bin/sh
[ -z "${NEW_CHECKPOINT:-}" ] || : > "$NEW_CHECKPOINT"
exit "${TRAINER_EXIT:-1}"
EOF
chmod +x "$work/failing-trainer"
# run_ends WHAT RC SAYS ENV...: one run of job 9 under ENV exits RC (0: after `scontrol requeue
# 9`), its output holding SAYS.
run_ends() {
  local what=$1 want=$2 says=$3 out rc
  shift 3
  : > "$work/scontrol.log"
  rm -f "$work/scontrol.log.state"
  out=$("$job" -u SLURM_ARRAY_JOB_ID -u SLURM_ARRAY_TASK_ID HPCTRAIN="$work/failing-trainer" \
    CHECKPOINT_DIR="$work/failing" SCONTROL_LOG="$work/scontrol.log" JOB_STATE_RETRY_SECONDS=0 SLURM_JOB_ID=9 "$@" -- 2>&1)
  rc=$?
  if ((rc != want)) || [[ "$out" != *"$says"* ]] || { ((want == 0)) && ! grep -qx "requeue Incomplete 9" "$work/scontrol.log"; }; then
    fail "$what: exit $rc, want $want and '$says': $out"
  else
    echo "ok: $what -> exit $rc"
  fi
}
mkdir -p "$work/failing" "$work/home-failing/datasets"
: > "$work/failing/ckpt-000000100.hpck"
run_ends "a failed run without a new checkpoint" 0 requeueing SLURM_RESTART_COUNT=0
run_ends "a second one in a row" 0 requeueing SLURM_RESTART_COUNT=1
run_ends "a third one in a row" 1 "3 runs in a row have failed without a new checkpoint (MAX_FAILURES_IN_A_ROW): not requeued, exit 1" \
  SLURM_RESTART_COUNT=2
rm "$work/failing/slurm-requeues"
# A requeue refused: by a site without requeue, or because Slurm began to requeue the job itself
# (a preemption) between the script's look at its state and its ask, which said the site's.
run_ends "a refused requeue" 134 "'scontrol requeue' refused (a site without requeue: see slurm/chain.sh): exit 134" \
  SLURM_RESTART_COUNT=0 TRAINER_EXIT=134 SCONTROL_REFUSE_REQUEUE=1
run_ends "a requeue refused as Slurm requeues the job itself" 134 \
  "'scontrol requeue' refused: the job is REQUEUE_FED in Slurm now (Slurm requeueing or preempting it itself): exit 134" \
  SLURM_RESTART_COUNT=0 TRAINER_EXIT=134 SCONTROL_REFUSE_REQUEUE=1 SCONTROL_STATE_AFTER=REQUEUE_FED
rm "$work/failing/slurm-requeues"
run_ends "a failed run" 0 requeueing SLURM_RESTART_COUNT=0 TRAINER_EXIT=134
run_ends "a second one" 0 requeueing SLURM_RESTART_COUNT=1 TRAINER_EXIT=134
run_ends "a failed run that wrote a checkpoint" 0 requeueing SLURM_RESTART_COUNT=2 TRAINER_EXIT=134 \
  NEW_CHECKPOINT="$work/failing/ckpt-000000200.hpck"
run_ends "a failed run after it" 0 requeueing SLURM_RESTART_COUNT=3 TRAINER_EXIT=134
run_ends "a stop that wrote a checkpoint after MAX_REQUEUES restarts" 0 requeueing SLURM_RESTART_COUNT=30 \
  MAX_REQUEUES=2 TRAINER_EXIT=75 NEW_CHECKPOINT="$work/failing/ckpt-000000300.hpck"
# A run that checkpointed and then lost its batch host (Slurm requeues the job itself, and this
# script never counts that run) carried the training on all the same: the next failures in a row
# count from 0 again. They counted on from the two before it, and the one after ended the job.
rm "$work/failing/slurm-requeues"
run_ends "a failed run before a lost batch host" 0 requeueing SLURM_RESTART_COUNT=0 TRAINER_EXIT=134
run_ends "a second one" 0 requeueing SLURM_RESTART_COUNT=1 TRAINER_EXIT=134
: > "$work/failing/ckpt-000000400.hpck"  # the run whose batch host was lost, uncounted
run_ends "a failed run after the lost batch host's checkpoint" 0 requeueing SLURM_RESTART_COUNT=3 TRAINER_EXIT=134
run_ends "a second one after it" 0 requeueing SLURM_RESTART_COUNT=4 TRAINER_EXIT=134
run_ends "a third one after it" 134 "3 runs in a row have failed without a new checkpoint" SLURM_RESTART_COUNT=5 \
  TRAINER_EXIT=134
# The newest checkpoint is kept on a line of its own: a job.sh from before it (read -r JOB FAILED
# STALLED of the first line) still reads the counts.
read -r old_spec old_failed old_stalled < "$work/failing/slurm-requeues"
[[ "$old_spec $old_failed $old_stalled" == "9 3 4" ]] || fail "an older job.sh reads the counts as '$old_spec $old_failed $old_stalled', not '9 3 4'"
# Counts written before the newest checkpoint was kept beside them (three fields) still count.
echo "9 2 5" > "$work/failing/slurm-requeues"
run_ends "a failed run after counts of an older job.sh" 134 "3 runs in a row have failed without a new checkpoint" \
  SLURM_RESTART_COUNT=6 TRAINER_EXIT=134
rm "$work/failing/slurm-requeues"
# A run without a new checkpoint whose count cannot be written (a full or read-only file system,
# a quota; here /sys/kernel, where no one can create a file) is not requeued: every run read the
# old counts again, the limits never ended the job, and it was requeued for ever.
run_ends "a failed run whose count cannot be kept" 1 \
  "without a new checkpoint and with no count of such runs kept: not requeued, exit 1" \
  SLURM_RESTART_COUNT=6 CHECKPOINT_DIR=/sys/kernel
# A staging that fails (no credentials) counts as such a run; MAX_FAILURES_IN_A_ROW=2 here.
printf '#!/bin/sh\necho "no credentials" >&2\nexit 1\n' > "$work/home-failing/datasets/hpcdata"
chmod +x "$work/home-failing/datasets/hpcdata"
run_ends "a failed staging" 0 requeueing SLURM_RESTART_COUNT=4 MAX_FAILURES_IN_A_ROW=2 \
  HPCTRAIN_HOME="$work/home-failing" STAGE_FROM=s3://data/x STAGE_TO="$work/data"
run_ends "a second failed staging" 1 "2 runs in a row have failed without a new checkpoint" SLURM_RESTART_COUNT=5 \
  MAX_FAILURES_IN_A_ROW=2 HPCTRAIN_HOME="$work/home-failing" STAGE_FROM=s3://data/x STAGE_TO="$work/data"
# STAGE_PER_NODE other than 0 or 1 (it was taken for 0: one node's own disk staged), before the staging.
for bad in yes 2 true; do
  refused "job.sh with STAGE_PER_NODE=$bad" "$job" HPCTRAIN="$work/trainer" SLURM_JOB_ID=1 \
    HPCTRAIN_HOME="$work/home-failing" STAGE_FROM=s3://data/x STAGE_TO="$work/data" STAGE_PER_NODE="$bad" --
done

# A setting the job cannot run with is refused before the checkpoint directory is made or the
# dataset staged: a LAUNCHER=bogus (or a missing HPCRUN) job made its directory and staged the whole
# dataset first; an HPCTRAIN that is a directory passed -x and failed every run with 126, each
# requeued as a lost rank. The stand-in hpcdata leaves a mark where it ran.
mkdir -p "$work/home-mark/datasets"
printf '#!/bin/sh\n: > "%s"\n' "$work/staged-mark" > "$work/home-mark/datasets/hpcdata"
chmod +x "$work/home-mark/datasets/hpcdata"
for bad in LAUNCHER=bogus "LAUNCHER=hpcrun HPCRUN=$work/no-hpcrun" "LAUNCHER=hpcrun HPCRUN=$work" "HPCTRAIN=$work" \
  "HPCTRAIN_HOME=$work/home" "STAGE_TO=" "STAGE_PER_NODE=2" "LAUNCHER=mpirun MPIRUN_KILL_WAIT=1m" "LAUNCHER=srun SRUN_WAIT=x"; do
  rm -rf "$work/early-ck" "$work/staged-mark"
  # shellcheck disable=SC2086  # the settings as words
  refused "job.sh with $bad" "$job" HPCTRAIN="$work/trainer" SLURM_JOB_ID=1 CHECKPOINT_DIR="$work/early-ck" \
    HPCTRAIN_HOME="$work/home-mark" STAGE_FROM=s3://data/x STAGE_TO="$work/data" $bad --
  [[ ! -e "$work/early-ck" && ! -e "$work/staged-mark" ]] ||
    fail "job.sh with $bad: refused only after it made the checkpoint directory or staged the dataset"
done

# A signal while the dataset is staged: the copy stops and the job is requeued (its next run
# stages the rest). SIGTERM (a preemption) ended the shell with 143, unrequeued. The stand-in
# hpcdata says it started, then sleeps.
mkdir -p "$work/home/datasets"
printf '#!/bin/sh\necho started > "%s"\nexec sleep 30\n' "$work/staging" > "$work/home/datasets/hpcdata"
chmod +x "$work/home/datasets/hpcdata"
# expect_requeue_on SIGNAL PID OUT SAYS WHAT: SIGNAL sent to the script PID ends it with exit 0,
# a requeue of job 7 (or of its array task 7_0: scontrol.log) and SAYS in its output OUT.
expect_requeue_on() {
  local signal=$1 pid=$2 out=$3 says=$4 what=$5 rc=0
  kill -"$signal" "$pid"
  wait "$pid" || rc=$?
  if ((rc != 0)) || ! grep -Eq "^requeue Incomplete 7(_0)?$" "$work/scontrol.log" || ! grep -q "$says" "$out"; then
    fail "$what: exit $rc, want 0 and a requeue: $(cat "$out")"
  else
    echo "ok: $what -> scontrol requeue 7"
  fi
}

for signal in USR1 TERM; do
  rm -f "$work/staging"
  : > "$work/scontrol.log"
  "$job" -u SLURM_ARRAY_JOB_ID -u SLURM_ARRAY_TASK_ID HPCTRAIN="$work/trainer" HPCTRAIN_HOME="$work/home" \
    STAGE_FROM=s3://data/x STAGE_TO="$work/data" SCONTROL_LOG="$work/scontrol.log" JOB_STATE_RETRY_SECONDS=0 \
    SLURM_JOB_ID=7 -- > "$work/staged.out" 2>&1 &
  for _ in $(seq 100); do [[ -e "$work/staging" ]] && break; sleep 0.1; done
  expect_requeue_on "$signal" $! "$work/staged.out" "SIG$signal while staging: stopping the copy" \
    "SIG$signal while staging"
done

# The warning signal just before the copy starts (here during the staging's first log line, whose
# `date` stand-in sends it) was noted, not acted on: the copy ran to its end (past the time limit,
# where Slurm ends the job unrequeued) and the requeue came after. It stops the copy as one during it.
mkdir -p "$work/signal-bin"
# shellcheck disable=SC2016  # $PPID and $@ are the stand-in's own
printf '#!/bin/sh\n[ -e "%s" ] && rm "%s" && kill -USR1 "$PPID"\nexec /bin/date "$@"\n' \
  "$work/fire" "$work/fire" > "$work/signal-bin/date"
chmod +x "$work/signal-bin/date"
rm -f "$work/staging"
: > "$work/scontrol.log"
: > "$work/fire"
PATH="$work/signal-bin:$PATH" "$job" -u SLURM_ARRAY_JOB_ID -u SLURM_ARRAY_TASK_ID HPCTRAIN="$work/trainer" \
  HPCTRAIN_HOME="$work/home" STAGE_FROM=s3://data/x STAGE_TO="$work/data" SCONTROL_LOG="$work/scontrol.log" \
  JOB_STATE_RETRY_SECONDS=0 SLURM_JOB_ID=7 -- > "$work/early.out" 2>&1 || true
if [[ -e "$work/fire" ]] || ! head -n 1 "$work/early.out" | grep -q "staging s3://data/x"; then
  fail "the date stand-in did not signal at the staging's log line: $(cat "$work/early.out")"
elif ! grep -Eq "^requeue Incomplete 7$" "$work/scontrol.log" || grep -q "the dataset is in" "$work/early.out" ||
  ! grep -q "SIGUSR1 while staging: stopping the copy" "$work/early.out"; then
  fail "SIGUSR1 as the staging started did not stop the copy and requeue: $(cat "$work/early.out")"
else
  echo "ok: SIGUSR1 as the staging started stops the copy -> scontrol requeue 7"
fi

# srun no longer takes --cpus-per-task from the job (Slurm 22.05 on): each rank had one CPU while
# hpctrain ran --threads SLURM_CPUS_PER_TASK, and so did each node's staging.
mkdir -p "$work/home-ok/datasets"
printf '#!/bin/sh\nexit 0\n' > "$work/home-ok/datasets/hpcdata"
chmod +x "$work/home-ok/datasets/hpcdata"
: > "$work/srun.log"
"$job" HPCTRAIN="$work/recorder-trainer" CHECKPOINT_DIR="$work/cpus-ck" REQUEUE=0 SLURM_JOB_ID=1 SLURM_CPUS_PER_TASK=6 \
  SRUN_LOG="$work/srun.log" HPCTRAIN_HOME="$work/home-ok" STAGE_FROM=s3://data/x STAGE_TO="$work/data" STAGE_PER_NODE=1 \
  -- > "$work/cpus.out" 2>&1
if [[ $(grep -c -- '--cpus-per-task=6' "$work/srun.log") != 2 ]] || ! grep -qx -- --threads "$work/args"; then
  fail "srun (staging, training) not given --cpus-per-task=6: $(tr '\n' ';' < "$work/srun.log") $(cat "$work/cpus.out")"
else
  echo "ok: the staging's and the training's srun get --cpus-per-task=6"
fi
# The training's srun ends the other tasks SRUN_WAIT seconds after the first ended (a rank that
# crashed while MPI started left its peer waiting to the job's time limit), read in decimal.
if [[ $(grep -cE -- '--mpi=pmix --wait=60( |$)' "$work/srun.log") != 1 ]]; then
  fail "the training's srun not given --wait=60: $(tr '\n' ';' < "$work/srun.log")"
fi
: > "$work/srun.log"
"$job" HPCTRAIN="$work/recorder-trainer" CHECKPOINT_DIR="$work/cpus-ck" REQUEUE=0 SLURM_JOB_ID=1 SRUN_WAIT=010 \
  SRUN_LOG="$work/srun.log" -- > "$work/wait.out" 2>&1
if [[ $(grep -cE -- '--mpi=pmix --wait=10( |$)' "$work/srun.log") != 1 ]]; then
  fail "SRUN_WAIT=010: the training's srun not given --wait=10: $(tr '\n' ';' < "$work/srun.log") $(cat "$work/wait.out")"
else
  echo "ok: the training's srun gets --wait=SRUN_WAIT (60 by default)"
fi
# LAUNCHER_ARGS and STAGE_ARGS are words, as on a command line, but never file patterns: split
# unquoted, a '*', '?' or '[...]' in one was replaced by the names of the files it matched in the
# job's directory (here --x=matched, --y=1, --z=a). The stand-in hpcdata records its arguments.
mkdir -p "$work/globs" "$work/home-rec/datasets"
: > "$work/globs/--x=matched" && : > "$work/globs/--y=1" && : > "$work/globs/--z=a"
printf '#!/bin/sh\nprintf "%%s\\n" "$@" > "%s"\n' "$work/staged-args" > "$work/home-rec/datasets/hpcdata"
chmod +x "$work/home-rec/datasets/hpcdata"
: > "$work/srun.log"
(cd "$work/globs" && timeout 30 "$job" -u SLURM_CPUS_PER_TASK HPCTRAIN="$work/recorder-trainer" CHECKPOINT_DIR="$work/glob-ck" \
  REQUEUE=0 SLURM_JOB_ID=1 SRUN_LOG="$work/srun.log" LAUNCHER_ARGS=$' --x=*  --y=?\n--z=[ab]\t' \
  HPCTRAIN_HOME="$work/home-rec" STAGE_FROM=s3://data/x STAGE_TO="$work/data" STAGE_ARGS='--x=* --z=[ab]' \
  -- > "$work/globs.out" 2>&1)
if ! grep -qxF -- '--mpi=pmix --wait=60 --x=* --y=? --z=[ab]' "$work/srun.log"; then
  fail "LAUNCHER_ARGS='--x=* --y=? --z=[ab]': srun got '$(tr '\n' ';' < "$work/srun.log")': $(cat "$work/globs.out")"
elif [[ "$(tail -n 2 "$work/staged-args" 2> /dev/null | tr '\n' ' ')" != "--x=* --z=[ab] " ]]; then
  fail "STAGE_ARGS='--x=* --z=[ab]': hpcdata got '$(tr '\n' ' ' < "$work/staged-args")': $(cat "$work/globs.out")"
else
  echo "ok: LAUNCHER_ARGS and STAGE_ARGS split into words, none expanded as a file pattern"
fi
# mpirun gets MPIRUN_KILL_WAIT in decimal (Open MPI read 030 as octal, 24 s): a stand-in that
# records its arguments, on a PATH of this check's own.
mkdir -p "$work/mpirun-bin"
printf '#!/bin/sh\necho "$*" > "%s"\nexit 75\n' "$work/mpirun.log" > "$work/mpirun-bin/mpirun"
chmod +x "$work/mpirun-bin/mpirun"
PATH="$work/mpirun-bin:$PATH" "$job" HPCTRAIN="$work/recorder-trainer" CHECKPOINT_DIR="$work/kill-ck" REQUEUE=0 \
  SLURM_JOB_ID=1 LAUNCHER=mpirun MPIRUN_KILL_WAIT=030 -- > "$work/kill.out" 2>&1
if ! grep -qE -- '--mca odls_base_sigkill_timeout 30( |$)' "$work/mpirun.log" 2> /dev/null; then
  fail "MPIRUN_KILL_WAIT=030: mpirun not given 30: $(cat "$work/mpirun.log" 2>&1) $(cat "$work/kill.out")"
else
  echo "ok: mpirun gets odls_base_sigkill_timeout MPIRUN_KILL_WAIT, in decimal"
fi

# A --config FILE's options are hpctrain's too (the command line wins over them): the script looked
# at the command line alone and added its own --checkpoint-dir (which won) to a job whose file set
# one, so the run in the file's directory was never resumed; it read another metrics file than the
# trainer's to know how the run ended (a finished job: "did not finish"), and added --threads and
# --data-dir over the file's. The file as hpctrain reads it: a byte-order mark, CRLF, comments,
# blanks around '=' or none. The stand-in trainer records its arguments and writes the done event
# where the file says.
cfg=$work/cfg
mkdir -p "$cfg"
printf '\xef\xbb\xbf# the job\r\n  # checkpoint-dir = %s\r\n\tcheckpoint-dir\t=  %s  # its own\r\nmetrics-file=%s\r\nthreads = 2\r\ndata-dir = %s\r\n' \
  "$cfg/wrong" "$cfg/ck dir" "$cfg/m.jsonl" "$cfg/data" > "$cfg/run.conf"
printf 'resume = /x/start.hpck   # a fine-tune\n' > "$cfg/resume.conf"
cat > "$work/config-trainer" << EOF
#!/bin/sh
printf '%s\n' "\$@" > "$work/args"
echo '{"event":"done","step":4}' > "$cfg/m.jsonl"
EOF
chmod +x "$work/config-trainer"
# config_run WHAT CHECKPOINT_DIR ADDED ARGS...: job_run_trainer ARGS (in $cfg) finishes, its
# checkpoints in CHECKPOINT_DIR, and of --checkpoint-dir, --metrics-file, --threads and --data-dir
# the trainer gets ADDED (words, in that order) more than ARGS give it.
config_run() {
  local what=$1 dir=$2 added=$3 out rc got="" option
  shift 3
  rm -f "$cfg/m.jsonl" "$work/args"
  out=$(cd "$cfg" && timeout 30 "$job" HPCTRAIN="$work/config-trainer" CHECKPOINT_DIR="$work/default-ck" REQUEUE=0 \
    SLURM_JOB_ID=1 SLURM_CPUS_PER_TASK=6 HPCTRAIN_HOME="$work/home-ok" STAGE_FROM=s3://data/x STAGE_TO="$work/data" \
    -- "$@" 2>&1)
  rc=$?
  for option in --checkpoint-dir --metrics-file --threads --data-dir; do
    (($(grep -cx -- "$option" "$work/args" 2> /dev/null) > $(printf '%s\n' "$@" | grep -cx -- "$option"))) && got+="$option "
  done
  if ((rc != 0)) || [[ "$out" != *"checkpoints in $dir"* || "$out" != *"the training finished"* ]]; then
    fail "$what: exit $rc, want 0, checkpoints in $dir and the training finished: $out"
  elif [[ "$got" != "$added" ]] || [[ ! -d "$dir" ]]; then
    fail "$what: the script added '$got', want '$added' (or made no $dir): $out"
  else
    echo "ok: $what -> checkpoints in $dir, added '$got'"
  fi
}
config_run "job.sh --config FILE setting checkpoint-dir, metrics-file, threads, data-dir" "$cfg/ck dir" "" \
  --config run.conf --epochs 1
config_run "job.sh --config=FILE with --checkpoint-dir and --threads on the command line" "$cfg/cl" "" \
  --config="$cfg/run.conf" --checkpoint-dir "$cfg/cl" --threads 3
resumes "resume FILE in --config on a requeued run" "--resume auto" SLURM_RESTART_COUNT=1 -- --config "$cfg/resume.conf"
resumes "resume FILE in --config on a first run" "" SLURM_RESTART_COUNT=0 -- --config "$cfg/resume.conf"
# A --config file the script cannot read is refused, as hpctrain would (a FIFO too: read here, it
# would be empty for hpctrain, and for every requeued run).
refused "job.sh --config MISSING" "$job" HPCTRAIN="$work/trainer" SLURM_JOB_ID=1 -- --config "$cfg/missing.conf"
refused "job.sh --config=" "$job" HPCTRAIN="$work/trainer" SLURM_JOB_ID=1 -- --config=
refused "job.sh --config DIRECTORY" "$job" HPCTRAIN="$work/trainer" SLURM_JOB_ID=1 -- --config "$cfg"
refused "job.sh --config FIFO" "$job" HPCTRAIN="$work/trainer" SLURM_JOB_ID=1 -- --config "$work/fifo"
# sweep.sbatch: a checkpoint-dir in the --config file every task gets is shared as the option is.
for args in "--config $cfg/run.conf" "--config=$cfg/missing.conf"; do
  # shellcheck disable=SC2086  # the option and its value as two words
  refused "sweep.sbatch $args" env HPCTRAIN_HOME="$repo" HPCTRAIN="$work/trainer" SLURM_JOB_ID=5 \
    SLURM_ARRAY_JOB_ID=5 SLURM_ARRAY_TASK_ID=0 SLURM_JOB_NAME=sweep SLURM_SUBMIT_DIR="$work" \
    bash "$repo/slurm/sweep.sbatch" --epochs 1 $args
done

# A warning signal or SIGTERM that came before job.sh's traps, during train.sbatch's or
# sweep.sbatch's own `scontrol show job` (slurmctld slow to answer), ended the batch shell with
# 138 or 143: no requeue, no line. Now the job is requeued before the trainer is launched.
for case in "train USR1" "sweep TERM"; do
  read -r script signal <<< "$case"
  : > "$work/scontrol.log"
  env -u HPCTRAIN_HOME SCONTROL_SLEEP=2 SCONTROL_COMMAND="$repo/slurm/$script.sbatch" HPCTRAIN="$work/trainer" \
    SCONTROL_LOG="$work/scontrol.log" JOB_STATE_RETRY_SECONDS=0 SLURM_JOB_ID=7 SLURM_JOB_NAME=early \
    SLURM_SUBMIT_DIR="$work" SLURM_ARRAY_TASK_ID=0 SLURM_ARRAY_JOB_ID=7 SWEEP=lr=0.1 \
    bash "$repo/slurm/$script.sbatch" --epochs 1 > "$work/early.out" 2>&1 &
  for _ in $(seq 100); do grep -q '^show job' "$work/scontrol.log" && break; sleep 0.1; done
  expect_requeue_on "$signal" $! "$work/early.out" "SIG$signal came before the trainer was launched; requeueing" \
    "$script.sbatch, SIG$signal during its scontrol show job"
done

# The epilog ends a cleanup that does not end on SIGTERM (a stat of a hung hard-mounted file
# system) with SIGKILL, and exits 0 (a failing epilog drains the node): `timeout` alone waited for
# it, and slurmd with it. The stand-in ignores SIGTERM and sleeps 60 s.
mkdir -p "$work/shm"
cat > "$work/hung" << 'EOF'
#!/bin/sh
exec python3 -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'
EOF
chmod +x "$work/hung"
start=$SECONDS
HPCTRAIN="$work/hung" SNAPSHOT_DIR="$work/shm" SLURM_JOB_UID=$(id -u) CLEAN_TIMEOUT=1 CLEAN_KILL_AFTER=1 \
  timeout 30 bash "$repo/slurm/epilog.sh"
rc=$?
took=$((SECONDS - start))
if ((rc != 0 || took > 10)); then
  fail "epilog.sh with a cleanup that ignores SIGTERM: exit $rc after $took s, want 0 within 10 s"
else
  echo "ok: epilog.sh ends a hung cleanup ($took s)"
fi

# A CLEAN_TIMEOUT or CLEAN_KILL_AFTER of 0 was timeout's "no limit" (a hung cleanup held the node
# COMPLETING for ever), and one like 'abc' failed every cleanup unseen; an HPCTRAIN that is a
# directory passed -x. Each: one line, no cleanup, exit 0 (a failing epilog drains the node).
: > "$work/ran" && chmod 666 "$work/ran"
# shellcheck disable=SC2016  # the recorder's own $(id -u) and $3, expanded when it runs
printf '#!/bin/sh\necho "$(id -u) $3" >> %s\n' "$work/ran" > "$work/recorder"
chmod 755 "$work/recorder"
for bad in CLEAN_TIMEOUT=0 CLEAN_TIMEOUT=abc CLEAN_TIMEOUT=1m CLEAN_TIMEOUT=-1 CLEAN_KILL_AFTER=0 CLEAN_KILL_AFTER=99999999999 "HPCTRAIN=$work"; do
  err=$(env HPCTRAIN="$work/recorder" "$bad" SNAPSHOT_DIR="$work/shm" SLURM_JOB_UID="$(id -u)" \
    timeout 30 bash "$repo/slurm/epilog.sh" 2>&1 > /dev/null)
  rc=$?
  if ((rc != 0)) || [[ -s "$work/ran" || $(printf '%s\n' "$err" | grep -c .) != 1 || "$err" != *"${bad%%=*}"* ]]; then
    fail "epilog.sh with $bad: exit $rc, want 0, one line naming ${bad%%=*} and no cleanup: '$err', ran '$(cat "$work/ran")'"
  else
    echo "ok: epilog.sh with $bad -> $err"
  fi
  : > "$work/ran"
done

# CLEAN_ARGS are words, never file patterns: unquoted, '--older-than *' became the names of the
# files in slurmd's directory (here the epilog's own).
printf '#!/bin/sh\nprintf "%%s\\n" "$@" > "%s"\n' "$work/clean-args" > "$work/args-recorder"
chmod 755 "$work/args-recorder"
(cd "$work/globs" && HPCTRAIN="$work/args-recorder" SNAPSHOT_DIR="$work/shm" SLURM_JOB_UID=$(id -u) \
  CLEAN_ARGS=' --older-than *  --y=? ' timeout 30 bash "$repo/slurm/epilog.sh")
got=$(tr '\n' ' ' < "$work/clean-args" 2> /dev/null)
if [[ "$got" != "clean-snapshots --snapshot-dir $work/shm --older-than * --y=? " ]]; then
  fail "epilog.sh with CLEAN_ARGS='--older-than * --y=?' ran '$got'"
else
  echo "ok: epilog.sh with CLEAN_ARGS='--older-than * --y=?' -> $got"
fi

# Every user's default folder is cleaned, each as its user, the job's user's first; a folder whose
# name and owner disagree, a link, another name and an empty folder are passed over. (The
# stand-in, run as nobody too, records who ran it on what.)
chmod 755 "$work"
root=$work/shm-root
mkdir -p "$root"/{hpctrain-65534,hpctrain-0,hpctrain-1,hpctrain-x}
mkdir "$root"/{hpctrain-65534,hpctrain-0,hpctrain-1,hpctrain-x}/0123456789abcdef
chown -R 65534 "$root/hpctrain-65534"
ln -s "$root/hpctrain-0" "$root/hpctrain-2"
: > "$work/ran" && chmod 666 "$work/ran"
# shellcheck disable=SC2016  # the recorder's own $(id -u) and $3, expanded when it runs
printf '#!/bin/sh\necho "$(id -u) $3" >> %s\n' "$work/ran" > "$work/recorder"
chmod 755 "$work/recorder"
HPCTRAIN="$work/recorder" SNAPSHOT_ROOT="$root" SLURM_JOB_UID=65534 timeout 30 bash "$repo/slurm/epilog.sh"
want="65534 $root/hpctrain-65534|0 $root/hpctrain-0|"
got=$(tr '\n' '|' < "$work/ran")
[[ "$got" == "$want" ]] || fail "epilog.sh of a job of uid 65534 cleaned '$got', want '$want'"
# An empty folder (its runs' snapshots removed) starts no cleanup.
rmdir "$root/hpctrain-0/0123456789abcdef"
: > "$work/ran"
HPCTRAIN="$work/recorder" SNAPSHOT_ROOT="$root" SLURM_JOB_UID=65534 timeout 30 bash "$repo/slurm/epilog.sh"
got=$(tr '\n' '|' < "$work/ran")
[[ "$got" == "65534 $root/hpctrain-65534|" ]] || fail "epilog.sh with root's folder empty cleaned '$got'"
: > "$work/ran"
HPCTRAIN="$work/recorder" SNAPSHOT_DIR="$root/hpctrain-0" SLURM_JOB_UID=0 timeout 30 bash "$repo/slurm/epilog.sh"
got=$(tr '\n' '|' < "$work/ran")
[[ "$got" == "0 $root/hpctrain-0|" ]] || fail "epilog.sh with SNAPSHOT_DIR cleaned '$got', want that folder alone"
echo "ok: epilog.sh cleans each user's folder as its user"
((failed == 0)) && echo PASS
exit "$failed"
