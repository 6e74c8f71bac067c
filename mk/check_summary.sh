#!/bin/sh
# check_summary.sh LOG RC [TIMES] - the last line of `make check`: from the exit status
# of the suites (RC) and their output (LOG), "all suites passed" only when
# nothing failed and nothing was skipped; a skipped check is named, e.g.
#   make check: passed, but 2 skipped: oracle selftest: skipped: torch not available; ...
# Skips are recognised by what the suites print: "skipped:" (oracle selftest),
# TAP "# SKIP", "N skipped" with N > 0 (calibrate), "SKIP " (Lua tests).
# With TIMES (check_suites.sh's "SECONDS SUITE" lines) it first prints the
# whole run's seconds and its five slowest suites.
# Exit status: RC.
log=$1 rc=${2:-1} times=${3:-}
if [ -n "$times" ] && [ -s "$times" ]; then
    total=$(awk '{ s += $1 } END { print s }' "$times")
    echo "make check: suites took $total s; slowest: $(sort -k1,1rn -k2,2 "$times" | head -n 5 |
        awk '{ printf("%s%s %d s", (NR > 1 ? ", " : ""), $2, $1) }')"
fi
skips=$(grep -E '(^|[^a-z])skipped:|# SKIP|(^|[^0-9])[1-9][0-9]* skipped|^SKIP ' "$log" 2>/dev/null |
        sed 's/^[[:space:]]*//' | sort -u)
n=$(printf '%s' "$skips" | grep -c . || true)
if [ "$rc" -ne 0 ]; then
    echo "make check: FAILED (exit status $rc; see the 'not ok', FAIL and Error lines above)${n:+; $n skipped}"
elif [ "$n" -gt 0 ]; then
    echo "make check: passed, but $n skipped: $(printf '%s' "$skips" | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
else
    echo "make check: all suites passed"
fi
exit "$rc"
