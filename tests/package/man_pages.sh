#!/usr/bin/env bash
# The man pages of this build (help2man's, from each program's --help: BUILD_DIR/man), as man shows
# them: each renders, has a NAME, a SYNOPSIS and a DESCRIPTION, and names every option its program
# and its program's commands take (hpctrain's evaluate ... and hpcdata's prepare, pack, stage);
# its hand-written EXIT STATUS and SIGNALS (docs/man/*.h2m) agree with --help; and no --help holds
# a figure of the machine that runs it (a default shown as this machine's CPU count is the build
# machine's in the page of every user). Seconds; package_test.sh checks the installed pages.
# Environment: BUILD_DIR, HPCTRAIN, HPCRUN, HPCDATA_PACK (the built programs).
set -euo pipefail
: "${BUILD_DIR:?}" "${HPCTRAIN:?}" "${HPCRUN:?}" "${HPCDATA_PACK:?}"
export HPCDATA_PACK OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
fail() { echo "man_pages: FAIL: $*" >&2; exit 1; }
command -v man > /dev/null || { echo "man_pages: SKIP: man is not installed"; exit 77; }

# page PROGRAM COMMAND...: the page of PROGRAM's name against PROGRAM --help and each COMMAND's.
page() {
  local program=$1 name text help command option
  shift
  name=$(basename "$program")
  [[ -f "$BUILD_DIR/man/$name.1.gz" ]] || fail "no man page $BUILD_DIR/man/$name.1.gz"
  # Wide: no option broken over two lines (and hyphenated there).
  text=$(MANWIDTH=1000 man -P cat -l "$BUILD_DIR/man/$name.1.gz" 2> /dev/null) || fail "man cannot render $name.1"
  for section in NAME SYNOPSIS DESCRIPTION; do
    grep -q "^$section\$" <<< "$text" || fail "$name.1 has no $section section (help2man reads it from a 'Usage: ' line)"
  done
  help=$("$program" --help 2>&1) || fail "$name --help failed: $help"
  for command in "$@"; do
    help+=$'\n'$("$program" "$command" --help 2>&1) || fail "$name $command --help failed"
  done
  for option in $(grep -oE -- '--[a-z][a-z0-9-]+' <<< "$help" | sort -u); do
    grep -qE -- "$option([^a-z0-9-]|\$)" <<< "$text" || fail "$name.1 does not name $option, which $name${*:+ or its commands} take"
  done
  # The hand-written sections (docs/man/*.h2m) against --help: an option's "(exit code N)" is in
  # EXIT STATUS's N, and each signal --help names is in SIGNALS.
  local sect code line
  section() { sed -n "/^$1\$/,/^[A-Z][A-Z ]*\$/p" <<< "$text" | sed '1d;$d'; }
  while read -r option code; do
    line=$(section 'EXIT STATUS' | grep -E "^ +$code " || true)
    [[ -n "$line" ]] || fail "$name.1's EXIT STATUS has no $code, which $option gives"
    grep -q -- "$option" <<< "$line" || fail "$name.1's EXIT STATUS $code does not name $option, which gives it: $line"
  done < <(section DESCRIPTION | awk '/^       --[a-z]/ { option = $1; next }
                                      option && match($0, /\(exit code [0-9]+\)/) { print option, substr($0, RSTART + 11, RLENGTH - 12) }
                                      { option = "" }')
  sect=$(section SIGNALS)
  if [[ -n "$sect" ]]; then
    for sig in $(grep -oE 'SIG[A-Z0-9]+' <<< "$help" | sort -u); do
      grep -q "$sig" <<< "$sect" || fail "$name.1's SIGNALS does not name $sig, which $name --help names"
    done
  fi
  # The same --help on one CPU as on all of them (a single CPU here: nothing to compare).
  if (($(nproc) > 1)); then
    for command in "" "$@"; do
      # shellcheck disable=SC2086  # an empty command is none
      diff <("$program" $command --help 2>&1) <(taskset -c 0 "$program" $command --help 2>&1) > /dev/null ||
        fail "$name $command --help differs on one CPU: the man page would show the build machine's figure" \
          "$(diff <("$program" $command --help 2>&1) <(taskset -c 0 "$program" $command --help 2>&1) | grep '^>' | head -3)"
    done
  fi
}

page "$HPCTRAIN" evaluate inspect export predict clean-snapshots persist-snapshot
page "$HPCRUN"
page "$src/datasets/hpcdata" prepare pack stage
page "$HPCDATA_PACK"
page "$src/launch/hpctrain-plot"
echo "man_pages: ok"
