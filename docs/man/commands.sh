#!/usr/bin/env bash
# The COMMANDS section of hpctrain's man page, for help2man --include: each subcommand's --help
# (its usage and every option), as the program prints it, in no-fill blocks.
#   docs/man/commands.sh HPCTRAIN OUT
set -euo pipefail
hpctrain=${1:?the hpctrain binary}
out=${2:?the file to write}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # --help starts MPI (a world of one)
{
  echo "[COMMANDS]"
  echo "Besides training (the default, or \\fBhpctrain train\\fR), hpctrain runs these; each takes its own options:"
  for command in evaluate inspect export predict clean-snapshots; do
    echo ".SS \"hpctrain $command\""
    echo ".nf"
    # roff: a backslash is \e, and a line may not start with . or ' (a request).
    "$hpctrain" "$command" --help | sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"
    echo ".fi"
  done
} > "$out.tmp"
mv "$out.tmp" "$out"
