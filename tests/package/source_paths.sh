#!/usr/bin/env bash
# source_paths.sh SOURCE_DIR FILE...: no FILE (the programs and library the packages install) holds
# the tree's own directory. Their check messages name a source file by __FILE__, which the build
# maps to a path from the tree's top (-fmacro-prefix-map, CMakeLists.txt): with it missing, every
# program carries SOURCE_DIR/src/... and a package's bytes depend on where it was built. Prints
# each offender with the first strings found and exits 1.
set -euo pipefail
(($# > 1)) || { echo "usage: source_paths.sh SOURCE_DIR FILE..." >&2; exit 2; }
src=${1%/}/
shift
bad=0
for f in "$@"; do
  [[ -f "$f" ]] || { echo "source_paths.sh: no file $f" >&2; exit 1; }
  found=$(strings -a "$f" | grep -F -- "$src" || true)
  if [[ -n "$found" ]]; then
    echo "source_paths.sh: $f holds $(wc -l <<< "$found") string(s) with $src, e.g.:" >&2
    head -n 3 <<< "$found" | sed 's/^/  /' >&2
    bad=$((bad + 1))
  fi
done
((bad == 0)) || exit 1
echo "source_paths.sh: $# file(s), none holds $src"
