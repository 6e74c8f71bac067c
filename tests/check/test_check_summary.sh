#!/bin/sh
# test_check_summary.sh - the last line of `make check` (mk/check_summary.sh):
# "all suites passed" only when nothing failed and nothing was skipped.  It
# used to be printed unconditionally, also after "oracle selftest: skipped".
here=$(cd "$(dirname "$0")" && pwd)
sum="sh $here/../../mk/check_summary.sh"
t=$(mktemp -d /tmp/mmguard-summary.XXXXXX)
trap 'rm -rf "$t"' EXIT
pass=0 fail=0
check() { # check NAME LOG-TEXT RC WANT-RC WANT-PATTERN
    printf '%s\n' "$2" >"$t/log"
    out=$($sum "$t/log" "$3"); got=$?
    if [ "$got" -eq "$4" ] && printf '%s' "$out" | grep -Eq -- "$5"; then
        pass=$((pass + 1)); echo "ok - $1"
    else
        fail=$((fail + 1)); echo "not ok - $1: rc $got, '$out'"
    fi
}
check "clean run" "ok - a
5 passed, 0 failed" 0 0 '^make check: all suites passed$'
check "oracle selftest skipped" "oracle selftest: skipped: torch not available" 0 0 \
    '^make check: passed, but 1 skipped: oracle selftest: skipped: torch not available$'
check "TAP skip and a counted skip" "ok - # SKIP disk full: no tmpfs
calibrate: 5 passed, 0 failed, 1 skipped
calibrate: 5 passed, 0 failed, 0 skipped" 0 0 '^make check: passed, but 2 skipped: '
check "a failure wins" "not ok - x
oracle selftest: skipped: y" 2 2 '^make check: FAILED \(exit status 2.*; 1 skipped$'
check "never 'all suites passed' with a skip" "SKIP ctld_log safety: lua-posix not installed" 0 0 \
    '^make check: passed, but 1 skipped'
# with the suites' times: a line with the total and the slowest five before it,
# and the verdict still last
printf '%s\n' "ok - a" >"$t/log"
printf '3 check-unit\n300 check-fuzz\n12 check-cli\n1 a\n1 b\n50 check-fold\n' >"$t/times"
out=$($sum "$t/log" 0 "$t/times")
if [ "$(printf '%s\n' "$out" | head -n 1)" = "make check: suites took 367 s; slowest: check-fuzz 300 s, check-fold 50 s, check-cli 12 s, check-unit 3 s, a 1 s" ] &&
   [ "$(printf '%s\n' "$out" | tail -n 1)" = "make check: all suites passed" ]; then
    pass=$((pass + 1)); echo "ok - suite times before the verdict"
else
    fail=$((fail + 1)); echo "not ok - suite times before the verdict: '$out'"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
