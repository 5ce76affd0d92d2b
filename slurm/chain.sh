#!/usr/bin/env bash
# For sites that forbid requeue: submits a training as a chain of N jobs ("segments"), each one
# starting when the one before it has ended, whatever its end (--dependency=afterany). Every
# segment runs slurm/train.sbatch with REQUEUE=0 and --no-requeue on the same checkpoint
# directory: a segment stopped by its time limit's warning signal checkpoints (exit 75) and the
# next one resumes from there. Each segment gets CHAIN_SEGMENT=K (1 for the first): from the
# second on, the job script continues the newest checkpoint even where the hpctrain options say
# --resume FILE or --resume none (the first segment's start). Segments that start after the
# training is done only evaluate the final checkpoint and end at once.
#
#   slurm/chain.sh SEGMENTS [sbatch options] [-- hpctrain options]
#   e.g. slurm/chain.sh 6 --time=04:00:00 -- --epochs 90
#
# sbatch's options come before the --, hpctrain's after it: an option before it that sbatch does not
# know (an hpctrain option without the --) is refused, exit 2, naming it, nothing submitted; so is
# --threads there, which sbatch would take for its --threads-per-core.
#
# Environment: CHECKPOINT_DIR (default runs/hpctrain-chain-<date>-<time>-<pid> here; printed), and
# CHAIN_SCRIPT (default slurm/train.sbatch beside this script). Prints one line per segment,
# "segment K: job ID", and exits 2 on bad input; if a submission fails midway, the segments
# already submitted are cancelled (no half chain is left queued) and it exits 1; so they are when
# a signal stops it (SIGINT, SIGTERM, SIGHUP: exit 128+N).
set -euo pipefail

me=chain.sh
die() { echo "$me: error: $1" >&2; exit "${2:-1}"; }  # die MESSAGE [CODE]
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

