#!/usr/bin/env bash
# The skip machinery (tests/CMakeLists.txt, "Skips"): run_unittest.py reports a file with a
# skipped Python test as skipped (exit code 77), naming the test and the reason, and a failure or
# a file without tests as failed; must_run.sh turns 77 into a failure where
# HPCTRAIN_REQUIRE_ALL_TESTS=1, and lets every other exit code through.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
checks=0 failures=0

# check CODE TEXT COMMAND...: COMMAND exits with CODE and prints TEXT.
check() {
  local want=$1 text=$2 out got line
  shift 2
  out=$("$@" 2>&1)
  got=$?
  checks=$((checks + 1))
  if [[ $got != "$want" || "$out" != *"$text"* ]]; then
    echo "FAILED: $* exited $got (expected $want, printing '$text'):"
    while IFS= read -r line; do echo "  $line"; done <<< "$out"
    failures=$((failures + 1))
  fi
}
unittest() { python3 "$here/run_unittest.py" "$tmp/$1"; }
must_run() { bash "$here/must_run.sh" "$@"; }

cat > "$tmp/passes_test.py" << 'PY'
import unittest
class T(unittest.TestCase):
    def test_a(self): pass
PY
cat > "$tmp/skips_test.py" << 'PY'
import unittest
class T(unittest.TestCase):
    def test_a(self): pass
    @unittest.skipUnless(False, "no frobnicator here")
    def test_b(self): pass
PY
cat > "$tmp/skips_class_test.py" << 'PY'
import unittest
class T(unittest.TestCase):
    @classmethod
    def setUpClass(cls): raise unittest.SkipTest("no server")
    def test_a(self): pass
PY
cat > "$tmp/skips_itself_test.py" << 'PY'
import sys
print("SKIPPED: no boto3")
sys.exit(77)
PY
cat > "$tmp/fails_test.py" << 'PY'
import unittest
class T(unittest.TestCase):
    def test_a(self): self.assertEqual(1, 2)
    @unittest.skip("later")
    def test_b(self): pass
PY
echo "import unittest" > "$tmp/empty_test.py"

unset HPCTRAIN_REQUIRE_ALL_TESTS
check 0 "OK" unittest passes_test.py
check 77 "skips_test.T.test_b: no frobnicator here" unittest skips_test.py
check 77 "no server" unittest skips_class_test.py
check 77 "SKIPPED: no boto3" unittest skips_itself_test.py
check 1 "FAILED (failures=1" unittest fails_test.py
check 1 "holds no test" unittest empty_test.py
check 0 "" must_run true
check 77 "" must_run bash -c 'exit 77'
check 3 "" must_run bash -c 'exit 3'
check 77 "no frobnicator here" must_run python3 "$here/run_unittest.py" "$tmp/skips_test.py"

# The AWS tools: moto installed without its server extra (Flask; moto[all] leaves it out) has a
# moto_server that fails on import. The tests that need it say so and skip, rather than fail after
# waiting for a server that never starts; and the README's pip line installs that extra.
repo=$(cd "$here/.." && pwd)
pip_line=$(awk '/<!-- aws-test-tools/ { on = 1; next } on && /^```/ { if (++fence == 2) exit; next } on' \
  "$repo/README.md" | grep -E 'pip install ')
checks=$((checks + 1))
if [[ ! "$pip_line" =~ \'moto\[([a-z,]*,)?server(,[a-z,]*)?\] ]]; then
  echo "FAILED: README.md's aws-test-tools block installs moto without its server extra (moto_server needs it): '$pip_line'"
  failures=$((failures + 1))
fi
mkdir -p "$tmp/flaskless/bin" "$tmp/flaskless/python/flask"
printf '#!/bin/sh\nexit 0\n' > "$tmp/flaskless/bin/aws"
printf '#!/bin/sh\necho "ModuleNotFoundError: No module named %s" >&2\nexit 1\n' "'flask'" > "$tmp/flaskless/bin/moto_server"
chmod +x "$tmp/flaskless/bin/aws" "$tmp/flaskless/bin/moto_server"
echo 'raise ImportError("No module named flask (a stand-in: moto without its server extra)")' \
  > "$tmp/flaskless/python/flask/__init__.py"
flaskless_path="$tmp/flaskless/bin:$PATH"
# The interpreter itself, not a wrapper on PATH (pyenv's shims put their own bin first again).
python=$(python3 -c 'import sys; print(sys.executable)')
check 77 "moto_server cannot start (ModuleNotFoundError: No module named 'flask')" \
  env PATH="$flaskless_path" "$python" "$here/run_unittest.py" "$here/datasets/stage_test.py"
check 77 "SKIPPED: moto_server cannot start" env PATH="$flaskless_path" HPCTRAIN=/bin/true bash "$here/slurm/stage.sh"
if python3 -c 'import boto3, moto' 2> /dev/null; then
  check 77 "SKIPPED: moto's server cannot start" \
    env PYTHONPATH="$tmp/flaskless/python" HPCTRAIN=/bin/true bash "$here/slurm/power_saving.sh"
else
  check 77 "SKIPPED: python3 has no boto3 and moto" env HPCTRAIN=/bin/true bash "$here/slurm/power_saving.sh"
fi

export HPCTRAIN_REQUIRE_ALL_TESTS=1
check 0 "" must_run true
check 1 "HPCTRAIN_REQUIRE_ALL_TESTS=1 allows no skip" must_run bash -c 'echo "SKIPPED: no root"; exit 77'
check 3 "" must_run bash -c 'exit 3'
check 1 "allows no skip" must_run python3 "$here/run_unittest.py" "$tmp/skips_test.py"
check 0 "OK" must_run python3 "$here/run_unittest.py" "$tmp/passes_test.py"

echo "skips_test: $checks checks, $failures not as expected"
((failures == 0))
