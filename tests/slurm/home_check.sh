#!/usr/bin/env bash
# slurm/train.sbatch and sweep.sbatch source HPCTRAIN_HOME/slurm/job.sh and run the programs of
# HPCTRAIN_HOME/build/ only where no one but the job's user or root could have put them there.
# HPCTRAIN_HOME is the directory above the submitted script's, so a copy of train.sbatch in
# /shared/alice/ made it /shared, where another user's slurm/job.sh or build/src/hpctrain ran as
# alice. Run here without Slurm (stand-ins for scontrol and srun, as sbatch would run the script):
# such a home is refused with one line and exit 2 before anything of it runs, and a checkout of
# the job's user's own (under /tmp, sticky and writable by all, included) trains as before.
# Another uid's files need root (chown); without root those cases are left out and said so.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d /tmp/hpctrain-home-check-XXXXXX)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
mkdir "$work/bin"
# scontrol show job -o ID: the job's record, whose Command= names the script as submitted and
# the arguments it was given, unquoted.
# shellcheck disable=SC2016  # $COMMAND: the stand-in's, when it runs
printf '#!/bin/sh\necho "JobId=1 JobName=hpctrain UserId=u JobState=RUNNING Command=$COMMAND --epochs 1 WorkDir=/x StdOut=/x/o"\n' > "$work/bin/scontrol"
cat > "$work/bin/srun" << 'EOF'
#!/usr/bin/env bash
while [[ "$1" == -* ]]; do shift; done
exec "$@"
EOF
chmod +x "$work/bin/"*
export PATH="$work/bin:$PATH" SLURM_JOB_ID=1 SLURM_JOB_NAME=hpctrain SLURM_SUBMIT_DIR="$work" SLURM_ARRAY_TASK_ID=0 \
  SLURM_ARRAY_JOB_ID=1 SWEEP="lr=0.1" CHECKPOINT_DIR="$work/ck" SWEEP_DIR="$work/sweep" HPCTRAIN_HOME=
unset HPCTRAIN HPCRUN STAGE_FROM
failed=0
fail() { echo "FAIL: $*"; failed=1; }

