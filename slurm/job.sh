# shellcheck shell=bash
# What slurm/*.sbatch share, sourced by them inside the job: launching hpctrain with the chosen
# launcher, forwarding Slurm's warning signal to it, and turning its exit code into what Slurm
# should do next. Not a job script itself.
#
#   job_log TEXT...                 a line in the job's output, with the job id and restart count
#   job_run_trainer ARGS...         runs hpctrain through $LAUNCHER with ARGS (plus --threads,
#                                   --checkpoint-dir and --metrics-file where neither ARGS nor
#                                   the --config file they name set them; a --resume there made
#                                   auto on a run after the first, requeued or CHAIN_SEGMENT 2 on,
#                                   once a checkpoint is there) and exits the script the way its
#                                   exit code asks (a --config file it cannot read: exit 2):
#     0        the training finished                        exit 0 (with its metrics' done event;
#                                                                  without: as a failure)
#     2        a usage or input error (an option,           exit 2, never requeued
#              the data, a checkpoint a stop could not write)
#     75       checkpointed and stopped (warning signal)    requeue the job, which resumes
#     other    a node lost, a rank killed, a watchdog end   keep the newest snapshot in the nodes'
#                                                           memory as a checkpoint, requeue the job,
#                                                           which resumes
#   A job is requeued only while Slurm still has it RUNNING (not after scancel, nor when Slurm
#   itself is requeueing or preempting it), only with REQUEUE=1, not after MAX_FAILURES_IN_A_ROW
#   runs in a row (default 3) that failed without a new checkpoint, and at most MAX_REQUEUES times
#   after runs without a new checkpoint (runs that wrote one are requeued however many there are,
#   counted in CHECKPOINT_DIR/slurm-requeues); otherwise the script ends with the trainer's exit code.
#   With STAGE_FROM set it first stages the dataset (job_stage_data).
#   job_stage_data                  STAGE_FROM=s3://BUCKET/PREFIX: copies it to STAGE_TO with
#                                   datasets/hpcdata stage (jobs staging one STAGE_TO download it
#                                   once; an interrupted copy resumes), once for the job, or once
#                                   on every node with STAGE_PER_NODE=1 (node-local disks);
#                                   STAGE_ARGS: more hpcdata stage options. The trainer then gets
#                                   --data-dir STAGE_TO unless its options (or --config) name
#                                   one. A staging that fails is requeued like a failed run; bad
#                                   settings are not.
#
# Variables (the sbatch scripts set them at their top): HPCTRAIN, HPCRUN, LAUNCHER (srun, mpirun or
# hpcrun), LAUNCHER_ARGS (extra options for it), MPIRUN_KILL_WAIT, SRUN_WAIT, CHECKPOINT_DIR, REQUEUE, MAX_REQUEUES,
# MAX_FAILURES_IN_A_ROW, HPCTRAIN_HOME, STAGE_FROM, STAGE_TO, STAGE_PER_NODE, STAGE_ARGS; CHAIN_SEGMENT (slurm/chain.sh's).

# Neither can fail: under set -e a line the job's output file did not take (a full disk, a
# quota, a file system gone read-only, which is where the checkpoints often are too) ended the
# batch shell, before the trainer was launched or in a signal's trap before the signal was passed
# on, and the job ended without a checkpoint or a requeue.
job_log() {
  echo "hpctrain-slurm: $(date '+%F %T') job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}): $*" || true
}

job_die() {  # one line and exit 2: the job cannot run as set up (nothing to requeue)
  echo "hpctrain-slurm: error: $*" >&2 || true
  exit 2
}

# job_split_words ARRAY VALUE: VALUE's words appended to the array named ARRAY: split at blanks
# and newlines as an unquoted $VALUE is, but never expanded as a pattern. LAUNCHER_ARGS,
# STAGE_ARGS and SWEEP are split this way: unquoted, a '*', '?' or '[...]' in one (a regex, a
# glob meant for the program) was replaced by the names of the files in the job's directory
# that it matched.
job_split_words() {
  local -n job_split_into=$1
  local job_split_found=()
  IFS=$' \t\n' read -r -d '' -a job_split_found <<< "$2" || true  # (-d '': every line, not the first)
  job_split_into+=("${job_split_found[@]}")
}

# job_arg_given NAME ARGS...: whether ARGS (a command line) hold --NAME or --NAME=...
job_arg_given() {
  local name=$1 a
  shift
  for a in "$@"; do [[ "$a" == "--$name" || "$a" == "--$name="* ]] && return 0; done
  return 1
}

