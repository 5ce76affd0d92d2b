#!/usr/bin/env bash
# Every case named after ONE_PROCESSOR in tests/CMakeLists.txt is still a case of its binary: a
# renamed or removed one would silently go back to two processors (and CI to a longer run).
# Arguments: BINARY=FILTER words (FILTER: the names joined with ':').
set -euo pipefail
bad=0
for arg in "$@"; do
  binary=${arg%%=*} filter=${arg#*=}
  [[ -x "$binary" ]] || { echo "FAIL: no test binary $binary"; bad=1; continue; }
  listed=$("$binary" --gtest_list_tests --gtest_filter="$filter" | awk '/^[^ ]/{s=$1} /^  /{print s $1}')
  IFS=: read -r -a names <<< "$filter"
  for n in "${names[@]}"; do
    grep -qxF "$n" <<< "$listed" || { echo "FAIL: $(basename "$binary"): ONE_PROCESSOR names $n, which is no case of it"; bad=1; }
  done
  echo "$(basename "$binary"): $(grep -c . <<< "$listed") of ${#names[@]} named cases found"
done
exit "$bad"