# A trainer that finishes at once: the metrics file's last line is its done event.
# shellcheck disable=SC2016  # the trainer's own variables
trainer='#!/usr/bin/env bash
while (($#)); do [[ "$1" == --metrics-file ]] && echo "{\"event\":\"done\",\"steps\":1}" >> "$2"; shift; done'
# What another user plants: it leaves $work/ran-<name> when it runs.
planted() { printf '#!/usr/bin/env bash\ntouch %q\njob_run_trainer() { exit 0; }\n' "$work/ran-$1" > "$2"; }

# checkout DIR: an hpctrain checkout of this user's in DIR: the scripts, and a built hpctrain.
checkout() {
  mkdir -p "$1/slurm" "$1/build/src"
  cp "$repo/slurm/job.sh" "$repo/slurm/train.sbatch" "$repo/slurm/sweep.sbatch" "$1/slurm/"
  echo "$trainer" > "$1/build/src/hpctrain"
  chmod 755 "$1/build/src/hpctrain"
}

# submitted SCRIPT: runs SCRIPT as sbatch would (Slurm's record naming it); sets out and rc.
submitted() {
  rm -rf "$work/ck" "$work/sweep"  # no metrics file of an earlier run's to read as this one's
  out=$(COMMAND=$1 timeout 60 bash "$1" 2>&1)
  rc=$?
}

# refused WHAT SCRIPT SAYS: exit 2, one line holding SAYS, and nothing planted ran.
refused() {
  submitted "$2"
  if compgen -G "$work/ran-*" > /dev/null; then
    fail "$1: what was planted ran ($(cd "$work" && echo ran-*)): exit $rc: $out"
  elif ((rc != 2)) || [[ $(grep -c . <<< "$out") != 1 || "$out" != *"$3"* ]]; then
    fail "$1: exit $rc, want 2 and one line saying '$3': $out"
  else
    echo "ok: $1 -> $out"
  fi
  rm -f "$work"/ran-*
}

# trains WHAT SCRIPT: exit 0, the training finished.
trains() {
  submitted "$2"
  if ((rc != 0)) || [[ "$out" != *"the training finished"* ]]; then
    fail "$1: exit $rc, want 0 and the training finished: $out"
  else
    echo "ok: $1 trains"
  fi
}

# The report's case: /shared (writable by all, sticky) with alice's copy of the script in
# /shared/alice/ and another user's slurm/job.sh in /shared.
shared="$work/shared"
mkdir -p "$shared/alice" "$shared/slurm"
chmod 1777 "$shared" "$shared/slurm"
cp "$repo/slurm/train.sbatch" "$repo/slurm/sweep.sbatch" "$shared/alice/"
planted shared "$shared/slurm/job.sh"
for script in train sweep; do
  refused "$script.sbatch copied to /shared/alice/" "$shared/alice/$script.sbatch" \
    "hpctrain-slurm: error: $shared is writable by others (mode 1777): not using it; set HPCTRAIN_HOME to your hpctrain checkout or install"
done

# A home no one else can write to, whose slurm/job.sh another user owns or anyone may write.
team="$work/team"
mkdir -p "$team/alice" "$team/slurm"
cp "$repo/slurm/train.sbatch" "$team/alice/"
planted team "$team/slurm/job.sh"
if ((EUID == 0)); then
  chown 1001:1001 "$team/slurm/job.sh"
  refused "slurm/job.sh of uid 1001" "$team/alice/train.sbatch" \
    "$team/slurm/job.sh belongs to uid 1001, not you (uid 0), root or one of your groups: not using it"
  chown 0:0 "$team/slurm/job.sh"
else
  echo "left out: another uid's job.sh (chown needs root)"
fi
chmod 666 "$team/slurm/job.sh"
refused "slurm/job.sh writable by all" "$team/alice/train.sbatch" "$team/slurm/job.sh is writable by others (mode 666)"
chmod 644 "$team/slurm/job.sh" && chmod 757 "$team/slurm"
refused "slurm/ writable by others" "$team/alice/train.sbatch" "$team/slurm is writable by others (mode 757)"

# This user's own checkout trains, under /tmp and in a directory like it (sticky, writable by all).
home="$work/sticky/hpctrain"
mkdir -p "$work/sticky" && chmod 1777 "$work/sticky"
checkout "$home"
trains "a checkout of one's own" "$home/slurm/train.sbatch"
trains "sweep.sbatch in a checkout of one's own" "$home/slurm/sweep.sbatch"
HPCTRAIN_HOME=$home trains "HPCTRAIN_HOME set to one's checkout" "$shared/alice/train.sbatch"
# ... and this repository itself (its job.sh, build/ and datasets/hpcdata pass), with a stand-in trainer.
echo "$trainer" > "$work/trainer" && chmod 755 "$work/trainer"
HPCTRAIN=$work/trainer trains "this repository's slurm/train.sbatch" "$repo/slurm/train.sbatch"
# A link to a checkout is followed: its target is what is checked.
ln -s "$home" "$work/link"
trains "a link to a checkout" "$work/link/slurm/train.sbatch"

# A checkout under a name with a space: scontrol -o prints Command= unquoted, and reading it to
# the first space named a home that is not there (exit 2, "no slurm/job.sh").
checkout "$work/my work/hpctrain"
trains "a checkout under a name with a space" "$work/my work/hpctrain/slurm/train.sbatch"
trains "sweep.sbatch under a name with a space" "$work/my work/hpctrain/slurm/sweep.sbatch"

# The checkout's programs: another user's hpctrain, a build/ others may write to.
if ((EUID == 0)); then
  planted binary "$home/build/src/hpctrain" && chown 1001:1001 "$home/build/src/hpctrain"
  refused "build/src/hpctrain of uid 1001" "$home/slurm/train.sbatch" \
    "$home/build/src/hpctrain belongs to uid 1001, not you (uid 0), root or one of your groups: not using it"
  refused "sweep.sbatch, build/src/hpctrain of uid 1001" "$home/slurm/sweep.sbatch" \
    "$home/build/src/hpctrain belongs to uid 1001"
  checkout "$home" && chown 0:0 "$home/build/src/hpctrain"
  # Another user's directory of one of your groups (a PI's project directory) is trusted as the
  # group is: a checkout in it trains.
  mkdir -p "$work/project" && chown 1001:"$(id -g)" "$work/project" && chmod 2775 "$work/project"
  cp -a "$home" "$work/project/"
  trains "a checkout in a project directory of one's group" "$work/project/hpctrain/slurm/train.sbatch"
fi
chmod 757 "$home/build"
refused "build/ writable by others" "$home/slurm/train.sbatch" "$home/build is writable by others (mode 757)"
# A group may write (a team's checkout; umask 002 makes a user's own directories 775).
chmod 775 "$home/build" "$home/slurm" "$home"
trains "a checkout its group may write to" "$home/slurm/train.sbatch"
chmod 755 "$home/build" "$home/slurm" "$home"
# A directory above the checkout that all may write to, without the sticky bit: anyone could move
# the checkout away and put one of theirs in its place.
mkdir -p "$work/open" && chmod 777 "$work/open" && mv "$home" "$work/open/"
refused "a checkout in a directory writable by all" "$work/open/hpctrain/slurm/train.sbatch" \
  "$work/open is writable by others (mode 777): not using $work/open/hpctrain"

((failed == 0)) && echo PASS
exit "$failed"
