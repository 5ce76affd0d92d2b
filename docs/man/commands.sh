#!/usr/bin/env bash
# The COMMANDS section of a man page, for help2man --include: each subcommand's --help (its usage
# and every option), as the program prints it, in no-fill blocks. hpctrain's (evaluate, inspect,
# export, predict, clean-snapshots, persist-snapshot) and hpcdata's (prepare, pack, stage: pack's are hpcdata-pack's,
# found through HPCDATA_PACK).
#   docs/man/commands.sh PROGRAM OUT
set -euo pipefail
program=${1:?the program: hpctrain or hpcdata}
out=${2:?the file to write}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # --help starts MPI (a world of one)
case $(basename "$program") in
  hpctrain)
    name=hpctrain commands=(evaluate inspect export predict clean-snapshots persist-snapshot)
    intro="Besides training (the default, or \\fBhpctrain train\\fR), hpctrain runs these; each takes its own options:" ;;
  hpcdata)
    name=hpcdata commands=(prepare pack stage)
    intro="Each command takes its own options, and \\fBhpcdata COMMAND \\-\\-help\\fR prints them:" ;;
  *) echo "commands.sh: $program is neither hpctrain nor hpcdata" >&2; exit 2 ;;
esac
{
  echo "[COMMANDS]"
  echo "$intro"
  for command in "${commands[@]}"; do
    echo ".SS \"$name $command\""
    echo ".nf"
    # roff: a backslash is \e, and a line may not start with . or ' (a request).
    "$program" "$command" --help | sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"
    echo ".fi"
  done
} > "$out.tmp"
mv "$out.tmp" "$out"
