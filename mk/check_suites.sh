#!/bin/sh
# check_suites.sh MAKE BUILD SUITE... - run each suite of `make check` in turn, on
# after a failure as `make -k` would, and note how long each took: BUILD/check.rc
# gets the exit status (0, or 2 when a suite failed), BUILD/check.times one line
# per suite, "SECONDS SUITE" (check_summary.sh prints the slowest: CI's budget
# is 15 minutes, and this says where they go).
make=$1 build=$2
shift 2
rc=0
: >"$build/check.times"
for t in "$@"; do
    start=$(date +%s)
    $make "$t" || rc=2
    echo "$(( $(date +%s) - start )) $t" >>"$build/check.times"
done
echo "$rc" >"$build/check.rc"
exit 0
