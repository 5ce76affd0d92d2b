#!/usr/bin/env bash
# Sets up a Debian 12 machine for hpctrain (or Ubuntu 22.04, the AWS compute nodes' Deep Learning
# AMI): installs the packages the build and the tests need, then configures and builds (Release)
# into build/.
#
#   ./setup.sh            packages for building and testing, then the build
#   ./setup.sh --bench    also python3-torch where it is not installed by default (Debian 12 has
#                         it for torch_parity_test), for bench/cpu_vs_peer.sh
#
# Environment: BUILD_DIR (default build, relative to the repository root unless absolute),
# JOBS (parallel build jobs, default: every core), CMAKE_ARGS (more configure options, split on
# spaces, e.g. "-DHPCTRAIN_CUDA=ON -DHPCTRAIN_NATIVE=OFF").
# Idempotent: apt runs only when a package is missing, and CMake rebuilds only what changed.
set -euo pipefail

usage() { sed -n '2,13s/^# \{0,1\}//p' "$0"; }

bench=0
for arg in "$@"; do
  case "$arg" in
    --bench) bench=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "setup.sh: error: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

# The distributions whose package names and versions this list was written for; others may work.
if [[ -r /etc/os-release ]]; then
  # shellcheck source=/dev/null
  os=$(. /etc/os-release && echo "${ID:-?} ${VERSION_ID:-?}")
  case "$os" in
    "debian 12" | "ubuntu 22.04") ;;
    *) echo "setup.sh: warning: $os is neither Debian 12 nor Ubuntu 22.04; trying anyway" >&2 ;;
  esac
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build_dir=${BUILD_DIR:-build}
[[ "$build_dir" == /* ]] || build_dir="$root/$build_dir"

packages=(
  cmake g++ make pkg-config                    # toolchain
  libopenmpi-dev openmpi-bin                   # data-parallel runs over MPI
  iproute2                                     # hpcrun's tests: hosts as network namespaces
  openssh-client openssh-server                # hpcrun's launch agent; an sshd per test host
  e2fsprogs util-linux mount                   # a file system on a loop device, frozen (tests/integration/hung_storage.sh)
  strace                                       # the dataset tests hold a syscall to stop a command in its middle
  slurm-wlm munge procps                       # slurm/local-cluster.sh and the Slurm tests
  libboost-program-options-dev                 # command line and config files
  nlohmann-json3-dev                           # JSON, written and read (hpcrun's summary.json, predict, export, ...)
  libdnnl-dev libopenblas-dev                  # CPU GEMM backends (oneDNN default, OpenBLAS)
  zlib1g-dev                                   # the tests' gzip-compressed dataset files
  libisal-dev                                  # ISA-L: CRC-32 of checkpoints and snapshots, gunzip of datasets
  libturbojpeg0-dev                            # JPEG images in packed shards (hpcdata pack)
  libpng-dev                                   # PNG images for hpctrain predict
  libonnx-dev libprotobuf-dev                  # hpctrain export: ONNX (libonnx-dev omits protobuf's headers)
  libgtest-dev googletest                      # the test suite
  python3-onnx python3-opencv python3-numpy    # the serving tests: onnx.checker and OpenCV DNN check exports
  dataset-fashion-mnist                        # the default job's data
  python3-matplotlib                           # hpctrain-plot: charts of the metrics files
  python3-jsonschema                           # the Chrome trace of --timeline-file checked against its schema
  help2man                                     # man pages from --help, made at build time
  dpkg-dev file man-db                         # cpack -G DEB (dpkg-shlibdeps, file) and man: the package test
  lintian                                      # the package test lints every .deb cpack makes
  bsdutils                                     # script: the test of the live progress line in a terminal
  prometheus                                   # promtool: the test of --prometheus-file's format
  systemd nftables                             # the AWS nodes' metadata firewall: systemd-analyze verify, nft
  gpg                                          # the AWS nodes check the CloudWatch agent package's signature: its test signs one
)

# torch_parity_test checks the CPU maths against PyTorch: Debian 12's python3-torch (1.13) is the
# one it needs (Ubuntu 22.04's 1.8 has no label smoothing), and bench/cpu_vs_peer.sh's peer.
if [[ "${os:-}" == "debian 12" ]] || ((bench)); then
  packages+=(python3-torch)
fi

# Root runs apt directly; anyone else goes through sudo when there is one.
as_root=()
if ((EUID != 0)); then
  if command -v sudo > /dev/null; then
    as_root=(sudo)
  else
    echo "setup.sh: error: installing packages needs root, and sudo is not available; run as root" >&2
    exit 2
  fi
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2> /dev/null || true)
  [[ "$status" == "ii"* ]] || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${packages[@]}" > /dev/null
else
  echo "setup.sh: all ${#packages[@]} packages are installed"
fi

# Configure and build; the full log goes to a file, and only its tail to the screen on failure.
mkdir -p "$build_dir"
log="$build_dir/setup.log"
jobs=${JOBS:-$(nproc)}
echo "setup.sh: building hpctrain (Release) in $build_dir with $jobs job(s); log in $log"
read -r -a cmake_args <<< "${CMAKE_ARGS:-}"
if ! { cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" &&
  cmake --build "$build_dir" --parallel "$jobs"; } > "$log" 2>&1; then
  tail -n 60 "$log" >&2
  echo "setup.sh: error: the build failed; the full log is $log" >&2
  exit 1
fi
grep -E '^-- hpctrain:' "$log" | sed 's/^-- /setup.sh: /' || true
echo "setup.sh: done: $build_dir/src/hpctrain"
