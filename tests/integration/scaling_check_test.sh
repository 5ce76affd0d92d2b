#!/usr/bin/env bash
# bench/scaling_check.sh for real, short (2 ranks, 12 steps, on the CPU): the one script of the GPU
# machine's scaling step, which CI can run, run here so that a fault in it shows before a visit.
# Its checks themselves fail or pass by this machine's cores and load (bench/README.md): asked
# here are the parts every run must print, not the verdicts: the fit, the one-rank input, a
# line a check with its figures, each run taken apart from its Chrome trace beside the model's
# parts, the horovod rows, the count of failed checks; and its refusals.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
script=$root/bench/scaling_check.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() {
  echo "FAILED: $1"
  sed 's/^/  | /' <<< "$2"
  failures=$((failures + 1))
}

out=$(bash "$script" --ranks 2 --steps 12 --keep "$tmp/keep" 2>&1)
code=$?
[[ $code == 0 ]] || fail "scaling_check.sh exited $code" "$out"
for pattern in '^  2 ranks: alpha [0-9.]+ us, bandwidth [0-9.]+ GB/s' \
               '^  step [0-9.]+ ms \(trimmed mean\), comm wait [0-9.]+ ms$' \
               '^scaling_2_ranks_overlap_on=step [0-9.]+ ms predicted [0-9.]+ \((yes|no)\), exposed [0-9.]+ ms predicted [0-9.]+ \((yes|no)\)$' \
               '^scaling_2_ranks_overlap_off=step [0-9.]+ ms predicted [0-9.]+ \((yes|no)\), exposed [0-9.]+ ms predicted [0-9.]+ \((yes|no)\)$' \
               "^  $tmp/keep/trace2_on.json: 2 ranks, against the model on local, overlap on$" \
               "^  $tmp/keep/trace2_off.json: 2 ranks, against the model on local, overlap off$" \
               '^  bucket 1: handed to the communication thread +[0-9.]+ +[0-9.]+ +[0-9.]+$' \
               '^  the main thread waits: backward end to the optimizer +[0-9.]+ +[0-9.]+ +[0-9.]+$' \
               '^  vgg16 at 154 img/s on one P100: model [0-9.]+%, published 68%, within 5 points: (yes|no)$' \
               '^scaling_2_ranks_overlap_off_cold_sweep=step [0-9.]+ ms predicted [0-9.]+ \((yes|no)\), exposed [0-9.]+ ms predicted [0-9.]+ \((yes|no)\)$' \
               '^checks_failed_cold_sweep=[0-2]$' \
               '^checks_failed=[0-2]$'; do
  grep -Eq -- "$pattern" <<< "$out" || fail "no line matching '$pattern'" "$out"
done
# Two tables taken apart, each with a row per part for both ranks: none left empty ("-").
rows=$(grep -Ec '^  (backward pass ends|waits for the slowest|bucket [01][ :]|the last all-reduce|the main thread waits)' <<< "$out")
[[ $rows == 24 ]] || fail "$rows rows of the tables taken apart, wanted 2 x 12" "$out"
grep -E '^  (backward pass ends|bucket [01]: (queued|handed|all-reduce)|the main thread waits).* -( |$)' <<< "$out" &&
  fail "a part without a figure" "$out"
for f in t1.jsonl m1.jsonl m2_on.jsonl m2_off.jsonl trace2_on.json trace2_off.json sweep_fits.json sweep_cold_fits.json; do
  [[ -s $tmp/keep/$f ]] || fail "--keep holds no $f" "$(ls "$tmp/keep")"
done

refuse() {  # refuse MESSAGE ARGS...: one line naming the problem, exit 2
  local message=$1 out code
  shift
  out=$(bash "$script" "$@" 2>&1)
  code=$?
  [[ $code == 2 && $(wc -l <<< "$out") == 1 && $out == *"$message"* ]] ||
    fail "scaling_check.sh $* gave exit $code, wanted one line with '$message' and exit 2" "$out"
}
refuse "--ranks must be rank counts 2 to 9" --ranks 1,2
refuse "--steps must be more than 10" --steps 10
refuse "unknown option '--rank'" --rank 2
refuse "--steps 300 on 4 ranks needs 77056 training images, more than Fashion-MNIST's 60000 (at most 233 steps)" --ranks 2,4 --steps 300
# A refused run clears nothing of an earlier run's --keep directory (the clearing comes after the checks).
refuse "--steps 300 on 4 ranks needs" --ranks 2,4 --steps 300 --keep "$tmp/keep"
[[ -s $tmp/keep/m1.jsonl && -s $tmp/keep/sweep.jsonl ]] || fail "a refused run cleared --keep" "$(ls "$tmp/keep")"
refuse "--cold-bytes must be a byte count" --cold-bytes 1e6
# Numbers bash would read wrongly (past 2^63, octal), before any arithmetic; a tool or --keep
# directory that cannot be had, before any run.
refuse "--steps must be at most 999999, got 144115188075855872" --steps 144115188075855872
refuse "--cold-bytes must be a byte count" --cold-bytes 09
PYTHON=$tmp/no-python refuse "no $tmp/no-python (set PYTHON)" --ranks 2 --steps 11
touch "$tmp/file"
refuse "--keep $tmp/file is not a directory" --keep "$tmp/file"
# Empty values (an unset variable) were taken for no option: --keep's files removed at the end.
refuse "--keep is an empty path (an unset variable?)" --ranks 2 --steps 11 --keep ""
refuse "--cold-bytes is empty (an unset variable?)" --ranks 2 --steps 11 --cold-bytes ""
# --cold-bytes 0: no cold sweep, no second set of predictions. Into the first run's --keep
# directory: its files are cleared first (its checkpoints would resume, training no step, and its
# metrics grow), a file of the user's is left.
echo mine > "$tmp/keep/notes.txt"
out=$(bash "$script" --ranks 2 --steps 11 --cold-bytes 0 --keep "$tmp/keep" 2>&1)
[[ $? == 0 && $out == *checks_failed=* && $out != *cold* && ! -e $tmp/keep/sweep_cold.jsonl ]] ||
  fail "scaling_check.sh --cold-bytes 0 ran a cold sweep, or failed, or left the last run's" "$out"
for f in m1.jsonl m2_on.jsonl m2_off.jsonl; do
  steps=$(grep -c '"event":"step"' "$tmp/keep/$f")
  [[ $steps == 11 ]] || fail "--keep's $f holds $steps step events after a run of 11 steps" "$(ls "$tmp/keep")"
done
[[ $(cat "$tmp/keep/notes.txt" 2>&1) == mine ]] || fail "--keep lost a file not the script's" "$(ls "$tmp/keep")"

echo "scaling_check_test: $failures failed"
((failures == 0))