# job_arg_value NAME ARGS...: the value of --NAME in ARGS (the last one), else nothing.
job_arg_value() {
  local name=$1 value="" prev=""
  shift
  for a in "$@"; do
    [[ "$prev" == "--$name" ]] && value=$a
    [[ "$a" == "--$name="* ]] && value=${a#--"$name"=}
    prev=$a
  done
  echo "$value"
}

# The file hpctrain's --config names, as job_read_config read it: its NAME = VALUE lines in
# job_config. hpctrain takes every option there that its command line leaves out: looking at the
# command line alone, the script added its own --checkpoint-dir (which won) to a job whose file
# set one, and the run in the file's directory was never resumed; it read another metrics file
# than the trainer's to know how a run ended, and gave --threads over the file's.
declare -gA job_config=()
job_config_file=""

# job_read_config ARGS...: reads the --config FILE (--config=FILE) of ARGS into job_config, the
# way hpctrain (Boost's config file parser) reads it: '#' starts a comment, the name and the
# value are trimmed of blanks (a CR too), the name is everything before the first '=', and after
# a [SECTION] line names are SECTION.NAME (hpctrain refuses those, and this script sees no option
# of its own there). No --config: an empty job_config. A file that cannot be read: one line and
# exit 2 (a pipe or FIFO too: the script reads it before hpctrain, and every run of the job
# again). The rest of what hpctrain refuses (a name given twice, an unknown one) it refuses itself.
job_read_config() {
  local file size lines=() line name prefix=""
  job_config=() job_config_file=""
  job_arg_given config "$@" || return 0
  file=$(job_arg_value config "$@")
  [[ -n "$file" ]] || job_die "--config is given without a file"
  [[ -e "$file" ]] || job_die "cannot read --config $file: no such file"
  [[ ! -d "$file" ]] || job_die "--config $file is a directory, not a file of name = value lines"
  [[ -f "$file" ]] ||
    job_die "--config $file is not a regular file (a pipe or FIFO?): this script reads it before hpctrain does, and every run of the job reads it again; give a file"
  [[ -r "$file" ]] || job_die "cannot read --config $file: permission denied"
  # hpctrain's own limit (a dataset named by mistake is not read into this shell).
  size=$(stat -L -c %s -- "$file" 2> /dev/null) || size=0
  ((size <= 1048576)) || job_die "config file $file is larger than 1 MB: not a config file of name = value lines?"
  { mapfile -t lines < "$file"; } 2> /dev/null || job_die "cannot read --config $file"
  job_config_file=$file
  ((${#lines[@]} == 0)) || lines[0]=${lines[0]#$'\xEF\xBB\xBF'}  # a byte-order mark (Windows editors)
  for line in "${lines[@]}"; do
    line=${line%%#*}
    if [[ "$line" =~ ^[[:space:]]*\[(.*)\][[:space:]]*$ ]]; then
      prefix=${BASH_REMATCH[1]} prefix=${prefix%.}.
    elif [[ "$line" =~ ^[[:space:]]*([^=]*[^=[:space:]])[[:space:]]*=[[:space:]]*(.*[^[:space:]])?[[:space:]]*$ ]]; then
      name=$prefix${BASH_REMATCH[1]}
      job_config[$name]=${BASH_REMATCH[2]}
    fi
  done
}

# job_option NAME ARGS...: hpctrain's --NAME as it will take it: the last --NAME in ARGS (the
# command line), else NAME in the --config file job_read_config read from them (the command line
# wins over the file, as in hpctrain); its value on stdout, and a failure where neither sets it.
# Every question this script asks about hpctrain's options goes through here.
job_option() {
  local name=$1
  shift
  if job_arg_given "$name" "$@"; then
    job_arg_value "$name" "$@"
  elif [[ -n "${job_config[$name]+set}" ]]; then
    printf '%s\n' "${job_config[$name]}"
  else
    return 1
  fi
}
# job_has_option NAME ARGS...: whether hpctrain gets --NAME (job_option).
job_has_option() { job_option "$@" > /dev/null; }
# job_option_value NAME ARGS...: the value hpctrain takes for --NAME (job_option), else nothing.
job_option_value() { job_option "$@" || true; }
# job_option_where NAME ARGS...: where job_option finds --NAME, for messages: "--NAME", or "NAME in
# --config FILE". job_option_shown NAME ARGS...: the same with the value, "--NAME VALUE" or "NAME =
# VALUE in --config FILE".
job_option_where() {
  if job_arg_given "$@"; then echo "--$1"; else echo "$1 in --config $job_config_file"; fi
}
job_option_shown() {
  local value
  value=$(job_option_value "$@")
  if job_arg_given "$@"; then echo "--$1 $value"; else echo "$1 = $value in --config $job_config_file"; fi
}

# job_sweep_point GRID INDEX: the hpctrain options of point INDEX (0-based) of GRID, which is words
# NAME=V1,V2,... (every combination of the values is a point; the last word's values vary
# fastest), one per line as "--NAME" then "VALUE"; exit 2 with a message on a malformed grid or an
# INDEX outside it. job_sweep_size GRID: the number of points.
job_sweep_size() {
  local n=1 word values seen=" " words=()
  job_split_words words "$1"
  for word in "${words[@]}"; do
    [[ "$word" =~ ^[a-z][a-z0-9-]*=[^,]+(,[^,]+)*$ ]] ||
      job_die "SWEEP entry '$word' is not NAME=V1,V2,... (an hpctrain option without --, then values)"
    # Twice (lr=0.1 lr=0.2): every task got both options, and the grid counted both entries' values.
    [[ "$seen" != *" ${word%%=*} "* ]] ||
      job_die "SWEEP names ${word%%=*} twice: give one entry with all its values (${word%%=*}=V1,V2,...)"
    seen+="${word%%=*} "
    values=${word#*=}
    IFS=, read -r -a values <<< "$values"
    n=$((n * ${#values[@]}))
  done
  # Blank by the same split as its words (a newline or tab too, since a grid may take several
  # lines): one of only newlines ran a single point without any of the sweep's options.
  ((${#words[@]})) || job_die "SWEEP is empty"
  echo "$n"
}

job_sweep_point() {
  local grid=$1 index=$2 size words k word values
  size=$(job_sweep_size "$grid") || exit 2
  # Decimal (bash read 08 as octal: its own error line, then this one); at most 9 digits.
  [[ "$index" =~ ^[0-9]{1,9}$ ]] && ((10#$index < size)) ||
    job_die "array task '$index' is outside the sweep's $size point(s) (submit with --array=0-$((size - 1)))"
  index=$((10#$index))
  words=()
  job_split_words words "$grid"  # (every line: read -a alone took the first, and the grid had more points)
  local out=()
  for ((k = ${#words[@]} - 1; k >= 0; --k)); do
    word=${words[k]}
    IFS=, read -r -a values <<< "${word#*=}"
    out=("--${word%%=*}" "${values[index % ${#values[@]}]}" "${out[@]}")
    index=$((index / ${#values[@]}))
  done
  printf '%s\n' "${out[@]}"
}

# This job as scontrol names it: an array task as ARRAYID_TASK. (One task's job id is the array's
# own, and that id names every task: `scontrol show job` lists them all, and `scontrol requeue`
# would requeue them all.)
job_spec() {
  if [[ -n "${SLURM_ARRAY_TASK_ID:-}" && -n "${SLURM_ARRAY_JOB_ID:-}" ]]; then
    echo "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
  else
    echo "$SLURM_JOB_ID"
  fi
}

# This job's state in Slurm; "" when slurmctld did not answer three times (busy at the very
# moment a time limit warns every job: "Socket timed out"). TIMEOUT while Slurm ends the job at
# its time limit (it shows COMPLETING then, as after scancel: the reason, TimeLimit, tells them
# apart). Never fails: under set -e a failed scontrol ended the script, exit 1 and no requeue.
job_state() {
  local out try state reason
  for try in 1 2 3; do
    if out=$(scontrol show job -o "$(job_spec)" 2> /dev/null); then
      # The first JobState= of the first line, and the Reason= right after it: a later field the
      # user sets, a Comment or a path, may hold either (the last JobState= was a Comment's).
      state="" reason=""
      if [[ "${out%%$'\n'*}" =~ (^|\ )JobState=([A-Z_]+)(\ Reason=([A-Za-z_]+))? ]]; then
        state=${BASH_REMATCH[2]} reason=${BASH_REMATCH[4]}
      fi
      [[ "$state" != COMPLETING || "$reason" != TimeLimit ]] || state=TIMEOUT
      echo "$state"
      return 0
    fi
    ((try < 3)) && sleep "${JOB_STATE_RETRY_SECONDS:-2}"
  done
  return 0
}

# The runs of this job that ended without a new checkpoint, kept in CHECKPOINT_DIR/slurm-requeues
# as "JOB FAILED_IN_A_ROW STALLED": the job (job_spec; another job's counts start again from 0),
# its runs in a row that failed (any end but 0, 2 and 75) without a new checkpoint, and its
# requeues of runs without a new checkpoint in all; on a second line, the newest checkpoint when
# they were written ("-": none; a line of its own, so that a job.sh from before it still reads the
# counts). (Slurm's SLURM_RESTART_COUNT counts every requeue, those of runs that checkpointed and
# stopped at a time limit too, which carry the training on.) A checkpoint newer than that at this
# run's start came from a run that could not write its counts (its batch host lost after it had
# checkpointed, Slurm requeueing the job itself): the failures in a row start again from 0 then.
# job_read_requeues NEWEST: the counts, NEWEST being the directory's newest checkpoint now.
job_failed_in_a_row=0 job_stalled=0
job_read_requeues() {
  local spec failed stalled newest
  job_failed_in_a_row=0 job_stalled=0
  [[ -n "${CHECKPOINT_DIR:-}" && -f "$CHECKPOINT_DIR/slurm-requeues" ]] || return 0
  { read -r spec failed stalled && read -r newest; } < "$CHECKPOINT_DIR/slurm-requeues" || true
  [[ "$spec" == "$(job_spec)" && "$failed" =~ ^[0-9]{1,6}$ && "$stalled" =~ ^[0-9]{1,6}$ ]] || return 0
  job_failed_in_a_row=$((10#$failed)) job_stalled=$((10#$stalled))
  # (A file without the newest, written before it was kept, keeps its count. Where this run's
  # start did not note its newest, nothing launched yet, the newest now is that.)
  local at_start=${job_newest_before-$1}
  [[ -z "$newest" || "${at_start:--}" == "$newest" ]] || job_failed_in_a_row=0
}
# job_write_whole FILE TEXT: FILE holds TEXT, written whole, then renamed (a run killed meanwhile
# leaves the old file), never others' to write (umask o-w: under umask 000 any user could rewrite
# what decides the requeues); false, with nothing left behind, where it cannot be written.
job_write_whole() {
  { (umask o-w && printf '%s' "$2" > "$1.tmp.$$") && mv -f "$1.tmp.$$" "$1"; } 2> /dev/null && return 0
  rm -f "$1.tmp.$$" 2> /dev/null || true
  return 1
}
# job_write_requeues NEWEST: the counts, beside NEWEST, the directory's newest checkpoint now.
job_write_requeues() {
  [[ -n "${CHECKPOINT_DIR:-}" && -d "$CHECKPOINT_DIR" ]] || return 0
  local file=$CHECKPOINT_DIR/slurm-requeues
  job_write_whole "$file" "$(job_spec) $job_failed_in_a_row $job_stalled"$'\n'"${1:--}"$'\n' && return 0
  job_log "cannot write $file: the runs without a new checkpoint are not counted"
  return 1
}

# job_check_checkpoint_dir DIR: refuses (exit 2) a checkpoint directory that every user may write
# to, or one in (or to be made in) a folder every user may write to that is not sticky, as hpctrain
# and hpcrun do (require_safe_directory; they check who owns each too). Checked here, before this
# script makes it or writes its slurm-requeues there: a failed staging or a signal before the
# launch wrote that before hpctrain could refuse, through a slurm-requeues.tmp.PID link another
# user had planted (over any file the job's user may write), after staging the dataset for nothing.
job_check_checkpoint_dir() {
  local at=$1 real mode part shown=$1
  [[ "$at" == /* ]] || at=$PWD/$at
  while [[ ! -e "$at" && "$at" != / ]]; do at=$(dirname -- "$at"); done  # the part there already
  real=$(cd -P -- "$at" 2> /dev/null && pwd) || return 0                  # (mkdir says why)
  if [[ "$at" == "$1" && "$real" != "$1" ]]; then shown+=" ($real)"; fi
  at=$real
  while :; do
    mode=$(stat -c %a -- "$at") || return 0
    # Writable by others: 2 in the last digit. Sticky (/tmp's 1777): 1 in the fourth. The
    # directory itself may be neither; a folder above it may be both.
    if (((8#$mode & 2) != 0)) && { [[ -d "$1" && "$at" == "$real" ]] || (((8#$mode & 8#1000) == 0)); }; then
      part="it is"
      [[ -d "$1" && "$at" == "$real" ]] || part="$at is"
      job_die "the checkpoint directory $shown: $part writable by others (mode $mode): another user could replace what is read back there, or plant a link that a write would follow; chmod o-w it, or use a directory of your own"
    fi
    [[ "$at" != / ]] || return 0
    at=$(dirname -- "$at")
  done
}

# job_requeue_or_exit CODE WHY: requeue this job if it may be, else exit with CODE.
job_requeue_or_exit() {
  local code=$1 why=$2 state newest_now=""
  if [[ "${REQUEUE:-1}" != 1 ]]; then
    job_log "$why; not requeued (REQUEUE=$REQUEUE): exit $code"
    exit "$code"
  fi
  # Did this run carry the training on (a checkpoint newer than the newest at its start)? A run
  # that did is requeued whatever its end; one that failed without (a launcher's bad options, a
  # staging without credentials: they fail the same way every time) only MAX_FAILURES_IN_A_ROW
  # times in a row, and MAX_REQUEUES bounds the requeues of runs without progress in all.
  [[ -z "${CHECKPOINT_DIR:-}" ]] || newest_now=$(job_newest_checkpoint "$CHECKPOINT_DIR")
  job_read_requeues "$newest_now"
  local progressed=0
  if [[ -n "${job_newest_before+set}" && "$newest_now" != "$job_newest_before" ]]; then
    job_failed_in_a_row=0 progressed=1
  else
    [[ "$code" == 75 ]] || job_failed_in_a_row=$((job_failed_in_a_row + 1))
    if [[ "$code" != 75 ]] && ((job_failed_in_a_row >= 10#${MAX_FAILURES_IN_A_ROW:-3})); then
      job_write_requeues "$newest_now" || true
      job_log "$why; $job_failed_in_a_row runs in a row have failed without a new checkpoint (MAX_FAILURES_IN_A_ROW): not requeued, exit $code"
      exit "$code"
    fi
    if ((job_stalled >= 10#${MAX_REQUEUES:-20})); then
      job_write_requeues "$newest_now" || true
      job_log "$why; already requeued $job_stalled times without a new checkpoint (MAX_REQUEUES): exit $code"
      exit "$code"
    fi
    job_stalled=$((job_stalled + 1))
  fi
  # A run without a new checkpoint whose count cannot be kept (a full or read-only file system,
  # a quota) is not requeued: every next run would read the old counts, and the two limits above
  # would never end a job that fails the same way each time.
  if ! job_write_requeues "$newest_now" && ((progressed == 0)); then
    job_log "$why; without a new checkpoint and with no count of such runs kept: not requeued, exit $code"
    exit "$code"
  fi
  state=$(job_state)
  if [[ -z "$state" ]]; then
    # Unknown: asked to requeue all the same (Slurm refuses to requeue a cancelled job).
    job_log "$why; Slurm did not say the job's state (slurmctld busy or down?): asking to requeue it all the same"
  elif [[ "$state" == TIMEOUT ]]; then
    # Its time limit came before the warning signal did, or before the stop it asked for was
    # done: Slurm ends the job (SIGTERM, on which the trainer checkpoints, then SIGKILL after
    # KillWait) and would not requeue it. Carried on as after the warning signal.
    job_log "$why; the job reached its time limit in Slurm (the warning signal came too late, or none was asked for: sbatch --signal=B:USR1@SECONDS)"
  elif [[ "$state" != RUNNING ]]; then
    # Cancelled (scancel), or Slurm is requeueing or preempting the job itself.
    job_log "$why; the job is $state in Slurm, so this script does not requeue it: exit $code"
    exit "$code"
  fi
  # Said first: a requeue ends this script (SIGTERM, then SIGKILL) as soon as Slurm acts on it.
  job_log "$why; requeueing: the next run resumes from the checkpoint"
  # A job seen RUNNING is requeued only while it still is (Incomplete): Slurm requeues a finished
  # job too, and a scancel between the look and the ask was undone.
  local only=()
  [[ "$state" != RUNNING ]] || only=(Incomplete)
  if scontrol requeue "${only[@]}" "$(job_spec)"; then
    exit 0
  fi
  # Refused also where Slurm began to requeue or preempt the job itself between the look at its
  # state and the ask (a preemption's requeue): then it comes back all the same.
  state=$(job_state)
  if [[ "$state" == TIMEOUT ]]; then
    job_log "'scontrol requeue' refused as Slurm ends the job at its time limit (a site without requeue: see slurm/chain.sh): exit $code"
  elif [[ -n "$state" && "$state" != RUNNING ]]; then
    job_log "'scontrol requeue' refused: the job is $state in Slurm now (Slurm requeueing or preempting it itself): exit $code"
  else
    job_log "'scontrol requeue' refused (a site without requeue: see slurm/chain.sh): exit $code"
  fi
  exit "$code"
}

# job_record_signals: traps that only note the first warning signal or SIGTERM in JOB_SIGNAL, for
# the times when there is nothing to pass it on to (the sbatch scripts install the same ones at
# their start: an untrapped SIGUSR1 during their slow `scontrol show job` ended the batch shell
# with 138, no requeue and no line). job_act_on_signal WHEN: requeue the job (exit 75's way) if
# one came.
job_record_signals() {
  trap 'JOB_SIGNAL=${JOB_SIGNAL:-USR1}' USR1
  trap 'JOB_SIGNAL=${JOB_SIGNAL:-USR2}' USR2
  trap 'JOB_SIGNAL=${JOB_SIGNAL:-TERM}' TERM
}
job_act_on_signal() {
  [[ -z "${JOB_SIGNAL:-}" ]] || job_requeue_or_exit 75 "SIG$JOB_SIGNAL came $1"
}

# job_srun_cpus: the options that give an srun inside the job the job's CPUs per task, one per
# line: srun no longer takes them from SLURM_CPUS_PER_TASK (Slurm 22.05 on), and each task got one
# CPU, where hpctrain ran --threads SLURM_CPUS_PER_TASK. (Not exported as SRUN_CPUS_PER_TASK:
# mpirun's own srun of its daemons, one per node, would then bind a node's ranks to one task's.)
job_srun_cpus() {
  [[ -z "${SLURM_CPUS_PER_TASK:-}" ]] || echo "--cpus-per-task=$SLURM_CPUS_PER_TASK"
}

# job_check_stage_settings: STAGE_TO given with STAGE_FROM, STAGE_PER_NODE 0 or 1, and hpcdata there
# to run; checked with the other settings, before the checkpoint directory is made.
job_check_stage_settings() {
  [[ -n "${STAGE_FROM:-}" ]] || return 0
  [[ -n "${STAGE_TO:-}" ]] || job_die "STAGE_FROM is set but STAGE_TO is not: set where the dataset goes"
  # Anything but 1 was taken for 0: STAGE_PER_NODE=yes staged once, on one node's own disk only.
  [[ "${STAGE_PER_NODE:-0}" == [01] ]] ||
    job_die "STAGE_PER_NODE must be 1 (stage on every node) or 0 (once, for storage every node sees), not '$STAGE_PER_NODE'"
  # A missing one failed every run alike (exit 127), each requeued as a failed staging.
  [[ -n "${HPCTRAIN_HOME:-}" && -f "$HPCTRAIN_HOME/datasets/hpcdata" && -x "$HPCTRAIN_HOME/datasets/hpcdata" ]] ||
    job_die "STAGE_FROM is set but there is no datasets/hpcdata to stage it with in HPCTRAIN_HOME '${HPCTRAIN_HOME:-}'"
}

job_stage_data() {
  [[ -n "${STAGE_FROM:-}" ]] || return 0
  job_check_stage_settings
  job_act_on_signal "before the staging"
  local stage=("${HPCTRAIN_HOME:?}/datasets/hpcdata" stage "$STAGE_FROM" "$STAGE_TO") code=0
  job_split_words stage "${STAGE_ARGS:-}"  # words, as on a command line (never file patterns)
  if [[ "${STAGE_PER_NODE:-0}" == 1 ]]; then
    local nodes=${SLURM_JOB_NUM_NODES:-1}
    local cpus
    mapfile -t cpus < <(job_srun_cpus)
    stage=(srun --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 "${cpus[@]}" "${stage[@]}")
  fi
  job_log "staging $STAGE_FROM into $STAGE_TO: ${stage[*]}"
  # The warning signal (time limit near) or Slurm's SIGTERM (a preemption) during the copy: stop
  # it and requeue as after the trainer's stop (not when the job is cancelled: job_requeue_or_exit);
  # the next run's staging resumes where this one stopped. (An untrapped SIGTERM ended this shell
  # with 143 and no requeue.) One before the copy's pid is known (noted in JOB_SIGNAL by
  # job_record_signals' traps during the line above, or in stopped_by) stops it once it is: the
  # copy ran to its end, past the time limit. The kill may find the copy gone (it ended as the
  # signal came): under set -e a failed kill in a trap ended the shell with 1, unrequeued.
  local pid="" stopped_by=""
  # shellcheck disable=SC2317  # called by the traps below
  job_stop_staging() {
    stopped_by=$1
    job_log "$1 while staging: stopping the copy"
    [[ -z "$pid" ]] || kill -TERM "$pid" 2> /dev/null || true
  }
  trap 'job_stop_staging SIGUSR1' USR1
  trap 'job_stop_staging SIGUSR2' USR2
  trap 'job_stop_staging SIGTERM' TERM
  "${stage[@]}" &
  pid=$!
  [[ -z "${JOB_SIGNAL:-}" ]] || job_stop_staging "SIG$JOB_SIGNAL"
  [[ -z "$stopped_by" ]] || kill -TERM "$pid" 2> /dev/null || true
  while kill -0 "$pid" 2> /dev/null; do wait "$pid" || true; done
  wait "$pid" || code=$?
  job_record_signals  # no moment without a trap until the trainer's
  [[ -z "$stopped_by" ]] || job_requeue_or_exit 75 "the staging was stopped by $stopped_by"
  case "$code" in
    0) job_log "the dataset is in $STAGE_TO" ;;
    2) job_die "the staging's settings are wrong (hpcdata exit 2): not requeued" ;;
    *) job_requeue_or_exit "$code" "staging $STAGE_FROM failed (exit $code)" ;;
  esac
}

# job_last_line FILE: FILE's last line. A relative name is read as ./NAME: tail takes "-" for its
# stdin (after -- too), and a finished job whose --metrics-file was "-" was requeued.
job_last_line() {
  local file=$1
  [[ "$file" == /* ]] || file=./$file
  tail -n 1 -- "$file"
}

# job_metrics_stopped FILE: whether FILE's last line is hpctrain's "stopped" event with exit code 75
# (the run checkpointed and stopped on a signal).
job_metrics_stopped() {
  local last
  [[ -f "$1" ]] || return 1
  last=$(job_last_line "$1")
  [[ "$last" == '{"event":"stopped",'* && "$last" == *'"exit_code":75,'* ]]
}

# job_metrics_done FILE: whether FILE's last line is hpctrain's "done" event (the training ended;
# a run resumed after its last step writes one too).
job_metrics_done() {
  [[ -f "$1" && "$(job_last_line "$1")" == '{"event":"done",'* ]]
}

# job_restarted: whether this run carries on an earlier run of the same training: a job Slurm has
# requeued (SLURM_RESTART_COUNT), or a slurm/chain.sh segment after the first (CHAIN_SEGMENT).
job_restarted() {
  [[ "${SLURM_RESTART_COUNT:-0}" =~ ^[0-9]+$ && "${CHAIN_SEGMENT:-1}" =~ ^[0-9]+$ ]] || return 1
  ((10#${SLURM_RESTART_COUNT:-0} > 0 || 10#${CHAIN_SEGMENT:-1} > 1))
}

# job_newest_checkpoint DIR: the name of DIR's checkpoint of the highest step (ckpt-STEP.hpck, as
# hpctrain names them; not its unfinished ckpt-STEP.hpck.tmp.PID), else nothing.
job_newest_checkpoint() {
  local path name step newest="" newest_step=-1
  for path in "$1"/ckpt-*.hpck; do
    name=${path##*/} step=${name#ckpt-} step=${step%.hpck}
    [[ -f "$path" && "$step" =~ ^[0-9]{1,18}$ ]] && ((10#$step > newest_step)) || continue
    newest=$name newest_step=$((10#$step))
  done
  echo "$newest"
}

# The training's first run (not requeued, chain segment 1) given --resume notes the directory's
# newest checkpoint as it starts, by name and inode, in CHECKPOINT_DIR/slurm-first-run ("-": none;
# written whole, then renamed). job_note_first_run NEWEST writes it; job_from_first_run NEWEST:
# whether NEWEST is that same file (no run has checkpointed since; false without a note: a job
# started by an older job.sh continues as it did).
job_checkpoint_identity() {  # NAME: "NAME INODE", "-" for none
  [[ -n "$1" ]] || { echo -; return 0; }
  echo "$1 $(stat -c %i -- "$CHECKPOINT_DIR/$1" 2> /dev/null || echo ?)"
}
job_note_first_run() {
  job_write_whole "$CHECKPOINT_DIR/slurm-first-run" "$(job_checkpoint_identity "$1")"$'\n' ||
    job_log "cannot write $CHECKPOINT_DIR/slurm-first-run: a requeued run will continue the newest checkpoint, whichever run wrote it"
}
job_from_first_run() {
  local noted=""
  [[ -f "$CHECKPOINT_DIR/slurm-first-run" ]] || return 1
  read -r noted < "$CHECKPOINT_DIR/slurm-first-run" 2> /dev/null || return 1
  [[ "$noted" == "$(job_checkpoint_identity "$1")" && "$noted" != *"?" ]]
}

# job_persist_snapshot ARGS...: after a run that failed, the newest snapshot in the nodes' memory
# (hpctrain keeps one with a checkpoint directory, its run-id) goes into CHECKPOINT_DIR as the
# checkpoint of its step (hpctrain persist-snapshot, once on each node of the job, within 2
# minutes): a requeue that lands on other nodes resumes from it, not from the last periodic
# checkpoint, and one that lands here from the same state. hpcrun does this itself as it ends.
job_persist_snapshot() {
  [[ "${LAUNCHER:-srun}" != hpcrun && -f "$CHECKPOINT_DIR/run-id" ]] || return 0
  local snapshots nodes=${SLURM_JOB_NUM_NODES:-1} launch
  snapshots=$(job_option_value snapshot-dir "$@")
  [[ "$nodes" =~ ^[0-9]+$ ]] || nodes=1
  case "${LAUNCHER:-srun}" in
    srun) launch=(srun --mpi=pmix --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1) ;;
    mpirun)
      launch=(mpirun --map-by ppr:1:node --bind-to none)
      ((EUID != 0)) || launch+=(--allow-run-as-root)
      ;;
  esac
  launch+=("$HPCTRAIN" persist-snapshot --checkpoint-dir "$CHECKPOINT_DIR")
  [[ -z "$snapshots" ]] || launch+=(--snapshot-dir "$snapshots")
  job_log "writing the newest snapshot in the nodes' memory into $CHECKPOINT_DIR, where it is newer than its checkpoints"
  timeout 120 "${launch[@]}" || job_log "warning: the newest snapshot was not written into $CHECKPOINT_DIR (exit $?)"
}

# job_resume_newest NAME: the value of every --resume (--resume X, --resume=X) in the array NAME
# made auto.
job_resume_newest() {
  local -n job_rn_args=$1
  local i a prev=""
  for ((i = 0; i < ${#job_rn_args[@]}; ++i)); do
    a=${job_rn_args[i]}
    if [[ "$prev" == --resume ]]; then
      job_rn_args[i]=auto
    elif [[ "$a" == --resume=* ]]; then
      job_rn_args[i]=--resume=auto
    fi
    prev=$a
  done
}

# job_check_requeue_settings: REQUEUE 0 or 1, MAX_REQUEUES and MAX_FAILURES_IN_A_ROW whole numbers
# (decimal), checked before the training rather than when a stop asks for a requeue.
job_check_requeue_settings() {
  [[ "${REQUEUE:-1}" == [01] ]] || job_die "REQUEUE must be 1 (requeue after a stop or failure) or 0, not '$REQUEUE'"
  [[ "${MAX_REQUEUES:-20}" =~ ^[0-9]{1,6}$ ]] ||
    job_die "MAX_REQUEUES must be a whole number of requeues, 0 to 999999, not '$MAX_REQUEUES'"
  [[ "${MAX_FAILURES_IN_A_ROW:-3}" =~ ^[0-9]{1,6}$ ]] && ((10#${MAX_FAILURES_IN_A_ROW:-3} >= 1)) ||
    job_die "MAX_FAILURES_IN_A_ROW must be a whole number of failed runs, 1 to 999999, not '$MAX_FAILURES_IN_A_ROW'"
}

# job_check_launcher_settings: LAUNCHER one of the three, and the setting of its own that it
# takes (SRUN_WAIT under srun, MPIRUN_KILL_WAIT under mpirun, HPCRUN under hpcrun) usable; checked
# before anything is made or staged. The others' settings are not looked at: a stray bad
# MPIRUN_KILL_WAIT (a site's default environment) refused every srun job, which never reads it.
job_check_launcher_settings() {
  case "${LAUNCHER:-srun}" in
    srun)
      [[ "${SRUN_WAIT:-60}" =~ ^[0-9]{1,5}$ ]] && ((10#${SRUN_WAIT:-60} <= 86400)) ||
        job_die "SRUN_WAIT must be a whole number of seconds, 0 (no limit) to 86400, not '$SRUN_WAIT'"
      ;;
    mpirun)
      # mpirun took any word (abc, 1m) and a leading 0 as octal: the ranks' time to checkpoint, silently wrong.
      [[ "${MPIRUN_KILL_WAIT:-30}" =~ ^[0-9]{1,5}$ ]] && ((10#${MPIRUN_KILL_WAIT:-30} <= 86400)) ||
        job_die "MPIRUN_KILL_WAIT must be a whole number of seconds, 0 to 86400, not '$MPIRUN_KILL_WAIT'"
      ;;
    hpcrun) [[ -f "${HPCRUN:-}" && -x "${HPCRUN:-}" ]] || job_die "hpcrun not found at '${HPCRUN:-}' (build it, or set HPCRUN)" ;;
    *) job_die "LAUNCHER must be srun, mpirun or hpcrun, not '$LAUNCHER'" ;;
  esac
}

# job_find_programs: HPCTRAIN and HPCRUN where the job's environment leaves them unset or empty:
# HPCTRAIN_HOME's build/; in an install (HPCTRAIN_HOME PREFIX/share/hpctrain) PREFIX/bin's, the
# programs these scripts came with (PATH's first hpcrun may be HPCToolkit's, loaded by a module,
# or an older install's in /usr/local/bin); else the ones on PATH. One that is set is used as it
# is (job_run_trainer refuses it if it is no executable file): a typo in it fell back to whatever
# PATH held, without a word.
job_find_programs() {
  job_find_program HPCTRAIN hpctrain src
  job_find_program HPCRUN hpcrun launch
}
# job_find_program VARIABLE NAME BUILD_FOLDER: job_find_programs' search for one of them.
job_find_program() {
  local -n program=$1
  [[ -z "${program:-}" ]] || return 0
  program=$HPCTRAIN_HOME/build/$3/$2
  local installed=${HPCTRAIN_HOME%/share/hpctrain}/bin/$2
  [[ -x "$program" || "$HPCTRAIN_HOME" != */share/hpctrain || ! -x "$installed" ]] || program=$installed
  [[ -x "$program" ]] || program=$(command -v "$2" || echo "$program")
}

# job_aws_credentials: on the AWS cluster a job has no role of its node's (its metadata service is
# root's): the data role's credentials are in /run/hpctrain/aws/credentials
# (cloudformation/node/data_credentials.py), for the staging and for anything the training runs,
# unless the job's environment names a file of its own.
job_aws_credentials() {
  local file=${job_aws_credentials_file:-/run/hpctrain/aws/credentials}
  if [[ -z "${AWS_SHARED_CREDENTIALS_FILE:-}" && -r "$file" ]]; then
    export AWS_SHARED_CREDENTIALS_FILE=$file
  fi
}

job_run_trainer() {
  job_record_signals
  job_aws_credentials
  # (A directory passes -x: launched, it failed every run with 126, each requeued as a lost rank.)
  [[ -f "$HPCTRAIN" && -x "$HPCTRAIN" ]] || job_die "hpctrain not found at '$HPCTRAIN' (build it, or set HPCTRAIN)"
  job_check_requeue_settings
  # The launcher and the staging before anything is made or staged: a LAUNCHER=bogus job made its
  # checkpoint directory and staged the whole dataset first, then was refused.
  job_check_launcher_settings
  job_check_stage_settings
  local args=("$@")
  job_read_config "${args[@]}"
  if ! job_has_option checkpoint-dir "${args[@]}"; then
    [[ -n "${CHECKPOINT_DIR:-}" ]] || job_die "no checkpoint directory: set CHECKPOINT_DIR or pass --checkpoint-dir"
    args+=(--checkpoint-dir "$CHECKPOINT_DIR")
  else
    CHECKPOINT_DIR=$(job_option_value checkpoint-dir "${args[@]}")
    [[ -n "$CHECKPOINT_DIR" ]] || job_die "$(job_option_where checkpoint-dir "${args[@]}") is given without a directory"
  fi
  # Never others' to write in, whatever the umask: under umask 000 mkdir made it 0777, which
  # hpctrain then refused (another user could plant a checkpoint there), leaving it for anyone.
  # One line: mkdir's own reason inside it (it printed a second line, with its own name).
  local made
  [[ -d "$CHECKPOINT_DIR" || ! -e "$CHECKPOINT_DIR" ]] ||
    job_die "the checkpoint directory $CHECKPOINT_DIR exists and is not a directory"
  job_check_checkpoint_dir "$CHECKPOINT_DIR"
  made=$( (umask o-w && mkdir -p -- "$CHECKPOINT_DIR") 2>&1) ||
    job_die "cannot create the checkpoint directory $CHECKPOINT_DIR: ${made##*: }"
  job_has_option metrics-file "${args[@]}" || args+=(--metrics-file "$CHECKPOINT_DIR/metrics.jsonl")
  # The options are the job's, the same on every run of it: a --resume FILE (a fine-tune's start)
  # or --resume none made every requeued run (and every chain segment) start over from FILE, and
  # hpctrain moved the checkpoints written since aside (superseded-*). A run that carries on an
  # earlier one continues the newest checkpoint instead, once there is one written since the
  # training's first run started: an older one (a training before it, in a reused directory,
  # which hpctrain moves aside as it sets up) was continued when the first run ended before that.
  local newest
  newest=$(job_newest_checkpoint "$CHECKPOINT_DIR")
  if job_has_option resume "${args[@]}"; then
    if ! job_restarted; then
      job_note_first_run "$newest"
    elif [[ -z "$newest" ]]; then
      :  # nothing to continue yet: the option stays
    elif job_from_first_run "$newest"; then
      job_log "$(job_option_shown resume "${args[@]}") stays: no run of this training has checkpointed since its first run started ($CHECKPOINT_DIR/$newest was there before it)"
    else
      job_log "$(job_option_shown resume "${args[@]}") is for the training's first run: this one continues $CHECKPOINT_DIR/$newest (--resume auto)"
      if job_arg_given resume "${args[@]}"; then
        job_resume_newest args  # (in place: read back a line each, a value holding a newline became two)
      else
        args+=(--resume auto)  # over the config file's (a second --resume would be a usage error)
      fi
    fi
  fi
  # What job_requeue_or_exit compares with to know whether this run carried the training on.
  job_newest_before=$newest
  # How the run ended is read from the metrics file's last line: a stream (a pipe, a FIFO) keeps
  # none, and every finished job would be requeued, up to MAX_REQUEUES times; /dev/stdout (a
  # regular file under sbatch, slurm-JOB.out) read inside $(...) is the reader's own pipe, and
  # the read would never end.
  local metrics
  metrics=$(job_option_value metrics-file "${args[@]}")
  [[ "$metrics" != /dev/* && "$metrics" != /proc/* && (! -e "$metrics" || -f "$metrics") ]] ||
    job_die "$(job_option_shown metrics-file "${args[@]}") is not a regular file of its own: this script reads its last line to know whether the training finished (give a file, or leave the option out for $CHECKPOINT_DIR/metrics.jsonl)"
  # Each rank's math threads: the CPUs Slurm gave its task (hpctrain would otherwise count the
  # host's cores, which a shared node does not all give to this job).
  if [[ -n "${SLURM_CPUS_PER_TASK:-}" ]] && ! job_has_option threads "${args[@]}"; then
    args+=(--threads "$SLURM_CPUS_PER_TASK")
  fi

  # (After the checkpoint directory is known: a staging that fails counts as a run without
  # progress, job_requeue_or_exit.)
  job_stage_data
  if [[ -n "${STAGE_FROM:-}" ]] && ! job_has_option data-dir "${args[@]}"; then
    args+=(--data-dir "$STAGE_TO")
  fi

  local launch
  case "${LAUNCHER:-srun}" in
    srun)
      local cpus
      mapfile -t cpus < <(job_srun_cpus)
      # A task that ends while its peers run (a crash, the OOM killer, a rank that died starting
      # MPI) leaves them waiting in a collective: at start-up no watchdog of hpctrain's runs yet,
      # and the job would sit to its time limit. srun ends them SRUN_WAIT seconds after the first
      # task ended; the ranks of a run that ends well leave MPI together, long before.
      # (A requeued run's step has the old run's job and step ids, so its ranks have the old
      # ranks' Open MPI job name, which two local clusters once shared: tests/slurm/two_clusters.sh.
      # No per-run TCP port range is set against it, which would override a site's own. An old
      # rank that survives the requeue (on a node Slurm could not reach) loses its connections
      # when Slurm kills its peers, and Open MPI ends it; it could reach a new rank only by a first
      # connection to a peer it had never met (Open MPI connects on first use), made before it
      # learns its peers are gone; and a node cut off for SlurmdTimeout has seen TCP give up
      # such a connection long before.)
      launch=(srun --mpi=pmix --wait="$((10#${SRUN_WAIT:-60}))" "${cpus[@]}")
      ;;
    mpirun)
      # Open MPI's mpirun, sent SIGTERM (Slurm ends a job by signalling every process of it),
      # passes SIGTERM to the ranks and kills them 1 s later (odls_base_sigkill_timeout): too
      # soon for a checkpoint of a big model. MPIRUN_KILL_WAIT seconds instead (Slurm's KillWait
      # bounds it anyway); mpirun waits as long after a rank's non-zero exit (75 included).
      launch=(mpirun --bind-to none --mca odls_base_sigkill_timeout "$((10#${MPIRUN_KILL_WAIT:-30}))")
      ((EUID != 0)) || launch+=(--allow-run-as-root)
      ;;
    hpcrun)
      launch=("$HPCRUN" --log-dir "$CHECKPOINT_DIR/hpcrun")
      ;;
  esac
  job_split_words launch "${LAUNCHER_ARGS:-}"  # words, as on a command line (never file patterns)
  [[ "${LAUNCHER:-srun}" == hpcrun ]] && launch+=(--)

  job_log "on ${SLURM_JOB_NODELIST:-?} (${SLURM_JOB_NUM_NODES:-?} node(s), ${SLURM_NTASKS:-?} task(s)), SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-0}; checkpoints in $CHECKPOINT_DIR"
  job_log "${launch[*]} $HPCTRAIN ${args[*]}"

  # The warning signal (--signal=B:USR1@SECONDS, or B:USR2 as submitit's habit: time limit near,
  # or a preemption notice) comes to this shell only: pass it on as SIGUSR1, which every launcher
  # forwards as a stop (hpcrun takes SIGUSR2 for its own), and the trainer checkpoints and exits
  # 75. SIGTERM is not passed on: when Slurm ends a job it sends SIGTERM to every step's processes
  # itself (and srun passes its own on: hpctrain takes a second SIGTERM within 5 s for the same
  # stop, a later one would stop it at once, without a checkpoint). This shell only outlives it,
  # since a batch script that ends takes its steps down with it.
  #
  # Under LAUNCHER=mpirun a SIGTERM, SIGINT or SIGHUP that reaches this shell goes on to mpirun
  # as SIGUSR1 too: Open MPI's mpirun exits 1 on any of those three itself, whatever its ranks
  # exit with, but passes SIGUSR1 on to them and keeps their 75. (Where Slurm signalled mpirun
  # as well, it still exits 1: the metrics file's last line, a "stopped" event with exit code
  # 75, then says that every rank checkpointed and stopped, and this script goes on as for 75.)
  #
  # A signal that came before (while this script set up, or staged) requeues the job before the
  # launch; one between that and the launcher's start is noted (no pid yet) and passed on as
  # SIGUSR1 once it runs: Slurm's own SIGTERM went to the steps there were, not to this one.
  job_act_on_signal "before the trainer was launched"
  local pid="" stop_signal=""
  # shellcheck disable=SC2317  # called by the traps below
  job_warning_signal() {
    if [[ -z "$pid" ]]; then JOB_SIGNAL=${JOB_SIGNAL:-$1}; return; fi
    kill -USR1 "$pid" 2> /dev/null || true  # gone (it ended as the signal came): set -e ended the shell
    job_log "SIG$1: asking the trainer to checkpoint and stop"
  }
  # shellcheck disable=SC2317  # called by the traps below
  job_stop_signal() {
    if [[ -z "$pid" ]]; then JOB_SIGNAL=${JOB_SIGNAL:-$1}; return; fi
    stop_signal=$1
    if [[ "${LAUNCHER:-srun}" == mpirun ]]; then
      kill -USR1 "$pid" 2> /dev/null || true
      job_log "SIG$1: asking the trainer to checkpoint and stop (SIGUSR1 to mpirun)"
    else
      job_log "SIGTERM: Slurm is ending the job; the trainer checkpoints if it can"
    fi
  }
  trap 'job_warning_signal USR1' USR1
  trap 'job_warning_signal USR2' USR2
  trap 'job_stop_signal TERM' TERM
  if [[ "${LAUNCHER:-srun}" == mpirun ]]; then
    trap 'job_stop_signal INT' INT
    trap 'job_stop_signal HUP' HUP
  fi
  "${launch[@]}" "$HPCTRAIN" "${args[@]}" &
  pid=$!
  if [[ -n "${JOB_SIGNAL:-}" ]]; then
    stop_signal=$JOB_SIGNAL
    job_log "SIG$JOB_SIGNAL came as the trainer was launched: asking it to checkpoint and stop"
    kill -USR1 "$pid" 2> /dev/null || true  # it may have ended already (set -e)
  fi
  while kill -0 "$pid" 2> /dev/null; do wait "$pid" || true; done  # a trapped signal ends a wait
  local code=0
  wait "$pid" || code=$?
  trap - INT HUP
  job_record_signals
  if [[ "${LAUNCHER:-srun}" == mpirun && -n "$stop_signal" && "$code" != 0 && "$code" != 75 ]] &&
    job_metrics_stopped "$(job_option_value metrics-file "${args[@]}")"; then
    job_log "mpirun exited $code on SIG$stop_signal (Open MPI's code for a signal sent to it), but the metrics file says every rank checkpointed and stopped: exit 75"
    code=75
  fi

  case "$code" in
    0)
      # srun has been seen to exit 0 after its step's launch timed out, the trainer never run
      # (Slurm 22.05, a node back from a kill): the metrics say whether it finished.
      if job_metrics_done "$(job_option_value metrics-file "${args[@]}")"; then
        job_log "the training finished"
        exit 0
      fi
      job_requeue_or_exit 1 "the launcher exited 0, but the metrics file does not end with the trainer's done event: it did not finish" ;;
    2) job_log "the trainer stopped with a usage error (exit 2): not requeued (an option, the data, or a checkpoint a stop could not write: its own line says which)"; exit 2 ;;
    75) job_requeue_or_exit 75 "the trainer checkpointed and stopped (exit 75)" ;;
    *)
      job_persist_snapshot "${args[@]}"
      job_requeue_or_exit "$code" "the trainer failed (exit $code: a node or rank lost?)"
      ;;
  esac
}
