#!/bin/sh
# long_run.sh OUTDIR SECONDS_PER_HARNESS [HARNESS...]
# Long fuzzing campaign, one harness at a time (one core): copies the built
# harnesses into OUTDIR so a rebuild does not disturb the run, keeps going
# after a crash (-fork=1 -ignore_crashes/-ignore_ooms/-ignore_timeouts) so one
# known bug does not hide others, and leaves per-harness logs and artifacts in
# OUTDIR.  Figures for docs/fuzzing.md come from the logs (`stat::` lines and
# the last cov:/ft: line).  Run after `make BUILD=build-fuzz fuzz-build`.
set -eu
out=$1; secs=$2; shift 2
build=${BUILD:-build-fuzz}
harnesses=${*:-spec_yaml spec_json set config size}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/bin"
for h in $harnesses; do cp "$build/fuzz/fuzz_$h" "$out/bin/"; done
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for h in $harnesses; do
    mkdir -p "$out/corpus/$h" "$out/artifacts/$h"
    echo "== $h start $(date +%T)" >> "$out/progress"
    nice -n 10 "$out/bin/fuzz_$h" -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
        -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -max_len=16384 \
        -dict="$here/$h.dict" -max_total_time="$secs" -print_final_stats=1 \
        -artifact_prefix="$out/artifacts/$h/" \
        "$out/corpus/$h" "$here/corpus/$h" > "$out/$h.log" 2>&1 || true
    echo "== $h end $(date +%T)" >> "$out/progress"
done
