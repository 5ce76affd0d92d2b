#!/usr/bin/env bash
# The bench programs written in C++ take their command lines as hpctrain does: --help prints
# their options and exits 0; an unknown option, a word that is no option's value, a missing or
# malformed value and a value out of range each give one line naming it and exit code 2 (no
# crash, no benchmark run with the bad input ignored). Each program is given as NAME=PATH.
# The bench scripts checked here (found beside this file) do the same before any run.
set -uo pipefail
failed=0
check() {  # check PROGRAM WANT_RC ARGS...: the exit code, and one line on stderr when it is 2
  local program=$1 want=$2
  shift 2
  local err rc
  err=$(timeout 60 "$program" "$@" 2>&1 > /dev/null)
  rc=$?
  if [[ $rc -ne $want ]]; then
    echo "FAIL: $(basename "$program") $*: exit $rc, want $want: $err"
    failed=1
  elif [[ $want -eq 2 && $(printf '%s\n' "$err" | grep -c .) -ne 1 ]]; then
    echo "FAIL: $(basename "$program") $*: not one line: $err"
    failed=1
  else
    echo "ok: $(basename "$program") $* -> $rc${err:+: $err}"
  fi
}
for spec in "$@"; do
  name=${spec%%=*} program=${spec#*=}
  [[ -x "$program" ]] || { echo "FAIL: no $name at $program"; failed=1; continue; }
  check "$program" 0 --help
  check "$program" 2 --no-such-option 1
  check "$program" 2 a-stray-word
  case $name in
    allreduce_sweep)
      check "$program" 2 --max-bytes
      check "$program" 2 --max-bytes x
      check "$program" 2 --max-bytes 1e30
      check "$program" 2 --seconds-per-size 0
      check "$program" 2 --cold-bytes 0
      check "$program" 2 --cold-bytes 1e19 ;;
    checkpoint_stall)
      check "$program" 2 --repeats
      check "$program" 2 --repeats x
      check "$program" 2 --repeats 0 ;;
    gemm_shapes)
      check "$program" 2 --threads 0
      check "$program" 2 --samples x
      check "$program" 2 --sample-seconds 11 ;;
    gpu_step)
      check "$program" 2 --batch 0
      check "$program" 2 --iters x
      check "$program" 2 --bn-tuning 3,3,3,3 ;;
    layer_profile)
      check "$program" 2 --steps x
      check "$program" 2 --threads 0
      check "$program" 2 --input 28,28
      check "$program" 2 --model no-such-model ;;
    loader_throughput)
      check "$program" 2 --images x
      check "$program" 2 --images -3
      check "$program" 2 --images 9
      check "$program" 2 --model no-such-model
      check "$program" 2 --source 375x
      check "$program" 2 --threads 5000
      check "$program" 2 --steps 99999999999999999999999 ;;
    *) echo "FAIL: no cases for $name"; failed=1 ;;
  esac
done

# bench/same_bits.sh: --help prints its header's usage; bad arguments are refused before its
# trainings start (timeout 10: a refusal is immediate, a training run would be cut).
same_bits=$(cd "$(dirname "$0")/../.." && pwd)/bench/same_bits.sh
for help in --help -h; do
  out=$(timeout 10 "$same_bits" "$help" 2> /dev/null)
  rc=$?
  if [[ $rc -ne 0 || $out != *"bench/same_bits.sh HPCTRAIN_OLD HPCTRAIN_NEW"* ]]; then
    echo "FAIL: same_bits.sh $help: exit $rc, not the usage: ${out:0:200}"
    failed=1
  else
    echo "ok: same_bits.sh $help -> usage"
  fi
done
hpctrain_stand_in=$(mktemp)
chmod +x "$hpctrain_stand_in"
trap 'rm -f "$hpctrain_stand_in"' EXIT
for args in "--no-such-option" "$hpctrain_stand_in --no-such-option" "-x $hpctrain_stand_in" "" \
  "$hpctrain_stand_in $hpctrain_stand_in $hpctrain_stand_in" "/no/such/hpctrain" "$(dirname "$hpctrain_stand_in")"; do
  err=$(timeout 10 "$same_bits" $args 2>&1 > /dev/null)
  rc=$?
  if [[ $rc -ne 2 || $(printf '%s\n' "$err" | grep -c .) -ne 1 || $err != "same_bits.sh: error: "* ]]; then
    echo "FAIL: same_bits.sh $args: exit $rc, want 2 and one error line: ${err:0:300}"
    failed=1
  else
    echo "ok: same_bits.sh $args -> 2: $err"
  fi
done

