#!/usr/bin/env bash
# Build dependencies for a GPU machine that has CUDA but neither the Debian packages hpctrain
# builds against nor a network (the device machines lent to development sessions).
#
#   bench/device_deps.sh pack [DIR]   here, on Debian 12 after ./setup.sh: copies the installed
#       packages' files (Open MPI for one machine, Boost.Program_options, oneDNN, OpenBLAS,
#       GoogleTest, zlib, TurboJPEG, libpng, ONNX, protobuf, nlohmann-json and every library
#       they load), leaves out what no build or run reads, checks the result's shared-library
#       closure (`check`) and leaves DIR/deps.tar.xz, the Fashion-MNIST .gz files
#       (DIR/fashion-mnist) and the GPU peer script (DIR/torch_peer_gpu.py); it prints the size.
#       DIR defaults to .device, which this adds to .git/info/exclude; carry it to the machine.
#   bench/device_deps.sh check [PROGRAM...]   here, without packing (CTest device_deps_closure):
#       every DT_NEEDED of every packed ELF file and of each PROGRAM resolves to a library in
#       the pack's library folders or to one the GPU machine provides (`provided` below), and
#       every packed symbolic link points inside the pack, and every file a packed CMake package
#       names is packed. Exit 1 naming what is missing.
#   bench/device_deps.sh files        the files the pack holds, one a line (what `check` reads).
#   bench/device_deps.sh env DIR      there: unpacks DIR/deps.tar.xz into /tmp/hpctrain-deps-UID
#       (HPCTRAIN_DEPS, once) and prints the export lines that make CMake, the compiler, the
#       loader, Open MPI and the bench scripts' MPIRUN use it:
#       eval "$(bench/device_deps.sh env .device)"
#
# The GPU procedure in bench/README.md ("On a GPU machine") calls `env` itself (DEPS=.device).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The packages the pack copies, found with readelf (what `check` verifies), each installed by
# ./setup.sh (all are in the Depends closure of its list).
packages=(
  # Open MPI: one machine only, so shared memory (vader) and self; the fabric transports (UCX,
  # libfabric, PSM, PSM2, verbs) and their components are left out (see `dropped` and env's
  # OMPI_MCA_* lines).
  libopenmpi-dev openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 libudev1 libmunge2
  libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7 libnl-3-200
  libboost1.74-dev libboost-program-options1.74-dev libboost-program-options1.74.0
  libdnnl-dev libdnnl2 ocl-icd-libopencl1                              # oneDNN loads libOpenCL
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0
  libgtest-dev zlib1g-dev zlib1g nlohmann-json3-dev libisal-dev libisal2
  libturbojpeg0-dev libturbojpeg0 libpng-dev libpng16-16
  libonnx-dev libonnx1 libonnxifi libprotobuf-dev libprotobuf32 libprotobuf-lite32
)

# Files of those packages that nothing reads there (extended regular expressions on absolute
# paths): documentation, GoogleTest's sources (/usr/src), static libraries (but GoogleTest's, linked: Debian ships it only
# static), the Open MPI components of the fabrics left out, and the Boost headers no source
# includes (boost_headers below adds those the build reads).
dropped='^/usr/share/(doc|man|lintian|bug)/|^/usr/src/|^/usr/include/boost/|/openmpi3/mca_[a-z]+_(ucx|ofi|psm|psm2|openib|usnic)\.so$|/libmca_common_(ucx|ofi|verbs)\.so'
kept_static='/lib(gtest|gtest_main|onnxifi_loader)\.a$'

# What the GPU machine provides itself, so the pack must not bring it: glibc; GCC's runtime
# (libstdc++, libgcc_s, OpenMP's libgomp), part of the compiler that builds there; the CUDA
# driver and toolkit (/usr/local/cuda), and cuDNN and NCCL (the toolkit's or PyTorch's wheels').
# Its glibc and libstdc++ must be at least as new as the symbol versions `check` prints
# (GLIBC_2.36, GLIBCXX_3.4.30 from Debian 12: an Ubuntu 24.04 image has them, 22.04 has not).
provided=(
  ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1
  libstdc++.so.6 libgcc_s.so.1 libgomp.so.1
  libcuda.so.1 'libcudart.so.*' 'libcublas.so.*' 'libcublasLt.so.*' 'libcudnn*.so.*' 'libnccl.so.*'
  'libnvrtc*.so.*' 'libnvJitLink.so.*' 'libcurand.so.*' 'libcufft.so.*'
)

