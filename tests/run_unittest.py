#!/usr/bin/env python3
"""Runs one file of Python unittest tests for CTest, so that a skip is reported as a skip.

unittest exits 0 when some of its tests were skipped, and CTest would count the file as passed.
Here the exit code is 0 when every test ran and passed; 1 on a failure or an error, or when the
file holds no test; 77 (the tests' SKIP_RETURN_CODE) when any test was skipped, each listed
with its reason, or when the file skipped itself on import (it exits 77 where what it needs is
missing).

    python3 tests/run_unittest.py FILE.py
"""
import importlib.util
import os
import sys
import unittest

SKIPPED = 77


def load(path):
    """The test file as a module, imported as `python3 FILE` would run it (its folder on sys.path)."""
    name = os.path.splitext(os.path.basename(path))[0]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # for pickling, and for a sibling test file that imports it
    spec.loader.exec_module(module)
    return module


def main(argv):
    if len(argv) != 2:
        print("usage: run_unittest.py FILE.py", file=sys.stderr)
        return 2
    suite = unittest.defaultTestLoader.loadTestsFromModule(load(argv[1]))
    result = unittest.TextTestRunner(stream=sys.stdout).run(suite)
    if not result.wasSuccessful():
        return 1
    if result.skipped:  # before the count: a class skipped in setUpClass runs no test
        print(f"SKIPPED: {len(result.skipped)} skip(s), {result.testsRun} test(s) run")
        for test, why in result.skipped:
            print(f"  {test.id()}: {why}")
        return SKIPPED
    if result.testsRun == 0:
        print(f"FAILED: {argv[1]} holds no test")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
