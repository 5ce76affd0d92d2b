#!/usr/bin/env bash
# bench/device_deps.sh env, as the GPU machine runs it (gpu_vs_peer.sh with DEPS), on a stand-in
# pack: it unpacks into HPCTRAIN_DEPS, and after its lines are evaluated the launcher the bench
# scripts take (${MPIRUN:-mpirun}: scaling_check.sh, which gpu_vs_peer.sh's scaling step runs,
# and mpi_vs_peer.sh) is the pack's Open MPI, which hpctrain is linked with there, not an
# `mpirun` of the machine's own (a stand-in here, first on PATH after the pack's folder). The
# pack has no `mpirun`: Debian makes that name an update-alternatives link, which is not packed.
# A damaged pack, no folder given, or one that cannot be made, is one error line naming it, exit 2.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bench=$(cd "$here/../../bench" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# fail MESSAGE OUTPUT: one failed check, with what was seen.
fail() {
  local line
  echo "FAILED: $1"
  while IFS= read -r line; do echo "  | $line"; done <<< "$2"
  failures=$((failures + 1))
}

# The stand-in pack: Debian's Open MPI launcher names (orterun, and mpirun.openmpi linked to it),
# and a machine's own mpirun on PATH.
mkdir -p "$tmp/root/usr/bin" "$tmp/pack" "$tmp/machine"
printf '#!/bin/sh\necho "the pack'"'"'s launcher $*"\n' > "$tmp/root/usr/bin/orterun"
ln -s orterun "$tmp/root/usr/bin/mpirun.openmpi"
printf '#!/bin/sh\necho "the machine'"'"'s own mpirun $*"\n' > "$tmp/machine/mpirun"
chmod +x "$tmp/root/usr/bin/orterun" "$tmp/machine/mpirun"
tar -C "$tmp/root" -cJf "$tmp/pack/deps.tar.xz" usr || { echo "FAILED: cannot make the stand-in pack"; exit 1; }

lines=$(HPCTRAIN_DEPS=$tmp/unpacked "$bench/device_deps.sh" env "$tmp/pack" 2>&1) ||
  fail "device_deps.sh env failed" "$lines"
[[ -x $tmp/unpacked/usr/bin/orterun && -f $tmp/unpacked/.unpacked ]] ||
  fail "env did not unpack into HPCTRAIN_DEPS ($tmp/unpacked)" "$(ls -la "$tmp/unpacked" 2>&1)"
# As a bench script there: its lines evaluated, then ${MPIRUN:-mpirun} -np 2 (scaling_check.sh).
out=$(PATH=$tmp/machine:$PATH bash -c 'eval "$1" && "${MPIRUN:-mpirun}" -np 2 allreduce_sweep' _ "$lines" 2>&1)
[[ $out == "the pack's launcher -np 2 allreduce_sweep" ]] ||
  fail "after env's lines, \${MPIRUN:-mpirun} is not the pack's Open MPI launcher" "$out"

# A damaged pack: one error line naming it, exit 2, and nothing marked unpacked.
echo "not xz" > "$tmp/pack/deps.tar.xz"
out=$(HPCTRAIN_DEPS=$tmp/damaged "$bench/device_deps.sh" env "$tmp/pack" 2>&1 > /dev/null)
code=$?
head="device_deps.sh: error: cannot unpack $tmp/pack/deps.tar.xz into $tmp/damaged (xz: "
tail="): make it again with bench/device_deps.sh pack"
[[ $code == 2 && $out == "$head"*"$tail" && $out != *$'\n'* ]] ||
  fail "env on a damaged pack exited $code, wanted 2 and '${head}...$tail'" "$out"
[[ ! -e $tmp/damaged/.unpacked ]] || fail "a damaged pack marked unpacked" ""

# env without its folder: one error line of the script's own (it was bash's "1: env needs ...", exit 1).
out=$("$bench/device_deps.sh" env 2>&1 > /dev/null)
code=$?
[[ $code == 2 && $out == "device_deps.sh: error: env needs the folder pack made (bench/device_deps.sh env DIR)" ]] ||
  fail "env without its folder exited $code, wanted 2 and one error line" "$out"

# A folder to unpack into that another user could have filled first (made before, in a shared
# /tmp, with .unpacked and their own mpirun): its programs went on PATH and were run. One others
# may write in, a link, or (as root) another user's: refused, one line, exit 2, nothing printed
# to evaluate.
planted() {
  rm -rf "$1" && mkdir -p "$1/usr/bin" && : > "$1/.unpacked"
  printf '#!/bin/sh\necho planted\n' > "$1/usr/bin/mpirun.openmpi" && chmod +x "$1/usr/bin/mpirun.openmpi"
}
tar -C "$tmp/root" -cJf "$tmp/pack/deps.tar.xz" usr
planted "$tmp/open" && chmod 777 "$tmp/open"
planted "$tmp/real" && ln -s real "$tmp/link"
cases=("$tmp/open:is writable by others (mode 777)" "$tmp/link:is not a folder of yours")
if ((EUID == 0)); then
  planted "$tmp/theirs" && chown -R 65534 "$tmp/theirs" && chmod 755 "$tmp/theirs"
  cases+=("$tmp/theirs:is not a folder of yours")
fi
for c in "${cases[@]}"; do
  dir=${c%%:*} says=${c#*:}
  out=$(HPCTRAIN_DEPS=$dir "$bench/device_deps.sh" env "$tmp/pack" 2> "$tmp/err")
  code=$?
  [[ $code == 2 && -z $out && $(< "$tmp/err") == "device_deps.sh: error: $dir $says"* && $(wc -l < "$tmp/err") == 1 ]] ||
    fail "env into $dir exited $code, wanted 2 and '$dir $says'" "$out$(< "$tmp/err")"
done

# A folder that cannot be made (under a file): one line with mkdir's reason (it was mkdir's own
# line, then one without the reason).
: > "$tmp/a-file"
out=$(HPCTRAIN_DEPS=$tmp/a-file/deps "$bench/device_deps.sh" env "$tmp/pack" 2> "$tmp/err")
code=$?
[[ $code == 2 && -z $out && $(< "$tmp/err") == "device_deps.sh: error: cannot create $tmp/a-file/deps: Not a directory" ]] ||
  fail "env into a folder under a file exited $code, wanted 2 and one line with mkdir's reason" "$out$(< "$tmp/err")"

# pack into a folder outside the repository: refused at once (the device call's carry takes only
# paths inside the tree), before the long compression, and nothing made there.
if grep -qx 'VERSION_ID="12"' /etc/os-release 2> /dev/null; then
  out=$("$bench/device_deps.sh" pack "$tmp/outside" 2>&1 > /dev/null)
  code=$?
  [[ $code == 2 && $out == "device_deps.sh: error: pack folder $tmp/outside is not a folder inside the repository "* &&
     $out != *$'\n'* && ! -e $tmp/outside ]] ||
    fail "pack into a folder outside the repository exited $code, wanted 2 and one line saying so" "$out"
else
  echo "not checked: pack outside the repository (pack runs on Debian 12 only, this is $(. /etc/os-release; echo "$PRETTY_NAME"))"
fi

((failures == 0)) || exit 1
echo "device_deps.sh env: unpacked into HPCTRAIN_DEPS, MPIRUN the pack's launcher, a damaged pack refused, a folder others could fill refused; pack outside the tree refused"