# Where the loader finds the pack's libraries there (env's LD_LIBRARY_PATH), relative to its root.
lib_dirs=(
  usr/lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu/openblas-pthread usr/lib/x86_64-linux-gnu/openmpi/lib
  lib/x86_64-linux-gnu
)

shopt -s extglob

# The Boost headers the project's sources include, with everything they include (g++ -M), plus
# boost/config/ whole: its choice of compiler and standard-library headers depends on the
# compiler there.
boost_headers() {
  local includes
  includes=$(cd "$root" && grep -rhoE '^#include <boost/[^>]+>' src launch datasets tests bench kernels | sort -u)
  [[ -n "$includes" ]] || return 0
  g++ -std=c++20 -M -x c++ - <<< "$includes" | tr ' \\' '\n\n' | grep '^/usr/include/boost/' |
    xargs realpath -s | sort -u
  find /usr/include/boost/config -type f
}

# The absolute paths of the files and links the pack holds (no folders; links to folders
# inside a package, such as /usr/include/libpng, but not merged /usr's /lib), sorted.
pack_files() {
  local p f
  for p in "${packages[@]}"; do
    [[ $(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2> /dev/null) == ii* ]] ||
      die "package $p is not installed (./setup.sh installs it; or apt-get install $p)"
  done
  {
    dpkg-query -L "${packages[@]}" | grep -vE "$dropped" | awk -v keep="$kept_static" '!/\.a$/ || $0 ~ keep' |
      while IFS= read -r f; do
        if [[ -L "$f" ]]; then [[ "$f" == /*/* ]] && echo "$f"; elif [[ -f "$f" ]]; then echo "$f"; fi
      done
    boost_headers
  } | sort -u
}

is_provided() {
  local pat
  for pat in "${provided[@]}"; do [[ "$1" == $pat ]] && return 0; done
  return 1
}

# The distribution the package list was written for (its names and sonames).
debian12() { [[ -r /etc/os-release && "$(. /etc/os-release && echo "${ID:-} ${VERSION_ID:-}")" == "debian 12" ]]; }

# check [PROGRAM...]: the closure described in the header; one error line per problem, exit 1;
# 77 (CTest's skip) on another distribution than Debian 12.
check() {
  local p f d
  debian12 || { echo "skipped: the pack is made from Debian 12's packages, and this is not Debian 12"; exit 77; }
  for p in "$@"; do [[ -f "$p" ]] || die "no program $p to check (build it first)"; done
  local -a files
  mapfile -t files < <(pack_files)
  # in_pack: every packed path, and every folder above one (a link may point to a folder).
  declare -A in_pack=() packed=()
  for f in "${files[@]}"; do
    in_pack[$f]=1
    d=${f%/*}
    while [[ -n "$d" && -z "${in_pack[$d]:-}" ]]; do in_pack[$d]=1; d=${d%/*}; done
    for d in "${lib_dirs[@]}"; do [[ "${f%/*}" == "/$d" ]] && packed[${f##*/}]=1; done
  done
  local -a problems=() elves=()
  local target magic
  for f in "${files[@]}"; do
    if [[ -L "$f" ]]; then
      # Every link resolves inside the pack (the absolute ones are re-pointed by env).
      target=$(readlink "$f")
      [[ "$target" == /* ]] || target=$(realpath -sm "${f%/*}/$target")
      [[ -n "${in_pack[$target]:-}" ]] || problems+=("link $f -> $(readlink "$f") points outside the pack")
    elif [[ "$f" == */bin/* || "$f" == *.so || "$f" == *.so.* ]] && LC_ALL=C read -r -N 4 magic < "$f" &&
      [[ "$magic" == $'\x7fELF' ]]; then
      elves+=("$f")
    fi
  done
  # Every file a packed CMake package's imported targets name (CMake refuses the whole package
  # when one is missing, as ONNX's did on the first GPU run: onnxifi, another package's files).
  local named cfg prefix
  for f in "${files[@]}"; do
    [[ "$f" == */cmake/*/*Targets-*.cmake ]] || continue
    cfg=${f%/*}
    # Each get_filename_component(_IMPORT_PREFIX "${_IMPORT_PREFIX}" PATH) goes one folder up.
    prefix=$(realpath -m "$cfg/$(grep -c '^get_filename_component(_IMPORT_PREFIX "${_IMPORT_PREFIX}" PATH)$' \
      "${f%-*}.cmake" | awk '{ for (i = 0; i < $1; i++) printf "../" }')")
    while IFS= read -r named; do
      named=$prefix${named#'${_IMPORT_PREFIX}'}
      [[ -n "${in_pack[$named]:-}" ]] || problems+=("$named, named by $f, is not in the pack")
    done < <(grep -oE '"\$\{_IMPORT_PREFIX\}/[^"]*"' "$f" | tr -d '"' | sort -u)
  done
  local needed provided_seen=()
  for f in "${elves[@]}" "$@"; do
    while IFS= read -r needed; do
      [[ -n "${packed[$needed]:-}" ]] && continue
      if is_provided "$needed"; then provided_seen+=("$needed"); continue; fi
      problems+=("$needed, needed by $f, is neither in the pack's library folders nor provided by the GPU machine")
    done < <(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  done
  if ((${#problems[@]})); then
    for p in "${problems[@]}"; do echo "$(basename "$0"): error: $p" >&2; done
    echo "$(basename "$0"): the pack's closure is incomplete (${#problems[@]} problem(s)): add each library's package to packages=()" >&2
    exit 1
  fi
  # The newest glibc and libstdc++ symbol versions they use: the GPU machine's must be as new.
  local newest
  newest=$(objdump -T "${elves[@]}" "$@" 2> /dev/null | grep -oE '\((GLIBC|GLIBCXX)_[0-9.]+\)' | tr -d '()' |
    sort -uV | awk -F_ '{ v[$1] = $0 } END { print v["GLIBC"], v["GLIBCXX"] }')
  echo "closure complete: $((${#elves[@]} + $#)) ELF files ($# programs), ${#packed[@]} libraries packed; provided by the GPU machine:" \
    "$(printf '%s\n' "${provided_seen[@]}" | sort -u | tr '\n' ' ')(at least $newest)"
}

pack() {
  debian12 || die "the pack is made from Debian 12's packages (names and sonames): run it on Debian 12"
  local dir=${1:-.device}
  [[ "$dir" == /* ]] || dir="$root/$dir"
  # The device call's carry takes paths inside the repository only: refuse another place before
  # the pack's long compression, not after it.
  dir=$(realpath -m "$dir")
  root=$(realpath "$root")
  [[ "$dir" == "$root"/?* ]] || die "pack folder $dir is not a folder inside the repository $root: the device call's carry takes only paths inside it"
  local fm=/usr/share/datasets/fashion-mnist
  [[ -f $fm/train-images-idx3-ubyte.gz ]] || die "no Fashion-MNIST in $fm (apt-get install dataset-fashion-mnist)"
  local peer=${PEER_GPU:-$root/../shared/bench/torch_peer_gpu.py}
  [[ -f $peer ]] || die "no GPU peer script at $peer (set PEER_GPU)"
  check > /dev/null
  mkdir -p "$dir/fashion-mnist"
  pack_files | sed 's|^/||' | tar -C / --no-recursion -T - -cf - | xz -9 -T2 > "$dir/deps.tar.xz.part"
  mv "$dir/deps.tar.xz.part" "$dir/deps.tar.xz"
  cp "$fm"/*.gz "$dir/fashion-mnist/"
  cp "$peer" "$dir/"
  local rel=${dir#"$root"/} exclude
  # A worktree's .git is a file: git names the exclude file.
  exclude=$(git -C "$root" rev-parse --path-format=absolute --git-path info/exclude 2> /dev/null || true)
  if [[ "$rel" != /* && -n "$exclude" ]] && ! grep -qx "/$rel/" "$exclude" 2> /dev/null; then
    mkdir -p "$(dirname "$exclude")"
    echo "/$rel/" >> "$exclude"
  fi
  local tree
  tree=$(cd "$root" && git ls-files -z | xargs -0 cat | wc -c)
  echo "packed $(du -sb "$dir/deps.tar.xz" | cut -f1) bytes of libraries and $(du -scb "$dir"/fashion-mnist/*.gz | tail -n 1 | cut -f1) of Fashion-MNIST;" \
    "with the tracked tree $(du -sb "$dir" | awk -v t="$tree" '{ printf "%.1f", ($1 + t) / 1048576 }') MiB travel (limit 64 MiB)"
  echo "carry '$rel' (run's carry), then eval \"\$(bench/device_deps.sh env $rel)\""
}

env_lines() {
  [[ -n "${1:-}" ]] || die "env needs the folder pack made (bench/device_deps.sh env DIR)"
  local dir=$1
  [[ -f "$dir/deps.tar.xz" ]] || die "no $dir/deps.tar.xz (run bench/device_deps.sh pack first, and carry it)"
  local to=${HPCTRAIN_DEPS:-/tmp/hpctrain-deps-$(id -u)}
  # What is there is put on PATH and LD_LIBRARY_PATH, and run: a folder another user made first
  # (in a shared /tmp, .unpacked and all) or may write in would have their programs run as you.
  # One line, mkdir's reason in it (its own line came first, then a second without the reason).
  local made
  made=$( (umask 077 && mkdir -p -- "$to") 2>&1) || die "cannot create $to: ${made##*: }"
  [[ -d "$to" && ! -L "$to" && -O "$to" ]] ||
    die "$to is not a folder of yours (another user's, or a link?): its programs would run as you; set HPCTRAIN_DEPS to a folder of your own"
  local mode
  mode=$(stat -c %a "$to")
  (((8#$mode & 8#002) == 0)) ||
    die "$to is writable by others (mode $mode): its programs would run as you; chmod o-w it, or set HPCTRAIN_DEPS to a folder of your own"
  if [[ ! -f $to/.unpacked ]]; then
    local err
    err=$(tar -C "$to" -xJf "$dir/deps.tar.xz" 2>&1) ||
      die "cannot unpack $dir/deps.tar.xz into $to ($(head -n 1 <<< "$err")): make it again with bench/device_deps.sh pack"
    # Some -dev links are absolute (libz.so -> /lib/.../libz.so.1.2.13): point them into the copy.
    local link target
    while IFS= read -r link; do
      target=$(readlink "$link")
      [[ -e "$to$target" ]] && ln -sfn "$to$target" "$link"
    done < <(find "$to" -type l -lname '/*')
    touch "$to/.unpacked"
  fi
  local lib=$to/usr/lib/x86_64-linux-gnu ld_path d
  for d in "${lib_dirs[@]}"; do ld_path+=${ld_path:+:}$to/$d; done
  # Debian points mpicc, mpirun and libblas through update-alternatives links that unpacking
  # does not make; the programs are named directly instead: CMake's MPI and MPIEXEC, and
  # MPIRUN for the bench scripts that launch ranks themselves (scaling_check.sh, which
  # gpu_vs_peer.sh's scaling step runs, and mpi_vs_peer.sh), which would otherwise find no
  # `mpirun` or the machine's own, of another Open MPI than the one hpctrain is linked with.
  # OPAL_PREFIX relocates Open MPI, PMIX_PREFIX and the component path PMIx (else it loads the
  # machine's own PMIx plugins). One machine: Open MPI's shared-memory and self transports
  # only, the fabrics' left behind.
  cat << EOS
export HPCTRAIN_DEPS=$to
export OPAL_PREFIX=$to/usr
export PMIX_PREFIX=$to/usr/lib/x86_64-linux-gnu/pmix2 PMIX_MCA_mca_base_component_path=$to/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
export PATH=$to/usr/bin:\$PATH
export LD_LIBRARY_PATH=$ld_path\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export CMAKE_PREFIX_PATH=$to/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
export MPIRUN=$to/usr/bin/mpirun.openmpi
export HPCTRAIN_DEPS_CMAKE_ARGS="-DMPI_C_COMPILER=$to/usr/bin/mpicc.openmpi -DMPIEXEC_EXECUTABLE=$to/usr/bin/mpirun.openmpi -DCBLAS_INCLUDE_DIR=$to/usr/include/x86_64-linux-gnu/openblas-pthread -DBLAS_LIBRARIES=$lib/openblas-pthread/libopenblas.so -DHPCTRAIN_TEST_FASHION_MNIST_DIR=$(cd "$dir" && pwd)/fashion-mnist"
EOS
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  check) shift; check "$@" ;;
  files) pack_files ;;
  env) shift; env_lines "$@" ;;
  -h | --help | "") sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; [[ -n "${1:-}" ]] ;;
  *) die "unknown command '$1' (pack, check, files or env; try --help)" ;;
esac
