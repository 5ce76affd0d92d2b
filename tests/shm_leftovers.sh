#!/usr/bin/env bash
# The test suite leaves nothing of hpctrain's in host memory: every test requires the fixture
# whose setup (`before LIST`) notes the run directories in /dev/shm/hpctrain-UID and whose
# cleanup (`after LIST HPCTRAIN`), run once all those tests have ended, fails naming each run
# directory that appeared meanwhile (a test that killed or stopped a run with the default
# --snapshot-dir and left its snapshots). It removes them too (hpctrain clean-snapshots
# --run-id), so that a failing suite does not fill the machine's memory run after run.
set -euo pipefail
mode=${1:?before or after}
list=${2:?the list file}
dir=/dev/shm/hpctrain-$(id -u)
runs() { [[ -d "$dir" ]] && find "$dir" -mindepth 1 -maxdepth 1 -type d -regextype egrep -regex '.*/[0-9a-f]{16}' -printf '%f\n' | sort; true; }
case "$mode" in
  before)
    runs > "$list"
    echo "$(wc -l < "$list") run director(ies) in $dir before the tests"
    ;;
  after)
    hpctrain=${3:?the hpctrain binary}
    [[ -f "$list" ]] || { echo "no $list: the 'before' test did not run"; exit 1; }
    new=$(comm -13 "$list" <(runs))
    if [[ -z "$new" ]]; then
      echo "PASS: the tests left no snapshots in $dir"
      exit 0
    fi
    echo "FAIL: the tests left snapshots in host memory ($dir):"
    for id in $new; do
      echo "  $id: $(ls "$dir/$id" | tr '\n' ' ')($(du -sh "$dir/$id" | cut -f1))"
      # What run it was, to find the test: its options as the snapshot records them.
      for f in "$dir/$id"/ckpt-*.hpck; do
        [[ -f "$f" ]] && "$hpctrain" inspect --json "$f" 2> /dev/null | tr ',' '\n' |
          grep -E '"(step|world_size|option\.(model|dataset|train-samples|batch-size|global-batch-size|max-steps|epochs|lr|checkpoint-every-steps|snapshot-every-steps))"' |
          tr '\n' ' ' | sed 's/^/    /'
        echo
      done
      "$hpctrain" clean-snapshots --run-id "$id" > /dev/null 2>&1 || true
    done
    exit 1
    ;;
  *) echo "usage: $0 before|after LIST [HPCTRAIN]" >&2; exit 2 ;;
esac
