# tests/slurm/testlib.sh - what every real-Slurm test script shares: a work
# directory holding the cluster, "ok"/"not ok" lines and counters, bounded
# commands, and a cleanup that always stops the cluster.  Source it after
# setting `here`, then call tl_start.
#   tl_start NAME   work dir /tmp/mmguard-NAME.XXXXXX (0755), CLUSTER_DIR, traps
#   expect / refute NAME CMD...   "ok" when CMD succeeds / fails
#   SHOW            files under $work a failure prints (default "out err")
#   RUN_TIMEOUT     bound of run() in seconds (default 60)
#   tl_cleanup_hook a function the script may define (unmount, userdel, ...)
#   KEEP=1          keeps the work directory
#   LOG             the decision log that log_lines / log_field read

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
# refute NAME COND...: passes when COND fails (a check shown able to fail)
refute() { _name=$1; shift; if "$@"; then not_ok "$_name"; else ok "$_name"; fi; }
has() { grep -Eq -- "$2" "$1"; }
hasnt() { ! grep -Eq -- "$2" "$1"; }
# run CMD...: stdout -> $work/out, stderr -> $work/err, status -> $rc (bounded)
run() { timeout "${RUN_TIMEOUT:-60}" "$@" >"$work/out" 2>"$work/err"; rc=$?; }
# jobid: the id in $work/out after `run sbatch ...`
jobid() { sed -n 's/^Submitted batch job \([0-9]*\).*/\1/p' "$work/out"; }
# wait_job ID: until the job has finished (bounded 60 s, each poll 10 s: a
# restarted slurmctld must not hang it); prints the state
wait_job() {
    _i=0
    while [ $_i -lt 600 ]; do
        _st=$(timeout 10 scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
        case "$_st" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) echo "$_st"; return 0 ;; esac
        sleep 0.1; _i=$((_i + 1))
    done
    echo "TIMEOUT_WAITING"; return 1
}
log_lines() { if [ -f "$LOG" ]; then wc -l <"$LOG" | tr -d ' '; else echo 0; fi; }
# log_field N KEY: field KEY (dotted for nested) of decision-log line N
log_field() {
    python3 - "$LOG" "$1" "$2" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
rec = json.loads(lines[int(sys.argv[2]) - 1])
v = rec
for k in sys.argv[3].split("."):
    v = v[k]
print(v)
PY
}
# finish: the closing "N passed, N failed" line; exit status 1 if any failed
finish() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
    exit $?
}
