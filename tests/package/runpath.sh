#!/usr/bin/env bash
# runpath.sh DIR...: every ELF file under the DIRs (CMake's own probes in CMakeFiles/ left out)
# searches for libraries only in absolute directories: no RUNPATH or RPATH entry that is empty or
# relative (an empty one, as in "/a:/b:", means the current directory: a library dropped where
# the user runs the program would be loaded). $ORIGIN-relative entries are allowed. Prints each
# offender and exits 1; says how many files it read.
set -euo pipefail
(($# > 0)) || { echo "usage: runpath.sh DIR..." >&2; exit 2; }
checked=0 bad=0
while IFS= read -r -d '' f; do
  [[ "$(head -c 4 "$f" 2> /dev/null | od -An -c | tr -d ' ')" == '177ELF' ]] || continue
  checked=$((checked + 1))
  paths=$(readelf -d "$f" 2> /dev/null | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]$/\2/p')
  [[ -n "$paths" ]] || continue
  while IFS= read -r p; do
    # Split on ':' keeping empty entries (a leading, trailing or doubled ':').
    IFS=: read -r -a entries <<< "$p:"
    for e in "${entries[@]}"; do
      if [[ -z "$e" || ( "$e" != /* && "$e" != '$ORIGIN'* ) ]]; then
        echo "runpath.sh: $f: library search path '$p' has the entry '$e' (empty or relative)" >&2
        bad=$((bad + 1))
        break
      fi
    done
  done <<< "$paths"
done < <(find "$@" -path '*/CMakeFiles' -prune -o -type f -print0)
((checked > 0)) || { echo "runpath.sh: no ELF file under $*" >&2; exit 1; }
((bad == 0)) || exit 1
echo "runpath.sh: $checked ELF file(s), every library search path absolute"
