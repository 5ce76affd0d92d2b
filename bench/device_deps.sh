#!/usr/bin/env bash
# Build dependencies for a GPU machine that has CUDA but neither the Debian packages hpctrain
# builds against nor a network (the device machines lent to development sessions).
#
#   bench/device_deps.sh pack [DIR]   here, where apt works: downloads the packages (Open MPI,
#       Boost.Program_options, oneDNN, OpenBLAS, GoogleTest, zlib, nlohmann-json and their libraries), unpacks
#       them, drops what no build reads, and leaves DIR/deps.tar.xz (about 29 MB), the
#       Fashion-MNIST .gz files (DIR/fashion-mnist) and the GPU peer script (DIR/torch_peer_gpu.py).
#       DIR defaults to .device, which this adds to .git/info/exclude; carry it to the machine.
#   bench/device_deps.sh env DIR      there: unpacks DIR/deps.tar.xz into /tmp/hpctrain-deps
#       (once) and prints the export lines that make CMake, the compiler, the loader and
#       Open MPI use it:  eval "$(bench/device_deps.sh env .device)"
#
# bench/gpu_vs_peer.sh calls `env` itself when DEPS names such a folder.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

packages=(
  libopenmpi-dev openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 libhwloc-plugins libevent-2.1-7
  libevent-pthreads-2.1-7 libfabric1 libucx0 libpsm2-2 libpsm-infinipath1 libibverbs1 librdmacm1 libnl-3-200
  libnl-route-3-200 libmunge2 libxnvctrl0
  libboost1.74-dev libboost-program-options1.74-dev libboost-program-options1.74.0
  libdnnl-dev libdnnl2 libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread
  libgtest-dev zlib1g-dev zlib1g nlohmann-json3-dev
)

pack() {
  local dir=${1:-.device}
  [[ "$dir" == /* ]] || dir="$root/$dir"
  command -v apt-get > /dev/null || die "pack needs apt-get (run it on a Debian machine with a network)"
  local fm=/usr/share/datasets/fashion-mnist
  [[ -f $fm/train-images-idx3-ubyte.gz ]] || die "no Fashion-MNIST in $fm (apt-get install dataset-fashion-mnist)"
  local peer=$root/../shared/bench/torch_peer_gpu.py
  [[ -f $peer ]] || die "no GPU peer script at $peer"
  local work
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  mkdir -p "$work/debs" "$work/root" "$dir"
  (cd "$work/debs" && apt-get download "${packages[@]}" > /dev/null 2>&1) || die "apt-get download failed (apt-get update first?)"
  for f in "$work"/debs/*.deb; do dpkg -x "$f" "$work/root"; done
  # Static libraries are not linked (GoogleTest's are, since Debian ships it only static).
  find "$work/root" -name '*.a' ! -name 'libgtest*' ! -name 'libgmock*' -delete
  rm -rf "$work/root/usr/share/doc" "$work/root/usr/share/man" "$work/root/usr/share/lintian"
  tar -C "$work/root" -cJf "$dir/deps.tar.xz" .
  mkdir -p "$dir/fashion-mnist"
  cp "$fm"/*.gz "$dir/fashion-mnist/"
  cp "$peer" "$dir/"
  local rel=${dir#"$root"/}
  if [[ "$rel" != /* && -d "$root/.git" ]] && ! grep -qx "/$rel/" "$root/.git/info/exclude" 2> /dev/null; then
    mkdir -p "$root/.git/info"
    echo "/$rel/" >> "$root/.git/info/exclude"
  fi
  echo "packed $(du -sh "$dir" | cut -f1) into $dir: carry '$rel' (run's carry), then eval \"\$(bench/device_deps.sh env $rel)\""
}

env_lines() {
  local dir=${1:?env needs the folder pack made}
  [[ -f "$dir/deps.tar.xz" ]] || die "no $dir/deps.tar.xz (run bench/device_deps.sh pack first, and carry it)"
  local to=/tmp/hpctrain-deps
  if [[ ! -f $to/.unpacked ]]; then
    mkdir -p "$to"
    tar -C "$to" -xJf "$dir/deps.tar.xz"
    # Some -dev links are absolute (libz.so -> /lib/.../libz.so.1.2.13): point them into the copy.
    local link target
    while IFS= read -r link; do
      target=$(readlink "$link")
      [[ -e "$to$target" ]] && ln -sfn "$to$target" "$link"
    done < <(find "$to" -type l -lname '/*')
    touch "$to/.unpacked"
  fi
  local lib=$to/usr/lib/x86_64-linux-gnu
  # Debian points mpicc, mpirun and libblas through update-alternatives links that unpacking
  # does not make; the programs are named directly instead. OPAL_PREFIX relocates Open MPI.
  cat << EOS
export HPCTRAIN_DEPS=$to
export OPAL_PREFIX=$to/usr
export PATH=$to/usr/bin:\$PATH
export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread:$lib/openmpi/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export CMAKE_PREFIX_PATH=$to/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}
export HPCTRAIN_DEPS_CMAKE_ARGS="-DMPI_C_COMPILER=$to/usr/bin/mpicc.openmpi -DMPIEXEC_EXECUTABLE=$to/usr/bin/mpirun.openmpi -DCBLAS_INCLUDE_DIR=$to/usr/include/x86_64-linux-gnu/openblas-pthread -DBLAS_LIBRARIES=$lib/openblas-pthread/libopenblas.so -DHPCTRAIN_TEST_FASHION_MNIST_DIR=$(cd "$dir" && pwd)/fashion-mnist"
EOS
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  env) shift; env_lines "$@" ;;
  -h | --help | "") sed -n '2,16s/^# \{0,1\}//p' "$0"; [[ -n "${1:-}" ]] ;;
  *) die "unknown command '$1' (pack or env; try --help)" ;;
esac
