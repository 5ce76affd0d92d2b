#!/usr/bin/env bash
# The checkpoint directory's file system stops answering in the middle of a run (a hung NFS or EFS
# mount; here a real ext4 on a loop device, frozen with fsfreeze: every write to it waits). The
# step watchdog fires after --step-timeout and says so at once; it then wrote its last words (the
# heartbeat's "failed", the lock's removal) to that same file system before it printed anything,
# and hung there with the run: no line, no exit, until the file system came back. Now the line comes
# within --step-timeout and its poll, the last words get a few seconds of their own, and the process
# ends with 124 (on a frozen ext4, whose writers the kernel cannot interrupt, once it thaws; on NFS's
# killable waits at once).
set -euo pipefail
: "${HPCTRAIN:?set HPCTRAIN to the hpctrain binary}"
FASHION_MNIST=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [[ $EUID -ne 0 ]]; then echo "SKIPPED: mounting a loop device needs root"; exit 77; fi
for p in mkfs.ext4 fsfreeze losetup; do
  command -v "$p" > /dev/null || { echo "FAIL: no $p (run ./setup.sh: e2fsprogs, util-linux, mount)" >&2; exit 1; }
done
work=$(mktemp -d /tmp/hpctrain-hung-storage-XXXXXX)
mnt=$work/mnt
pid=""
cleanup() {
  fsfreeze -u "$mnt" 2> /dev/null || true
  [[ -n "$pid" ]] && kill -9 "$pid" 2> /dev/null || true
  wait 2> /dev/null || true
  umount "$mnt" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
SECONDS=0
say() { echo "[$SECONDS s] $*"; }
fail() {
  echo "FAIL: $*" >&2
  [[ -f "$work/err" ]] && { echo "--- hpctrain's stderr"; tail -n 15 "$work/err"; } >&2
  exit 1
}

truncate -s 64M "$work/fs.img"
mkfs.ext4 -q -F "$work/fs.img"
mkdir "$mnt"
if ! mount -o loop "$work/fs.img" "$mnt" 2> "$work/mount.err"; then
  echo "SKIPPED: cannot mount a loop device here: $(head -1 "$work/mount.err")"
  exit 77
fi

# A checkpoint every step and a heartbeat every second: writes all the time. 3 s without a step
# is the limit.
"$HPCTRAIN" --data-dir "$FASHION_MNIST" --epochs 1 --train-samples 30000 --test-samples 100 --batch-size 32 \
  --threads 1 --checkpoint-dir "$mnt/ck" --checkpoint-every-steps 1 --snapshot-every-steps 0 --step-timeout 3s \
  > "$work/out" 2> "$work/err" &
pid=$!
for ((i = 0; i < 300; ++i)); do
  [[ -s "$mnt/ck/heartbeat" ]] && grep -q "^step=[1-9]" "$mnt/ck/heartbeat" && break
  kill -0 "$pid" 2> /dev/null || fail "hpctrain ended before its first steps"
  sleep 0.1
done
grep -q "^step=[1-9]" "$mnt/ck/heartbeat" || fail "no step within 30 s"
fsfreeze -f "$mnt"
frozen=$SECONDS
say "froze $mnt at step $(sed -n 's/^step=//p' "$mnt/ck/heartbeat")"
# The watchdog's line within the timeout, its 1 s poll and a loaded machine's slack, while frozen:
# a step that does not finish, or, where the step loop waits for the last checkpoint's write, that
# write, which syncs nothing more.
said="(no step finished|the checkpoint of step [0-9]+ made no progress) within --step-timeout 3 s"
for ((i = 0; i < 150; ++i)); do
  grep -Eq "$said" "$work/err" && break
  sleep 0.1
done
grep -Eq "$said" "$work/err" || fail "no word from the watchdog $((SECONDS - frozen)) s after the file system froze"
say "$(grep -Eo "rank 0 .*$said[^:]*" "$work/err")"
# Its last words' few seconds, then it ends: here once the file system thaws.
sleep 7
fsfreeze -u "$mnt"
say "thawed"
rc=0
for ((i = 0; i < 300; ++i)); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
kill -0 "$pid" 2> /dev/null && fail "hpctrain still runs 30 s after the file system thawed"
wait "$pid" || rc=$?
pid=""
[[ $rc == 124 ]] || fail "hpctrain ended with $rc, not 124"
say "hpctrain ended with 124"
echo PASS
