#!/usr/bin/env python3
"""Every test declares the cores it fills, as tests/CMakeLists.txt says at its top.

The README runs `ctest -j8`: -j only caps how many tests run at once, and the cores resource
(the build's tests/cores.json) keeps the tests from filling more cores than the machine has.
A test without RESOURCE_GROUPS would take none and run beside tests that fill every core.
So, from `ctest --show-only=json-v1` (the discovered GoogleTest cases included):
  - a test labelled slurm takes no cores and holds the local_slurm lock (one at a time);
  - every other test takes exactly its PROCESSORS (1 when unset) in cores, in one group;
  - the resource file names at least as many cores as the largest test takes.
Prints one line per wrong test and exits 1; 0 when all are right.

    python3 tests/test_resources.py BUILD_DIR
"""
import json
import re
import subprocess
import sys


def properties(test):
    return {p["name"]: p["value"] for p in test.get("properties", [])}


def cores_of(groups):
    """The cores a RESOURCE_GROUPS value asks for, or None when it is not one group of cores."""
    if not isinstance(groups, list) or len(groups) != 1:
        return None
    requirements = groups[0].get("requirements", [])
    if len(requirements) != 1 or requirements[0].get(".type") != "cores":
        return None
    return requirements[0].get("slots")


def problems(tests):
    """One line per test whose resources break the rules above; and the largest cores asked."""
    found, largest = [], 0
    for test in tests:
        name, props = test["name"], properties(test)
        labels = props.get("LABELS", [])
        groups = props.get("RESOURCE_GROUPS")
        if "slurm" in labels:
            if groups is not None:
                found.append(f"{name}: a Slurm test takes no cores (it waits on Slurm), but asks {groups}")
            if "local_slurm" not in props.get("RESOURCE_LOCK", []):
                found.append(f"{name}: a Slurm test must hold RESOURCE_LOCK local_slurm")
            continue
        processors = props.get("PROCESSORS", 1)
        cores = cores_of(groups)
        if cores != processors:
            found.append(f"{name}: PROCESSORS {processors} but RESOURCE_GROUPS {groups} "
                         f"(needs cores:{processors})")
        largest = max(largest, processors)
    return found, largest


def spec_cores(build):
    """The cores of the resource file that the build's tests/CTestTestfile.cmake names."""
    with open(f"{build}/tests/CTestTestfile.cmake") as f:
        match = re.search(r'set\(CTEST_RESOURCE_SPEC_FILE "([^"]+)"\)', f.read())
    if not match:
        return None, "tests/CTestTestfile.cmake sets no CTEST_RESOURCE_SPEC_FILE"
    with open(match.group(1)) as f:
        spec = json.load(f)
    return sum(c["slots"] for c in spec["local"][0]["cores"]), None


def main():
    if len(sys.argv) != 2:
        print("usage: test_resources.py BUILD_DIR", file=sys.stderr)
        return 2
    build = sys.argv[1]
    shown = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"],
                           capture_output=True, text=True, check=True)
    tests = json.loads(shown.stdout)["tests"]
    found, largest = problems(tests)
    cores, error = spec_cores(build)
    if error:
        found.append(error)
    elif cores < largest:
        found.append(f"the resource file has {cores} cores, but a test takes {largest}")
    for line in found:
        print(line)
    print(f"{len(tests)} tests, {len(found)} wrong; resource file: {cores} cores")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
