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
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
