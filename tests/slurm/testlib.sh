# tests/slurm/testlib.sh - what every real-Slurm test script shares: a work
# directory holding the cluster, "ok"/"not ok" lines and counters, bounded
# commands, and a cleanup that always stops the cluster.  Source it after
# setting `here`, then call tl_start.
#   tl_start NAME   work dir /tmp/mmguard-NAME.XXXXXX (0755), CLUSTER_DIR, traps
#   SHOW            files under $work a failure prints (default "out err")
#   RUN_TIMEOUT     bound of run() in seconds (default 60)
#   tl_cleanup_hook a function the script may define (unmount, userdel, ...)
#   KEEP=1          keeps the work directory

tl_start() {
    work=$(mktemp -d "/tmp/mmguard-$1.XXXXXX")
    chmod 0755 "$work"
    export CLUSTER_DIR="$work/cluster"
    pass=0
    fail=0
    trap tl_cleanup EXIT
    trap 'exit 1' INT TERM
}

tl_cleanup() {
    sh "$here/cluster.sh" stop >/dev/null 2>&1 || true
    if command -v tl_cleanup_hook >/dev/null 2>&1; then tl_cleanup_hook; fi
    if [ "${KEEP:-0}" = 1 ]; then echo "# kept $work"; else rm -rf "$work"; fi
}

ok() { pass=$((pass + 1)); echo "ok - $1"; }
not_ok() {
    fail=$((fail + 1)); echo "not ok - $1"
    for f in ${SHOW:-out err}; do
        [ -s "$work/$f" ] && sed -n '1,25s/^/#   /p' "$work/$f"
    done
    return 0
}
# expect NAME COND...: COND is a command; passes when it succeeds
expect() { _name=$1; shift; if "$@"; then ok "$_name"; else not_ok "$_name"; fi; }
has() { grep -Eq -- "$2" "$1"; }
hasnt() { ! grep -Eq -- "$2" "$1"; }
# run CMD...: stdout -> $work/out, stderr -> $work/err, status -> $rc (bounded)
run() { timeout "${RUN_TIMEOUT:-60}" "$@" >"$work/out" 2>"$work/err"; rc=$?; }
# finish: the closing "N passed, N failed" line; exit status 1 if any failed
finish() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
    exit $?
}
