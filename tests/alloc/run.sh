#!/bin/sh
# tests/alloc/run.sh - every allocator trace recorded on a real GPU
# (tests/gpu_data/traces/*.trace.gz) replayed through mmguard's model of the
# CUDA caching allocator.  The model must make the very segments the real
# allocator made - same sizes, same order - and so the same reserved peak, both
# with the trace's own segment addresses and with the addresses the model
# invents (what a prediction uses).  MMGUARD=path/to/mmguard.
set -u
M=${MMGUARD:-build/mmguard}
dir=${TRACE_DIR:-tests/gpu_data/traces}
pass=0
fail=0
n=0
for t in "$dir"/*.trace.gz; do
    [ -e "$t" ] || continue
    n=$((n + 1))
    for mode in "" --invent-addresses; do
        out=$(gzip -dc "$t" | "$M" alloc-replay $mode --json -) || {
            fail=$((fail + 1)); echo "FAIL: $t $mode: alloc-replay exited $?"; continue; }
        # reserved peak, requested peak and every segment identical to the trace
        verdict=$(printf '%s\n' "$out" | python3 -c '
import json, sys
j = json.load(sys.stdin)
bad = []
if j["reserved_peak_bytes"] != j["truth_reserved_peak_bytes"]:
    bad.append("reserved %d != real %d (%+.3f%%)" % (j["reserved_peak_bytes"],
               j["truth_reserved_peak_bytes"], j["reserved_error_pct"]))
if j["requested_peak_bytes"] != j["truth_requested_peak_bytes"]:
    bad.append("requested %d != real %d" % (j["requested_peak_bytes"],
               j["truth_requested_peak_bytes"]))
if not (j["segments"] == j["truth_segments"] == j["segments_matched"]) or j["segments"] == 0:
    bad.append("segments: model %d, real %d, first %d identical" % (j["segments"],
               j["truth_segments"], j["segments_matched"]))
print("; ".join(bad) if bad else "ok %s %d events, reserved peak %.3f GiB, %d segments" % (
      j["id"], j["events"], j["reserved_peak_bytes"] / 2**30, j["segments"]))')
        case $verdict in
        ok*) pass=$((pass + 1)); echo "  $verdict${mode:+ ($mode)}" ;;
        *) fail=$((fail + 1)); echo "FAIL: $t ${mode:-trace addresses}: $verdict" ;;
        esac
    done
done
if [ "$n" -eq 0 ]; then
    echo "alloc traces: none in $dir: SKIPPED (record some: docs/calibrate.md)"
    exit 0
fi
echo "alloc traces: $n traces, $pass replays exact, $fail failed"
[ "$fail" -eq 0 ]