# bench/chaos_report.py: an input it cannot read is one line and exit 2 (1 is a soak that failed),
# never a traceback (it was one for each of these, and a --times of no length divided by zero).
chaos_report=$(cd "$(dirname "$0")/../.." && pwd)/bench/chaos_report.py
soak=$(mktemp -d)
trap 'rm -f "$hpctrain_stand_in"; rm -rf "$soak"' EXIT
printf '%s\n' '{"event":"config","unix_time":100,"resumed_from_step":-1}' '{"event":"step","unix_time":101,"step":1}' \
  '{"event":"done","unix_time":102,"steps":1,"state_checksum":"ab"}' > "$soak/ok.jsonl"
printf '1\n' > "$soak/number.jsonl"
printf '{"event":"done","steps":1}\n' > "$soak/no_checksum.jsonl"
printf '{"event":"step","unix_time":1,"step":"x"}\n' > "$soak/step_text.jsonl"
printf '\xff\n' > "$soak/latin1.jsonl"
printf '101\t101.5\tkill\th1\trank 0\n' > "$soak/faults.tsv"
printf '101\n' > "$soak/short_faults.tsv"
: > "$soak/left.tsv"
printf '{"attempts":[]}\n' > "$soak/summary.json"
printf '1 2\n' > "$soak/fds.txt"
# (Each of these three was a traceback: an "event" that is no string, a number past a float's
# range, a count whose digit is not 0-9.)
{ printf '{"event":["x"]}\n'; cat "$soak/ok.jsonl"; } > "$soak/list_event.jsonl"
printf '{"event":"step","unix_time":1,"step":1%0400d}\n' 0 > "$soak/huge_step.jsonl"
printf '1\t1\t\xc2\xb2\n' > "$soak/fds_superscript.txt"
mkdir "$soak/dir"
mkfifo "$soak/fifo"
soak_args=(--ref "$soak/ok.jsonl" --run "$soak/ok.jsonl" --faults "$soak/faults.tsv" --left "$soak/left.tsv"
  --times 100 102 100 102 --seed 1 --duration 1 --mean-interval 1 --min-kinds 1 --job test)
check "$chaos_report" 0 "${soak_args[@]}"
check "$chaos_report" 0 "${soak_args[@]/#$soak\/ok.jsonl/$soak/list_event.jsonl}"  # not an event it reads
# An hpcrun invocation stopped while it waited for hosts (a preemption after a cut host) writes a
# summary.json without attempts, exit 75: it is read, and the last hosts are those of the last attempt.
printf '{"exit_code":0,"failures":0,"attempts":[{"hosts":"h1:1,h2:1"}]}\n' > "$soak/summary-1.json"
printf '{"exit_code":75,"failures":0,"attempts":[]}\n' > "$soak/summary-2.json"
cp "$soak/summary-1.json" "$soak/summary-3.json"
check "$chaos_report" 0 "${soak_args[@]}" --hosts h1,h2 --hpcrun-summaries "$soak"/summary-{1,2,3}.json
# The last invocation is the highest number, not the last name as text (summary-10 came before
# summary-9): here the 10th ran without h2, which is left out (exit 1).
printf '{"exit_code":0,"failures":0,"attempts":[{"hosts":"h1:1"}]}\n' > "$soak/summary-10.json"
cp "$soak/summary-1.json" "$soak/summary-9.json"
check "$chaos_report" 1 "${soak_args[@]}" --hosts h1,h2 --hpcrun-summaries "$soak"/summary-{9,10}.json
[[ $(timeout 60 "$chaos_report" "${soak_args[@]}" --hosts h1,h2 --hpcrun-summaries "$soak"/summary-{9,10}.json) == \
  *"host left out: h2"* ]] || { echo "FAIL: chaos_report.py: h2, left out of the 10th invocation, not reported"; failed=1; }
for bad in "--no-such-option" "--times 100 102 100 100" "--times nan 102 100 102" "--min-kinds -1" \
  "--ref $soak/missing.jsonl" "--ref $soak/dir" "--run $soak/fifo" "--run $soak/number.jsonl" \
  "--run $soak/no_checksum.jsonl" "--run $soak/step_text.jsonl" "--run $soak/latin1.jsonl" \
  "--faults $soak/short_faults.tsv" "--hpcrun-summaries $soak/summary.json" "--fds $soak/fds.txt" \
  "--run $soak/huge_step.jsonl" "--fds $soak/fds_superscript.txt"; do
  # shellcheck disable=SC2086 # each case is words
  check "$chaos_report" 2 "${soak_args[@]}" $bad
done
# Its report refused by standard output: a full disk, or closed (print() passed over that: exit 0, no report).
for out in /dev/full '&-'; do
  err=$(bash -c "exec \"\$0\" \"\$@\" >$out" "$chaos_report" "${soak_args[@]}" 2>&1)
  rc=$?
  if [[ $rc -ne 2 || $err != "chaos_report: error: cannot write the report to standard output: "* || $err == *$'\n'* ]]; then
    echo "FAIL: chaos_report.py >$out: exit $rc, want 2 and one line: $err"
    failed=1
  else
    echo "ok: chaos_report.py >$out -> 2: $err"
  fi
done
exit $failed