[[ "${1:-}" == -h || "${1:-}" == --help ]] && { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0; }
segments=${1:-}
# Decimal, at most 4 digits (bash would read 010 as octal and wrap a 20-digit number).
[[ "$segments" =~ ^[0-9]{1,4}$ ]] && ((10#$segments >= 1 && 10#$segments <= 1000)) ||
  die "the first argument must be the number of segments, 1 to 1000, not '${segments}' (try --help)" 2
segments=$((10#$segments))
shift
sbatch_args=()
while (($#)) && [[ "$1" != -- ]]; do
  # sbatch takes any unambiguous start of a long option (--depend, --req) and -d's value joined.
  [[ "$1" == --req* || "$1" == --dep* || "$1" == -d* ]] &&
    die "'$1' is chain.sh's to set: segments never requeue and each depends on the one before" 2
  # The segments learn their checkpoint directory from the environment (CHECKPOINT_DIR,
  # REQUEUE=0): --export=NONE or a list would leave each its own directory, training from scratch.
  [[ "$1" == --export || "$1" == --export=* ]] &&
    die "'$1' is chain.sh's to set: every segment needs CHECKPOINT_DIR and REQUEUE from its environment (--export=ALL)" 2
  # hpctrain's --threads without the -- before it: sbatch takes any unambiguous start of its long
  # options, and gave every segment --threads-per-core instead, silently.
  [[ "$1" == --threads || "$1" == --threads=* ]] &&
    die "'$1' before --: sbatch would take it for its --threads-per-core; hpctrain's options go after -- (chain.sh $segments [sbatch options] -- [hpctrain options]), and sbatch's is to be written in full" 2
  sbatch_args+=("$1")
  shift
done
(($#)) && shift  # the --
script=${CHAIN_SCRIPT:-$here/train.sbatch}
[[ -f "$script" ]] || die "no job script '$script' (CHAIN_SCRIPT)" 2
command -v sbatch > /dev/null || die "sbatch not found: run this where Slurm's commands are" 2
# (The pid: chains submitted in one second, by a loop, must not share a directory and resume
# each other's checkpoints.)
checkpoint_dir=${CHECKPOINT_DIR:-$PWD/runs/hpctrain-chain-$(date +%Y%m%d-%H%M%S)-$$}
[[ "$checkpoint_dir" == /* ]] || checkpoint_dir="$PWD/$checkpoint_dir"
# One that is a file, or lies under one, failed every segment at its start: all N were submitted
# and each ended at once (exit 2). Its nearest part that exists must be a directory.
part=$checkpoint_dir
while [[ ! -e "$part" && ! -L "$part" && "$part" == */* ]]; do part=${part%/*}; done
[[ -z "$part" || -d "$part" ]] ||
  die "CHECKPOINT_DIR $checkpoint_dir: $part exists and is not a directory; nothing submitted" 2
# One every segment refuses at its start (slurm/job.sh's check: writable by others, or in a folder
# others may write to that is not sticky): all N were submitted, and each ended at once (exit 2).
# shellcheck source=job.sh
why=$(source "$here/job.sh" && job_check_checkpoint_dir "$checkpoint_dir" 2>&1) ||
  die "${why#hpctrain-slurm: error: }; nothing submitted" 2

# sbatch's error output, read when a submission fails. An hpctrain option given before the --
# went to sbatch, which refused it (exit 255, its own two lines), and chain.sh said only that
# segment 1's submission failed (exit 1).
sbatch_err=$(mktemp "${TMPDIR:-/tmp}/chain.sh-sbatch.XXXXXX") || die "cannot create a temporary file in ${TMPDIR:-/tmp}" 2
trap 'rm -f -- "$sbatch_err"' EXIT
# unknown_option: the option sbatch's error output says it does not know (getopt's words), if any.
unknown_option() {
  local line long="^sbatch: unrecognized option '(.*)'$" short="^sbatch: invalid option -- '(.)'$"
  while IFS= read -r line; do
    if [[ "$line" =~ $long ]]; then echo "${BASH_REMATCH[1]}"; return; fi
    if [[ "$line" =~ $short ]]; then echo "-${BASH_REMATCH[1]}"; return; fi
  done < "$sbatch_err"
}

jobs=() id=""
# cancel_submitted: cancels the segments submitted so far; prints what it did.
cancel_submitted() {
  # (A failing scancel ended the script under set -e before it said which segments stayed queued.)
  local done="cancelled"
  if ((${#jobs[@]})) && ! scancel "${jobs[@]}" 2> /dev/null; then done="could not cancel (scancel failed: scancel them)"; fi
  echo "$done the ${#jobs[@]} segment(s) already submitted (${jobs[*]:-none})"
}
# A signal (Ctrl-C, a closed terminal or ssh session: SIGHUP) between two submissions left the
# segments before it queued, half a chain, without a word. (A submission under way when it comes
# is waited for, and its job cancelled with the others.)
interrupted() {  # interrupted NAME NUMBER
  trap '' INT TERM HUP
  local pending=${id%%;*}
  [[ ! "$pending" =~ ^[0-9]{1,18}$ || " ${jobs[*]} " == *" $pending "* ]] || jobs+=("$pending")
  echo "$me: error: stopped by SIG$1 while submitting segment $k of $segments; $(cancel_submitted)" >&2 || true
  exit $((128 + $2))
}
trap 'interrupted INT 2' INT
trap 'interrupted TERM 15' TERM
trap 'interrupted HUP 1' HUP
# Output nobody reads any more (`chain.sh 6 ... | head -n 2`) does not stop the submissions: each
# segment's line is said to whoever still reads them (SIGPIPE ended the script after two).
trap '' PIPE
say() { printf '%s\n' "$*" 2> /dev/null || true; }
say "$me: $segments segment(s) of $script, checkpoints in $checkpoint_dir"
for ((k = 1; k <= segments; ++k)); do
  dep=() id=""
  ((${#jobs[@]})) && dep=(--dependency="afterany:${jobs[-1]}")
  # --export=ALL over a site's SBATCH_EXPORT=NONE, for the same reason.
  id=$(CHECKPOINT_DIR=$checkpoint_dir REQUEUE=0 CHAIN_SEGMENT=$k sbatch --parsable --no-requeue --export=ALL "${dep[@]}" \
    "${sbatch_args[@]}" "$script" "$@" 2> "$sbatch_err") || {
    option=$(unknown_option)
    if [[ -n "$option" && ${#jobs[@]} == 0 ]]; then
      die "sbatch does not know the option '$option': hpctrain's options go after -- (chain.sh $segments [sbatch options] -- [hpctrain options]); nothing submitted" 2
    fi
    cat -- "$sbatch_err" >&2 || true
    die "submitting segment $k failed; $(cancel_submitted)"
  }
  cat -- "$sbatch_err" >&2 || true  # its warnings
  id=${id%%;*}  # --parsable: "id" or "id;cluster"
  # Anything else (a site's sbatch wrapper that talks on stdout) was taken for the id: the next
  # segment's dependency on it was refused, or a one-segment chain said "segment 1: job <words>".
  shown=${id:0:80}
  [[ "$id" =~ ^[0-9]{1,18}$ ]] ||
    die "submitting segment $k failed (sbatch printed '${shown//$'\n'/\\n}', not a job id; see squeue for segment $k); $(cancel_submitted)"
  jobs+=("$id")
  say "segment $k: job $id"
done
