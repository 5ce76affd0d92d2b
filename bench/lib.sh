# Helpers shared by the bench/*.sh scripts (sourced, not run).

# die MESSAGE: one error line naming the script, exit code 2.
die() { echo "$(basename "$0"): error: $*" >&2; exit 2; }

# json_number KEY < line: one numeric field of a flat JSON object (the last one on the input).
json_number() { sed -nE "s/.*\"$1\": ?(-?[0-9.eE+-]+).*/\\1/p" | tail -n 1; }

# calc EXPR [DECIMALS]: awk arithmetic, printed with DECIMALS (default 1) decimals.
calc() { awk "BEGIN { printf \"%.${2:-1}f\", $1 }"; }

# The peer's Python: PYTHON, default Debian's /usr/bin/python3 (where python3-torch lives).
require_torch() {
  [[ -x "$python" ]] || die "no $python (set PYTHON)"
  "$python" -c 'import torch' 2> /dev/null || die "$python cannot import torch (run ./setup.sh --bench)"
}

# Positive integer check for an option's value: require_count NAME VALUE.
require_count() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"; }

# Sets root, hpctrain, peer, python from the environment (see the scripts' headers).
locate_programs() {
  root=$(cd "$(dirname "${BASH_SOURCE[1]}")/.." && pwd)
  local build_dir=${BUILD_DIR:-build}
  [[ "$build_dir" == /* ]] || build_dir="$root/$build_dir"
  hpctrain=${HPCTRAIN:-$build_dir/src/hpctrain}
  gemm_shapes=${GEMM_SHAPES:-$build_dir/bench/gemm_shapes}
  peer=${PEER:-$root/../shared/bench/torch_peer.py}
  python=${PYTHON:-/usr/bin/python3}
  [[ -x "$hpctrain" ]] || die "no hpctrain binary at $hpctrain (run ./setup.sh, or set BUILD_DIR or HPCTRAIN)"
  [[ -f "$peer" ]] || die "no peer script at $peer (set PEER to shared/bench/torch_peer.py)"
  peer=$(cd "$(dirname "$peer")" && pwd)/$(basename "$peer")
  require_torch
}
