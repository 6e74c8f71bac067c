#!/usr/bin/env python3
"""Runs tests/calibrate with unittest and closes with 'calibrate: N passed, N failed, N skipped'.

Exit status 0 only if nothing failed.  Usage: python3 tests/calibrate/run_tests.py [-v]
"""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    verbosity = 2 if "-v" in sys.argv[1:] else 1
    suite = unittest.defaultTestLoader.discover(HERE, pattern="test_*.py", top_level_dir=HERE)
    res = unittest.TextTestRunner(verbosity=verbosity).run(suite)
    failed = len(res.failures) + len(res.errors) + len(res.unexpectedSuccesses)
    skipped = len(res.skipped)
    passed = res.testsRun - failed - skipped
    for test, why in res.skipped:
        print("skipped %s: %s" % (test.id(), why))
    print("calibrate: %d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
