#!/usr/bin/env bash
# The Debian package, as a user gets it: cpack -G DEB from the built tree (no rebuild), unpacked
# into a fresh root (dpkg-deb -x: nothing of the machine's is touched), then from that root:
# no library search path that is empty or relative, hpctrain --version and a short job, the man page rendered by man, hpcdata finding hpcdata-pack,
# and a CMake project outside the tree that finds the package and links the library.
# Environment: BUILD_DIR (the configured and built tree), FASHION_MNIST.
set -euo pipefail
: "${BUILD_DIR:?}" "${FASHION_MNIST:?}"
tmp=$(mktemp -d /tmp/hpctrain-package-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "package_test: FAIL: $*" >&2; exit 1; }

(cd "$tmp" && cpack -G DEB --config "$BUILD_DIR/CPackConfig.cmake" -B "$tmp/pkg" > "$tmp/cpack.log" 2>&1) ||
  { cat "$tmp/cpack.log" >&2; fail "cpack -G DEB failed"; }
debs=("$tmp"/pkg/hpctrain_*.deb)
[[ ${#debs[@]} == 1 && -f "${debs[0]}" ]] || fail "cpack made no hpctrain_*.deb: $(ls "$tmp/pkg")"
deb=${debs[0]}
info=$(dpkg-deb --info "$deb")
grep -q '^ Package: hpctrain$' <<< "$info" || fail "not the hpctrain package: $info"
grep -q '^ Depends: .*openmpi-bin' <<< "$info" || fail "Depends lacks openmpi-bin: $info"
grep -q '^ Depends: .*libboost-program-options' <<< "$info" || fail "Depends lacks the shared libraries: $info"

root=$tmp/root
dpkg-deb -x "$deb" "$root"
usr=$root/usr
for f in bin/hpctrain bin/hpcrun bin/hpcdata bin/hpcdata-pack bin/hpctrain-plot share/hpctrain/slurm/train.sbatch \
         share/hpctrain/slurm/job.sh share/hpctrain/datasets/hpcdata share/doc/hpctrain/README.md share/doc/hpctrain/slurm.md \
         share/man/man1/hpctrain.1.gz share/man/man1/hpcrun.1.gz share/man/man1/hpcdata.1.gz \
         include/hpctrain/core/duration.hpp lib/cmake/hpctrain/hpctrainConfig.cmake; do
  [[ -e "$usr/$f" ]] || fail "the package has no /usr/$f"
done
[[ -x "$usr/bin/hpctrain" && -x "$usr/share/hpctrain/slurm/train.sbatch" ]] || fail "programs are not executable"
bash "$(dirname "$0")/runpath.sh" "$root" || fail "an installed binary searches an empty or relative library path"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
version=$("$usr/bin/hpctrain" --version) || fail "hpctrain --version failed"
[[ "$version" == "hpctrain "* ]] || fail "hpctrain --version said '$version'"
"$usr/bin/hpctrain" --device cpu --data-dir "$FASHION_MNIST" --max-steps 2 --train-samples 64 --test-samples 32 \
  --batch-size 16 --threads 1 --quiet --metrics-file "$tmp/m.jsonl" || fail "the installed hpctrain cannot train"
grep -q '"event":"done"' "$tmp/m.jsonl" || fail "no done line from the installed hpctrain"
PATH=$usr/bin:$PATH "$usr/bin/hpcdata" pack --help | grep -q -- '--images-per-shard' ||
  fail "the installed hpcdata does not find its hpcdata-pack"

# The man page renders (man -l: this file, not the database), with the options from --help.
page=$(MANWIDTH=100 man -P cat -l "$usr/share/man/man1/hpctrain.1.gz" 2> "$tmp/man.err") ||
  fail "man cannot render hpctrain.1: $(cat "$tmp/man.err")"
grep -q -- '--checkpoint-dir' <<< "$page" || fail "the man page lacks the options: $page"
grep -q 'NAME' <<< "$page" || fail "the man page has no NAME section"
# The sections a Debian user looks for, every subcommand's options, and nothing of the machine
# that built it (--version's text names its GPUs).
for section in SYNOPSIS 'EXIT STATUS' SIGNALS ENVIRONMENT FILES EXAMPLES COMMANDS 'SEE ALSO'; do
  grep -q "^$section\$" <<< "$page" || fail "the man page has no $section section"
done
for command in evaluate inspect export predict clean-snapshots; do
  grep -q "Usage: hpctrain $command" <<< "$page" || fail "the man page lacks hpctrain $command's options"
done
! grep -qi 'GPU(s) visible\|CUDA runtime' <<< "$page" || fail "the man page holds the build machine's GPUs"
page=$(MANWIDTH=100 man -P cat -l "$usr/share/man/man1/hpcrun.1.gz" 2> "$tmp/man.err") ||
  fail "man cannot render hpcrun.1: $(cat "$tmp/man.err")"
for section in 'EXIT STATUS' SIGNALS ENVIRONMENT FILES EXAMPLES; do
  grep -q "^$section\$" <<< "$page" || fail "hpcrun's man page has no $section section"
done

# A project outside the tree: find_package(hpctrain), link hpctrain::hpctrain_lib, run it.
mkdir -p "$tmp/app"
cat > "$tmp/app/CMakeLists.txt" << 'CMAKE'
cmake_minimum_required(VERSION 3.22)
project(app LANGUAGES C CXX)
find_package(hpctrain 0.1 REQUIRED)
add_executable(app app.cpp)
target_link_libraries(app PRIVATE hpctrain::hpctrain_lib)
CMAKE
cat > "$tmp/app/app.cpp" << 'CPP'
#include <cstdio>
#include "core/duration.hpp"
int main() { std::printf("%g %s\n", hpc::parse_duration("1.5h", "--t"), HPCTRAIN_VERSION); }
CPP
cmake -S "$tmp/app" -B "$tmp/app/build" -DCMAKE_PREFIX_PATH="$usr" > "$tmp/app.log" 2>&1 ||
  { cat "$tmp/app.log" >&2; fail "find_package(hpctrain) failed"; }
grep -q "hpctrain_DIR:PATH=$usr/lib/cmake/hpctrain" "$tmp/app/build/CMakeCache.txt" ||
  fail "find_package found another hpctrain than the unpacked one"
cmake --build "$tmp/app/build" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log" >&2; fail "linking the library failed"; }
said=$("$tmp/app/build/app")
[[ "$said" == "5400 $(awk '{print $2}' <<< "$version")" ]] || fail "the linked program said '$said'"
echo "package_test: ok ($(basename "$deb"))"
