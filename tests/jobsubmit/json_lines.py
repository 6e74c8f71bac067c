#!/usr/bin/env python3
"""json_lines.py FILE... - every non-empty line must be one JSON object (exit 1 otherwise).

Used by `make check-jobsubmit-lua` on the decision log job_submit.lua wrote, since
Lua has no JSON parser to check its own escaper against."""
import json
import sys

bad = 0
total = 0
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            total += 1
            try:
                obj = json.loads(raw.decode("utf-8"))  # strict UTF-8, no surrogates
                if not isinstance(obj, dict):
                    raise ValueError("not an object")
                for key in ("time", "decision", "reason", "source"):
                    if key not in obj:
                        raise ValueError("missing " + key)
            except Exception as e:  # noqa: BLE001 - report every kind of failure
                bad += 1
                print("%s:%d: %s" % (path, n, e))
print("json_lines: %d line(s), %d invalid" % (total, bad))
sys.exit(1 if bad or total == 0 else 0)
