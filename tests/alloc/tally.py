"""tests/alloc/tally.py - what capacity.py and sweep.py share: a pass/fail
tally, and `mmguard alloc-replay --json` on a trace (MMGUARD=path/to/mmguard)."""
import json
import os
import subprocess

MM = os.environ.get("MMGUARD", "build/mmguard")


class Tally:
    def __init__(self):
        self.passed = self.failed = 0

    def ok(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL:", what)
        return cond

    def done(self, name):
        """print the last line; the exit status"""
        print(f"{name}: {self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0


def replay(data, *options):
    """the model's replay of a trace (its text, bytes) with alloc-replay's options"""
    r = subprocess.run([MM, "alloc-replay", "--json", "-", *options], input=data,
                       capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"alloc-replay {' '.join(options)} failed: {r.stderr.decode()}")
    return json.loads(r.stdout)
