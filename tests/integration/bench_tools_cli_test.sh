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
exit $failed
