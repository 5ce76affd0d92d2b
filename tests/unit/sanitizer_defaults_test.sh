#!/bin/bash
# The checked build's built-in checker options (src/core/sanitizer_defaults.cpp) take effect: two
# small programs are built with the sanitizers as a checked build links its programs (the file
# an object of the link), each run once without it and once with it, and without ASAN_OPTIONS
# or UBSAN_OPTIONS (as a rank that hpcrun starts over ssh has them):
#   a leak:               LeakSanitizer's report fails the program without it; with it, exit 0
#                         (detect_leaks=0: Open MPI's allocations kept to the end of every rank);
#   a signed overflow:    UBSan's report lets it go on (exit 0) without it; with it, it stops
#                         there (halt_on_error=1), the stack printed.
# In a checked build, the PROGRAMs given (the build's own) must define both functions
# themselves: not lack them (as the programs that link none of hpctrain's libraries did when the
# file came from the library), nor keep the sanitizer runtime's weak defaults (as Clang's
# runtimes, linked first, made every program do then).
# Usage: sanitizer_defaults_test.sh CXX SOURCE_DIR [PROGRAM...]
set -euo pipefail
cxx=$1 src=$2
shift 2
work=$(mktemp -d "${TMPDIR:-/tmp}/hpctrain-sanitizer-defaults-XXXXXX")
trap 'rm -rf "$work"' EXIT
unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
fail() { echo "FAIL: $*" >&2; exit 1; }

cat > "$work/leak.cpp" << 'CPP'
#include <cstdlib>
#include <cstdio>
void* volatile kept;
int main() { kept = std::malloc(4096); kept = nullptr; std::puts("ran"); return 0; }
CPP
cat > "$work/overflow.cpp" << 'CPP'
#include <climits>
#include <cstdio>
int main(int argc, char**) { int x = INT_MAX; x += argc; std::printf("ran %d\n", x); return 0; }
CPP
"$cxx" -fsanitize=address -o "$work/leak_plain" "$work/leak.cpp"
"$cxx" -fsanitize=address -o "$work/leak_checked" "$work/leak.cpp" "$src/src/core/sanitizer_defaults.cpp"
"$cxx" -fsanitize=undefined -o "$work/overflow_plain" "$work/overflow.cpp"
"$cxx" -fsanitize=undefined -o "$work/overflow_checked" "$work/overflow.cpp" "$src/src/core/sanitizer_defaults.cpp"

run() { set +e; "$work/$1" > "$work/$1.out" 2>&1; echo $?; set -e; }
rc=$(run leak_plain)
[[ $rc != 0 ]] && grep -q "LeakSanitizer" "$work/leak_plain.out" || fail "without the defaults the leak was not reported (rc $rc): $(cat "$work/leak_plain.out")"
rc=$(run leak_checked)
[[ $rc == 0 ]] || fail "with the defaults the leak still failed the program (rc $rc): $(cat "$work/leak_checked.out")"
rc=$(run overflow_plain)
[[ $rc == 0 ]] && grep -q "runtime error" "$work/overflow_plain.out" || fail "without the defaults UBSan did not report and go on (rc $rc): $(cat "$work/overflow_plain.out")"
rc=$(run overflow_checked)
[[ $rc != 0 ]] && ! grep -q "^ran" "$work/overflow_checked.out" || fail "with the defaults UBSan did not stop at the overflow (rc $rc): $(cat "$work/overflow_checked.out")"
grep -q "#0 " "$work/overflow_checked.out" || fail "with the defaults UBSan printed no stack: $(cat "$work/overflow_checked.out")"
echo "the built-in options held: the leak passed, the overflow stopped the program with its stack"
for program in "$@"; do
  nm "$program" > "$work/symbols" || fail "nm could not read $program"
  for f in __asan_default_options __ubsan_default_options; do
    grep -qE "^[0-9a-f]+ T $f$" "$work/symbols" ||
      fail "$program does not define $f itself ($(grep " $f$" "$work/symbols" || echo "not at all")): it runs without the built-in options"
  done
  echo "$program carries them"
done
