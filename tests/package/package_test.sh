#!/usr/bin/env bash
# The Debian packages, as users get them: cpack -G DEB from the built tree (no rebuild), then
#  - each package's control fields, files, copyright, changelog, stripped binaries, -dbgsym and
#    library search paths; lintian on every .deb (an error or warning without an override fails);
#  - hpctrain installed by dpkg into a fresh root holding only Debian packages (this host's, copied:
#    the Depends and Pre-Depends of hpctrain and of dataset-fashion-mnist, and the Essential set,
#    as on any Debian host; no CUDA), and run there: --version, 20 steps of the default job,
#    hpcrun --help, hpcdata by its full path, hpctrain-plot without its Recommended matplotlib;
#    every library of /usr/bin/hpctrain resolved there;
#  - hpctrain-cuda (builds that train on GPUs) refused by dpkg in that root, naming the NVIDIA
#    package it lacks (the first package installed anywhere and died with exit 127 without CUDA);
#  - a CMake project outside the tree that finds hpctrain-dev's package and links the library.
# Environment: BUILD_DIR (the configured and built tree), GPU_TRAINING (ON or OFF: hpctrain-cuda is made).
# Needs root and unshare (a mount namespace for the root's /proc, /dev, /sys); skips (77) without.
set -euo pipefail
: "${BUILD_DIR:?}" "${GPU_TRAINING:?}"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fail() { echo "package_test: FAIL: $*" >&2; exit 1; }
is_elf() { [[ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" == '177ELF' ]]; }
skip() { echo "package_test: SKIP: $*"; exit 77; }
((EUID == 0)) || skip "needs root (dpkg --root, chroot and mount)"
unshare --mount --fork true 2> /dev/null || skip "unshare --mount is not permitted here (a container without CAP_SYS_ADMIN?)"
command -v lintian > /dev/null || fail "lintian is not installed (./setup.sh installs it)"
# On /var/tmp: the fresh root is made of hard links to this host's files where it shares /usr's file system.
tmp=$(mktemp -d /var/tmp/hpctrain-package-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
SECONDS=0

# ---- The packages -------------------------------------------------------------------------
(cd "$tmp" && cpack -G DEB --config "$BUILD_DIR/CPackConfig.cmake" -B "$tmp/pkg" > "$tmp/cpack.log" 2>&1) ||
  { cat "$tmp/cpack.log" >&2; fail "cpack -G DEB failed"; }
expected="hpctrain hpctrain-dev"
[[ "$GPU_TRAINING" == ON ]] && expected="hpctrain hpctrain-cuda hpctrain-dev"
made=$(cd "$tmp/pkg" && ls -- *.deb | sed 's/_.*//' | sort | xargs)
[[ "$made" == "$(xargs -n1 <<< "$expected" | sort | xargs)" ]] || fail "cpack made the packages '$made', not '$expected'"
deb() { echo "$tmp"/pkg/"$1"_*.deb; }
# lintian, meanwhile (the slowest part; its verdict is read at the end): every tag it reports as
# an error or warning is fixed or overridden with a reason (cmake/debian/lintian/<package>). The
# .ddebs, CPack's own, are checked below.
lintian --fail-on error,warning --tag-display-limit 0 "$tmp"/pkg/*.deb > "$tmp/lintian.log" 2>&1 &
lintian_pid=$!
trap 'status=$?; kill "$lintian_pid" 2> /dev/null || true; wait || true; rm -rf "$tmp"; exit "$status"' EXIT
field() { dpkg-deb --field "$(deb "$1")" "$2"; }
version=$(field hpctrain Version)  # Debian's: the project's version and a revision (0.1.0-1)
upstream=${version%-*}
mkdir -p "$tmp/x"
for p in $expected; do
  dpkg-deb -x "$(deb "$p")" "$tmp/x/$p"
done

# hpctrain: Debian's packages only. Its programs' libraries all come from packages it depends on
# (dpkg-shlibdeps names them; a library of no package, such as CUDA's, would be dropped silently).
depends=$(field hpctrain Depends)
for d in openmpi-bin python3 libboost-program-options; do
  grep -q "$d" <<< "$depends" || fail "hpctrain's Depends lacks $d: $depends"
done
! grep -qiE 'cuda|cublas|cudnn|nccl' <<< "$depends" || fail "hpctrain depends on CUDA: $depends"
for f in "$tmp"/x/hpctrain/usr/bin/*; do
  is_elf "$f" || continue
  for lib in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p'); do
    [[ "$lib" != *cuda* && "$lib" != *cublas* && "$lib" != *cudnn* && "$lib" != *nccl* ]] ||
      fail "hpctrain's $(basename "$f") needs $lib (CUDA) "
  done
done

# hpctrain-cuda: every library its programs need that no Debian package holds is named in Depends
# by NVIDIA's package (NVIDIA's apt repository: libcudart.so.13 of CUDA 13.0 in cuda-cudart-13-0),
# which dpkg-shlibdeps cannot do for a toolkit installed from NVIDIA's .run file.
if [[ "$GPU_TRAINING" == ON ]]; then
  depends=$(field hpctrain-cuda Depends)
  cuda_major=$(readelf -d "$tmp/x/hpctrain-cuda/usr/bin/hpctrain" | sed -n 's/.*\[libcudart\.so\.\([0-9]*\)\]$/\1/p')
  # The libraries no Debian package holds: those the loader finds under /usr/local here (Debian's
  # packages never install there), i.e. the CUDA toolkit's; none may be missing at all.
  needed=$(for f in "$tmp"/x/hpctrain-cuda/usr/bin/*; do
    if is_elf "$f"; then ldd "$f"; fi
  done | sort -u)
  ! grep 'not found' <<< "$needed" || fail "hpctrain-cuda's programs need libraries this host lacks"
  outside=$(sed -n 's|^\s*\(\S*\) => /usr/local/.*|\1|p' <<< "$needed")
  grep -q '^libcudart\.so\.' <<< "$outside" || fail "hpctrain-cuda's hpctrain needs no CUDA runtime from /usr/local: $needed"
  for lib in $outside; do
    case "$lib" in
      libcudart.so.*) want="cuda-cudart-${lib#libcudart.so.}-[0-9]+" ;;
      libcublas.so.* | libcublasLt.so.*) want="libcublas-${lib##*.so.}-[0-9]+" ;;
      libcudnn.so.*) want="libcudnn${lib#libcudnn.so.}-cuda-$cuda_major" ;;
      libnccl.so.*) want="libnccl${lib#libnccl.so.}" ;;
      *) fail "hpctrain-cuda needs $lib, of no Debian package, and no rule here names NVIDIA's package of it" ;;
    esac
    grep -qE "(^|, )$want(,|$| )" <<< "$depends" || fail "hpctrain-cuda needs $lib, but its Depends names no $want: $depends"
  done
  # cuBLAS is loaded at run time (src/core/cublas.hpp), so no DT_NEEDED names it: its package must
  # be in Depends all the same.
  grep -qE "(^|, )libcublas-$cuda_major-[0-9]+(,|$| )" <<< "$depends" ||
    fail "hpctrain-cuda loads libcublas.so.$cuda_major at run time, but its Depends names no libcublas-$cuda_major-N: $depends"
  for f in Provides Conflicts Replaces; do
    [[ "$(field hpctrain-cuda $f)" == hpctrain* ]] || fail "hpctrain-cuda has no '$f: hpctrain'"
  done
  cmp -s "$tmp/x/hpctrain/usr/bin/hpcrun" "$tmp/x/hpctrain-cuda/usr/bin/hpcrun" ||
    fail "hpctrain-cuda's hpcrun is not hpctrain's"
  ! cmp -s "$tmp/x/hpctrain/usr/bin/hpctrain" "$tmp/x/hpctrain-cuda/usr/bin/hpctrain" ||
    fail "hpctrain-cuda's hpctrain is hpctrain's (no CUDA)"
fi
depends=$(field hpctrain-dev Depends)
grep -q "hpctrain (= $version) | hpctrain-cuda (= $version)" <<< "$depends" || fail "hpctrain-dev does not depend on a runtime package: $depends"
grep -q 'libboost-program-options-dev' <<< "$depends" || fail "hpctrain-dev's Depends lacks the -dev packages: $depends"
# The exported targets name what the package depends on by name, never the build machine's paths
# (its CUDA toolkit's /usr/local/cuda/lib/libcudnn.so, which NVIDIA's apt packages do not have).
machine_paths=$(grep -hoE '/usr/local/cuda[^;" ]*|'"$BUILD_DIR"'[^;" ]*' "$tmp"/x/hpctrain-dev/usr/lib/cmake/hpctrain/*.cmake |
  sort -u | xargs) || true
[[ -z "$machine_paths" ]] || fail "hpctrain-dev's CMake targets name paths of the build machine: $machine_paths"

# The files: programs, scripts, docs and man pages in the runtime packages; headers, archives and
# the CMake package in hpctrain-dev only; Debian's copyright and changelog in every package.
for p in $expected; do
  usr=$tmp/x/$p/usr
  if [[ "$p" == hpctrain-dev ]]; then
    files="include/hpctrain/core/duration.hpp lib/cmake/hpctrain/hpctrainConfig.cmake"
  else
    files="bin/hpctrain bin/hpcrun bin/hpcdata bin/hpcdata-pack bin/hpctrain-plot share/hpctrain/slurm/train.sbatch
           share/hpctrain/slurm/job.sh share/hpctrain/datasets/hpcdata share/doc/hpctrain/README.md share/doc/hpctrain/slurm.md
           share/man/man1/hpctrain.1.gz share/man/man1/hpcrun.1.gz share/man/man1/hpcdata.1.gz
           share/man/man1/hpcdata-pack.1.gz share/man/man1/hpctrain-plot.1.gz"
    [[ -z "$(find "$usr" -name '*.a' -o -name '*.hpp' -o -name '*.cmake')" ]] || fail "$p holds development files"
    [[ -x "$usr/bin/hpctrain" && -x "$usr/share/hpctrain/slurm/train.sbatch" ]] || fail "$p's programs are not executable"
  fi
  for f in $files share/doc/$p/copyright share/doc/$p/changelog.Debian.gz; do
    [[ -e "$usr/$f" ]] || fail "$p has no /usr/$f"
  done
  # The installed docs' own links lead to files installed beside them (the source tree's
  # slurm/README.md is slurm.md there; bench/ is not installed).
  for md in "$usr"/share/doc/*/*.md; do
    while IFS= read -r target; do
      [[ -z "$target" || "$target" == *://* || -e "$(dirname "$md")/$target" ]] ||
        fail "$p's ${md#"$usr"} links to $target, which is not installed beside it"
    done < <(grep -o '\]([^)]*)' "$md" | sed 's/^](//; s/)$//; s/#.*//')
  done
  grep -q '^Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/$' "$usr/share/doc/$p/copyright" ||
    fail "$p's copyright is not machine-readable (DEP-5)"
  # gzip -9n: no name, no time stamp (bytes 4-7 zero), so the same bytes on every build.
  [[ "$(od -An -tx1 -j3 -N5 "$usr/share/doc/$p/changelog.Debian.gz" | tr -d ' ')" == 0000000000 ]] ||
    fail "$p's changelog.Debian.gz holds a name or time (gzip -n)"
  top=$(zcat "$usr/share/doc/$p/changelog.Debian.gz" | head -1)
  [[ "$top" == "hpctrain ($version) "* ]] || fail "$p's changelog begins '$top', not with version $version (cmake/debian/changelog)"
  if [[ "$p" != hpctrain-dev ]]; then
    bash "$here/runpath.sh" "$tmp/x/$p" > /dev/null || fail "a binary of $p searches an empty or relative library path"
  fi
done

# Stripped binaries; their symbols in the -dbgsym package, by build ID.
for p in $expected; do
  [[ "$p" == hpctrain-dev ]] && continue
  for f in "$tmp"/x/"$p"/usr/bin/*; do
    is_elf "$f" || continue
    ! readelf -S "$f" | grep -qE '\.symtab|\.debug_' || fail "$p's $(basename "$f") is not stripped"
  done
  ddeb=("$tmp"/pkg/"$p"-dbgsym_*.ddeb)
  [[ -f "${ddeb[0]}" ]] || fail "no $p-dbgsym package: $(ls "$tmp/pkg")"
  dpkg-deb -x "${ddeb[0]}" "$tmp/x/$p-dbgsym"
  for f in "$tmp"/x/"$p"/usr/bin/*; do
    is_elf "$f" || continue
    id=$(readelf -n "$f" | sed -n 's/.*Build ID: \([0-9a-f]*\)$/\1/p')
    [[ -n "$id" ]] || fail "$p's $(basename "$f") has no build ID"
    [[ -f "$tmp/x/$p-dbgsym/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug" ]] ||
      fail "$p-dbgsym lacks the symbols of $(basename "$f") (build ID $id)"
  done
done

echo "package_test: packages checked (${SECONDS}s)"

# A command in the root: its own mount namespace, the host's /dev, /proc and /sys, a fresh /tmp
# and /dev/shm, and an environment of its own (no CUDA library path of this host's).
in_root() {
  unshare --mount --fork -- bash -c '
    r=$1; shift
    mount --rbind /dev "$r/dev" && mount -t tmpfs tmpfs "$r/dev/shm" && mount -t proc proc "$r/proc" &&
      mount --rbind /sys "$r/sys" && mount -t tmpfs tmpfs "$r/tmp" || exit 125
    exec chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$@"' in_root "$root" "$@"
}

# ---- A fresh root with Debian's packages only, and hpctrain installed there by dpkg -----------
root=$tmp/root
mkdir -p "$root"/{dev,proc,sys,tmp,work,var/lib/dpkg/info,var/lib/dpkg/updates,var/lib/dpkg/triggers,etc}
for d in bin sbin lib lib32 lib64 libx32; do  # merged /usr, as this host (Debian 12) has it
  if [[ -L /$d ]]; then
    target=$(readlink "/$d")
    [[ "$target" == /* ]] && mkdir -p "$root$target" || mkdir -p "$root/$target"
    ln -s "$target" "$root/$d"
  fi
done
# Every installed package of this host: name, Essential, Provides, Pre-Depends and Depends.
declare -A installed=() provider=() deps=() want=()
while IFS=$'\x1f' read -r name status essential provides predeps depends; do  # \x1f: empty fields kept
  [[ "$status" == ii* ]] || continue
  installed[$name]=1
  deps[$name]="$predeps, $depends"
  [[ "$essential" == yes ]] && want[$name]=1
  IFS=, read -r -a ps <<< "$provides"
  for v in "${ps[@]}"; do
    v=${v# }; v=${v%% *}
    [[ -n "$v" && -z "${provider[$v]:-}" ]] && provider[$v]=$name
  done
done < <(dpkg-query -W -f $'${Package}\x1f${db:Status-Abbrev}\x1f${Essential}\x1f${Provides}\x1f${Pre-Depends}\x1f${Depends}\n')
# An alternative of a dependency ("a | b (>= 1)") as the first installed package, or its provider,
# in $picked (no subshell: this runs for every dependency of every package).
pick() {
  local alt name
  IFS='|' read -r -a alts <<< "$1"
  for alt in "${alts[@]}"; do
    name=${alt#"${alt%%[! ]*}"}  # leading spaces off, then the version and architecture
    name=${name%%[ (]*}
    name=${name%:any}
    if [[ -n "${installed[$name]:-}" ]]; then picked=$name; return; fi
    if [[ -n "${provider[$name]:-}" ]]; then picked=${provider[$name]}; return; fi
  done
  return 1
}
# queue_deps OWNER FIELDS: the installed package that satisfies each of FIELDS' comma-separated
# dependencies (OWNER's), onto the queue.
queue_deps() {
  local g groups
  IFS=, read -r -a groups <<< "$2"
  for g in "${groups[@]}"; do
    [[ -n "${g// /}" ]] || continue
    pick "$g" || fail "$1 depends on '$g', which this host has not installed"
    queue+=("$picked")
  done
}
# The closure of hpctrain's Depends and Pre-Depends (its own fields, from the .deb).
queue=(dataset-fashion-mnist)
queue_deps hpctrain "$(field hpctrain Pre-Depends), $(field hpctrain Depends)"
queue+=("${!want[@]}")
want=()
while ((${#queue[@]})); do
  name=${queue[0]}
  queue=("${queue[@]:1}")
  [[ -n "${want[$name]:-}" ]] && continue
  want[$name]=1
  queue_deps "$name" "${deps[$name]}"
done
packages=("${!want[@]}")
# Their files (hard links; directories made, not linked), dpkg's record of them, and the
# alternatives their maintainer scripts made (e.g. libblas.so.3), as a real installation has.
# Python sorts the ~20000 paths into directories and the rest (a shell loop takes a minute).
dpkg-query -L "${packages[@]}" | python3 -c '
import os, sys
root = sys.argv[1]
with open(sys.argv[2], "w") as dirs, open(sys.argv[3], "w") as files:
    for path in sys.stdin.read().splitlines():
        if not path.startswith("/") or path == "/.":
            continue  # dpkg-query notes ("diverted by ...")
        if os.path.isdir(path) and not os.path.islink(path):
            dirs.write(root + path + "\0")
        elif os.path.lexists(path):
            files.write(path + "\0")
' "$root" "$tmp/dirs" "$tmp/files"
xargs -0 -r mkdir -p < "$tmp/dirs"
link=-l  # hard links where the root shares this host's file system, else copies
[[ "$(stat -c %d /usr)" == "$(stat -c %d "$tmp")" ]] || link=
xargs -0 -r cp -a $link --parents -t "$root" < "$tmp/files" 2> "$tmp/cp.err" ||
  { cat "$tmp/cp.err" >&2; fail "copying the packages' files failed"; }
dpkg-query -s "${packages[@]}" > "$root/var/lib/dpkg/status"
for p in "${packages[@]}"; do
  for l in /var/lib/dpkg/info/"$p".list /var/lib/dpkg/info/"$p":*.list; do
    [[ -f "$l" ]] && cp "$l" "$root/var/lib/dpkg/info/"
  done
done
: > "$root/var/lib/dpkg/available"
# The alternatives (this host's choices) whose chosen file is in the root: /etc/alternatives/NAME
# and the link to it, for the master and each slave.
python3 -c '
import os, sys
root = sys.argv[1]
for name in os.listdir("/var/lib/dpkg/alternatives"):
    lines = open(os.path.join("/var/lib/dpkg/alternatives", name)).read().split("\n")
    links = [(name, lines[1])]
    i = 2
    while i + 1 < len(lines) and lines[i]:
        links.append((lines[i], lines[i + 1]))
        i += 2
    for alt, link in links:
        chosen = os.path.join("/etc/alternatives", alt)
        if not os.path.islink(chosen) or not os.path.lexists(root + os.readlink(chosen)):
            continue
        for path, target in ((chosen, os.readlink(chosen)), (link, chosen)):
            os.makedirs(os.path.dirname(root + path), exist_ok=True)
            if not os.path.lexists(root + path):
                os.symlink(target, root + path)
' "$root"
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$root/etc/passwd"  # as a fresh Debian system has them
printf 'root:x:0:\n' > "$root/etc/group"
mkdir -p "$root/root"
in_root ldconfig || fail "ldconfig failed in the fresh root"  # as libc-bin's trigger does on a real host
compgen -G "$root/usr/local/cuda*" > /dev/null && fail "the fresh root holds $(ls -d "$root"/usr/local/cuda*)"
echo "package_test: fresh root of ${#packages[@]} packages (${SECONDS}s)"

cp "$(deb hpctrain)" "$root/work/"
in_root dpkg -i "/work/$(basename "$(deb hpctrain)")" > "$tmp/dpkg.log" 2>&1 ||
  { cat "$tmp/dpkg.log" >&2; fail "dpkg -i hpctrain in the fresh root failed"; }
[[ "$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f '${db:Status-Abbrev}' hpctrain)" == "ii " ]] ||
  fail "hpctrain is not installed in the fresh root: $(cat "$tmp/dpkg.log")"
in_root ldd /usr/bin/hpctrain > "$tmp/ldd.log" 2>&1 || { cat "$tmp/ldd.log" >&2; fail "ldd /usr/bin/hpctrain failed in the root"; }
! grep -q 'not found' "$tmp/ldd.log" || fail "libraries of /usr/bin/hpctrain not found in the root: $(grep 'not found' "$tmp/ldd.log")"
for f in hpcrun hpcdata-pack; do
  ! in_root ldd "/usr/bin/$f" | grep 'not found' || fail "libraries of /usr/bin/$f not found in the root"
done

said=$(in_root hpctrain --version 2>&1) || fail "hpctrain --version failed in the root ($?): $said"
[[ "$said" == "hpctrain $upstream "* ]] || fail "hpctrain --version said '$said'"
# The default job (its model and Debian's Fashion-MNIST, from dataset-fashion-mnist), 20 steps.
in_root hpctrain --max-steps 20 --threads 1 --test-samples 100 --quiet --metrics-file /work/m.jsonl > "$tmp/train.log" 2>&1 ||
  { cat "$tmp/train.log" >&2; fail "the installed hpctrain cannot train in the root"; }
grep -q '"event":"done"' "$root/work/m.jsonl" || fail "no done line from the installed hpctrain"
grep -q '"step":20' "$root/work/m.jsonl" || fail "the installed hpctrain did not reach step 20"
in_root hpcrun --help > "$tmp/hpcrun.log" 2>&1 || { cat "$tmp/hpcrun.log" >&2; fail "hpcrun --help failed in the root"; }
grep -q -- '--hosts' "$tmp/hpcrun.log" || fail "hpcrun --help said: $(head -3 "$tmp/hpcrun.log")"
# hpcdata by its full path, with nothing on PATH: it finds its hpcdata-pack by where it is installed.
for script in /usr/bin/hpcdata /usr/share/hpctrain/datasets/hpcdata; do
  said=$(in_root env PATH=/nonexistent "$script" --version 2>&1) || fail "$script --version failed in the root: $said"
  [[ "$said" == "hpcdata $upstream" ]] || fail "$script --version said '$said'"
  in_root env PATH=/nonexistent "$script" pack --help 2>&1 | grep -q -- '--images-per-shard' ||
    fail "$script does not find its hpcdata-pack without PATH"
done
said=$(in_root hpctrain-plot --version 2>&1) || fail "hpctrain-plot --version failed in the root: $said"
[[ "$said" == "hpctrain-plot $upstream" ]] || fail "hpctrain-plot --version said '$said'"
# hpctrain-plot where python3-matplotlib, only Recommended, is not installed (apt-get install
# --no-install-recommends, as this root): one line naming the package, exit 1, nothing made.
! compgen -G "$root/usr/lib/python3/dist-packages/matplotlib" > /dev/null || fail "the fresh root holds matplotlib"
said=$(in_root hpctrain-plot /work/m.jsonl --out /work/charts 2>&1) && code=0 || code=$?
[[ "$code" == 1 && "$said" == "hpctrain-plot: error: cannot draw charts without matplotlib ("*"): apt-get install python3-matplotlib" ]] ||
  fail "hpctrain-plot without matplotlib exited $code and said: $said"
[[ ! -e "$root/work/charts" ]] || fail "hpctrain-plot without matplotlib made its --out"
echo "package_test: hpctrain installed and run in the root (${SECONDS}s)"

# hpctrain-cuda there: dpkg refuses to configure it for want of NVIDIA's packages (apt would not
# even unpack it), rather than leave a program that dies with exit 127.
if [[ "$GPU_TRAINING" == ON ]]; then
  cp "$(deb hpctrain-cuda)" "$root/work/"
  if in_root dpkg -i "/work/$(basename "$(deb hpctrain-cuda)")" > "$tmp/dpkg-cuda.log" 2>&1; then
    fail "dpkg installed hpctrain-cuda on a host without CUDA: $(cat "$tmp/dpkg-cuda.log")"
  fi
  grep -qE 'depends on cuda-cudart-[0-9]+-[0-9]+; however:' "$tmp/dpkg-cuda.log" &&
    grep -qE "Package cuda-cudart-[0-9]+-[0-9]+ is not installed" "$tmp/dpkg-cuda.log" ||
    fail "dpkg did not refuse hpctrain-cuda for want of NVIDIA's CUDA runtime: $(cat "$tmp/dpkg-cuda.log")"
  [[ "$(dpkg-query --admindir="$root/var/lib/dpkg" -W -f '${db:Status-Abbrev}' hpctrain-cuda)" != "ii " ]] ||
    fail "hpctrain-cuda is configured in the root"
fi

# ---- hpctrain-dev: man pages, and a project outside the tree linking the library --------------
usr=$tmp/x/hpctrain/usr
page=$(MANWIDTH=100 man -P cat -l "$usr/share/man/man1/hpctrain.1.gz" 2> "$tmp/man.err") ||
  fail "man cannot render hpctrain.1: $(cat "$tmp/man.err")"
grep -q -- '--checkpoint-dir' <<< "$page" || fail "the man page lacks the options: $page"
# The sections a Debian user looks for, every subcommand's options, and nothing of the machine
# that built it (--version's text names its GPUs).
for section in NAME SYNOPSIS 'EXIT STATUS' SIGNALS ENVIRONMENT FILES EXAMPLES COMMANDS 'SEE ALSO'; do
  grep -q "^$section\$" <<< "$page" || fail "the man page has no $section section"
done
for command in evaluate inspect export predict clean-snapshots persist-snapshot; do
  grep -q "Usage: hpctrain $command" <<< "$page" || fail "the man page lacks hpctrain $command's options"
done
! grep -qi 'GPU(s) visible\|CUDA runtime' <<< "$page" || fail "the man page holds the build machine's GPUs"
page=$(MANWIDTH=100 man -P cat -l "$usr/share/man/man1/hpcrun.1.gz" 2> "$tmp/man.err") ||
  fail "man cannot render hpcrun.1: $(cat "$tmp/man.err")"
for section in 'EXIT STATUS' SIGNALS ENVIRONMENT FILES EXAMPLES; do
  grep -q "^$section\$" <<< "$page" || fail "hpcrun's man page has no $section section"
done
# hpcdata's forms in its SYNOPSIS, each on a line of its own (help2man reads them from --help's
# "Usage: ..." and "  or:  ..." lines; argparse's "usage:" block ran them into one paragraph).
page=$(MANWIDTH=200 man -P cat -l "$usr/share/man/man1/hpcdata.1.gz" 2> "$tmp/man.err") ||
  fail "man cannot render hpcdata.1: $(cat "$tmp/man.err")"
synopsis=$(sed -n '/^SYNOPSIS$/,/^DESCRIPTION$/p' <<< "$page")
forms=$(grep -cE '^ +hpcdata ' <<< "$synopsis" || true)
[[ "$forms" == 4 ]] || fail "hpcdata's man page has $forms lines beginning 'hpcdata' in its SYNOPSIS, not 4: $synopsis"
for form in 'prepare fashion-mnist' 'pack SRC OUT' 'stage s3://' '--version$'; do
  grep -qE -- "^ +hpcdata $form" <<< "$synopsis" || fail "hpcdata's SYNOPSIS has no line 'hpcdata $form': $synopsis"
done

mkdir -p "$tmp/app"
cat > "$tmp/app/CMakeLists.txt" << 'CMAKE'
cmake_minimum_required(VERSION 3.22)
project(app LANGUAGES CXX)  # as README's: the package enables the C that FindMPI needs
find_package(hpctrain 0.1 REQUIRED)
add_executable(app app.cpp)
target_link_libraries(app PRIVATE hpctrain::hpctrain_lib)
CMAKE
cat > "$tmp/app/app.cpp" << 'CPP'
#include <cstdio>
#include "core/duration.hpp"
int main() { std::printf("%g %s\n", hpc::parse_duration("1.5h", "--t"), HPCTRAIN_VERSION); }
CPP
dev=$tmp/x/hpctrain-dev/usr
cmake -S "$tmp/app" -B "$tmp/app/build" -DCMAKE_PREFIX_PATH="$dev" > "$tmp/app.log" 2>&1 ||
  { cat "$tmp/app.log" >&2; fail "find_package(hpctrain) failed"; }
grep -q "hpctrain_DIR:PATH=$dev/lib/cmake/hpctrain" "$tmp/app/build/CMakeCache.txt" ||
  fail "find_package found another hpctrain than hpctrain-dev's"
cmake --build "$tmp/app/build" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log" >&2; fail "linking the library failed"; }
said=$("$tmp/app/build/app")
[[ "$said" == "5400 $upstream" ]] || fail "the linked program said '$said'"
wait "$lintian_pid" || { cat "$tmp/lintian.log" >&2; fail "lintian found errors or warnings without an override"; }
echo "package_test: ok ($(cd "$tmp/pkg" && ls -- *.deb *.ddeb | xargs), ${SECONDS}s)"
