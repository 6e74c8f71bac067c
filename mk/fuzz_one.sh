#!/bin/sh
# fuzz_one.sh SECONDS HARNESS - one libFuzzer harness for SECONDS (mk/fuzz.mk runs
# them FUZZ_JOBS at a time).  Its output goes to $FUZZ_DIR/fuzz_HARNESS.log; what it
# prints here comes in one piece when it ends, so parallel runs do not interleave.
# Exit status 255 on a failure: xargs then starts no further harness.
# Environment: FUZZ_DIR, FUZZ_RUN_FLAGS, and the sanitizer options (ASAN_OPTIONS, ...).
secs=$1 h=$2
mkdir -p "$FUZZ_DIR/corpus/$h" "$FUZZ_DIR/artifacts"
dict=""
[ -f "tests/fuzz/$h.dict" ] && dict="-dict=tests/fuzz/$h.dict"
seeds=tests/fuzz/corpus/$h
case $h in
    import_swift) seeds=tests/fixtures/import/ms-swift ;;
    import_titan) seeds=tests/fixtures/import/torchtitan ;;
    import_hf) seeds="tests/fuzz/corpus/import_hf $(ls -d tests/fixtures/import/*/config.json | xargs -n1 dirname)" ;;
esac
log=$FUZZ_DIR/fuzz_$h.log
# shellcheck disable=SC2086 # flag lists and seed directories split on purpose
if "$FUZZ_DIR/fuzz_$h" $FUZZ_RUN_FLAGS $dict -max_total_time="$secs" \
       -artifact_prefix="$FUZZ_DIR/artifacts/$h-" "$FUZZ_DIR/corpus/$h" $seeds >"$log" 2>&1; then
    printf '== fuzz_%s for %s s\n%s\n' "$h" "$secs" "$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1)"
    exit 0
fi
printf '== fuzz_%s for %s s\n%s\nfuzz_%s FAILED (log: %s)\n' "$h" "$secs" "$(tail -n 60 "$log")" "$h" "$log"
exit 255
