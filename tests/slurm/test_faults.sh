#!/bin/sh
# test_faults.sh - the mmguard SPANK plugin under faults, on a real single-node
# Slurm (tests/slurm/cluster.sh), as root and as an unprivileged user:
#   - decision log unwritable (missing directory, read-only file and directory,
#     full tmpfs, nearly full tmpfs, a symlink or a FIFO in its place)
#   - spec changed or removed between submit and job start; spec unreadable,
#     a FIFO or a directory (on_error=reject and allow)
#   - a root-only spec cannot leak to a user (submit-time and forged env vars)
#   - plugin misconfiguration: sbatch names the problem, slurmd starts, jobs
#     without --mm-model run
#   - slurmctld restarted: new submissions and held jobs keep working
# Run by `make check-faults` (as root).  PLUGIN=spank_mmguard.so; KEEP=1 keeps
# the work directory; FAULT_USER (default mmgfault) is created with useradd if
# missing and removed again.  Prints "N passed, N failed" last.
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PLUGIN=${PLUGIN:-$root/build/spank_mmguard.so}
SPECS=$here/specs
SMALL=$SPECS/llava-lora-small.yaml
BIG=$SPECS/llava-finetune-big.yaml
USR=${FAULT_USER:-mmgfault}

. "$here/testlib.sh"
tl_start faults
RUN_TIMEOUT=30
LOG=$work/logdir/decisions.jsonl
MARKER="mmguard-secret-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"
unset MMGUARD_CONF MMGUARD_CLI
made_user=0
mounted=""
tl_cleanup_hook() {
    [ -n "$mounted" ] && umount "$mounted" 2>/dev/null
    [ "$made_user" = 1 ] && userdel "$USR" 2>/dev/null
    return 0
}
skip() { echo "ok - # SKIP $1"; }
count() { grep -Ec -- "$2" "$1"; }
# as_user CMD...: run as the unprivileged user (keeps SLURM_CONF)
as_user() { run runuser -u "$USR" -- "$@"; }

start() { # start CONF_LINES...: a fresh cluster with this mmguard.conf
    printf '%s\n' "$@" >"$work/mmguard.conf"
    MMGUARD_CONF=$work/mmguard.conf PLUGIN=$PLUGIN sh "$here/cluster.sh" start 2>"$work/cluster.err" || {
        cat "$work/cluster.err"; echo "Bail out! cluster did not start"
        fail=$((fail + 1)); finish
    }
    . "$CLUSTER_DIR/env.sh"
}
# conf LINES...: replace the running cluster's mmguard.conf (sbatch reads it
# on every --mm-model submission)
conf() { printf '%s\n' "$@" >"$CLUSTER_DIR/etc/mmguard.conf"; }

log_intact() { # log_intact FILE: every line a JSON object (an absent file is fine)
    [ ! -e "$1" ] || python3 -c '
import json, sys
d = open(sys.argv[1], "rb").read()
assert d == b"" or d.endswith(b"\n"), "no final newline"
for l in d.splitlines(): assert isinstance(json.loads(l), dict)' "$1"
}
env_of() { sed -n "s/^$2=//p" "$1" | head -1; } # env_of FILE NAME

echo "# plugin: $PLUGIN"
[ -f "$PLUGIN" ] || { echo "Bail out! $PLUGIN not built"; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "Bail out! needs root"; exit 1; }
if ! id "$USR" >/dev/null 2>&1; then
    useradd -M -s /bin/sh "$USR" && made_user=1
fi
id "$USR" >/dev/null 2>&1 || { echo "Bail out! no user $USR (useradd failed)"; exit 1; }
cd "$work" || exit 1
mkdir -m 0755 "$work/logdir" && install -m 0622 /dev/null "$LOG"
mkdir -m 1777 "$work/uout"
# a spec only root can read; its contents (the model name too) carry MARKER
mkdir -m 0700 "$work/rootonly"
ROOTSPEC=$work/rootonly/spec.yaml
sed "s/^name: .*/name: $MARKER/" "$SMALL" >"$ROOTSPEC"
echo "# $MARKER" >>"$ROOTSPEC"
chmod 0600 "$ROOTSPEC"
cat >"$work/job.sh" <<'SH'
#!/bin/sh
env | grep -E '^(SLURM_SPANK_|SPANK_)?MMGUARD[_=]' | sed 's/^/batch: /' | sort
srun -n1 sh -c 'env | grep "^MMGUARD_" | sed "s/^/step: /" | sort'
SH
chmod 0755 "$work/job.sh"

GOOD_CONF="action=reject on_error=reject margin=5% log=$LOG"
# shellcheck disable=SC2086
start $GOOD_CONF
# shellcheck disable=SC2086
set -- $GOOD_CONF

# ---- 1. decision log unwritable -------------------------------------------------
# log_case NAME AS(root|user) LOGPATH ERR_RE: an accepted and a rejected
# submission with that log; decisions stand, one failure line each
log_case() {
    _lc=$1; _as=$2; _path=$3; _re=$4
    conf "action=reject" "on_error=reject" "log=$_path"
    if [ "$_as" = user ]; then as_user sbatch --hold -o /dev/null --mm-model="$SMALL" --gres=gpu:h100:1 --wrap true
    else run sbatch --hold -o /dev/null --mm-model="$SMALL" --gres=gpu:h100:1 --wrap true; fi
    expect "log $_lc: accept still accepts (rc 0, job id), failure reported once" \
        sh -c "[ $rc -eq 0 ] && [ -n '$(jobid)' ] && grep -q 'fits h100' '$work/err' &&
               [ \$(grep -c 'cannot append the decision record' '$work/err') -eq 1 ] &&
               grep -Eq 'mmguard: log=$_path: cannot append the decision record: $_re \\(decision accept stands\\)' '$work/err'"
    if [ "$_as" = user ]; then as_user sbatch --hold -o /dev/null --mm-model="$BIG" --gres=gpu:h100:1 --wrap true
    else run sbatch --hold -o /dev/null --mm-model="$BIG" --gres=gpu:h100:1 --wrap true; fi
    expect "log $_lc: reject still rejects (rc 1, explanation), failure reported once" \
        sh -c "[ $rc -eq 1 ] && ! grep -q Submitted '$work/out' && grep -q 'job rejected' '$work/err' &&
               grep -q 'to fit:' '$work/err' &&
               [ \$(grep -c 'cannot append the decision record' '$work/err') -eq 1 ] &&
               grep -Eq 'cannot append the decision record: $_re \\(decision reject stands\\)' '$work/err'"
}

log_case "in a missing directory" root "$work/nodir/decisions.jsonl" "No such file or directory"
expect "log in a missing directory: nothing created" test ! -e "$work/nodir"

install -m 0444 /dev/null "$work/logdir/ro.jsonl"; echo '{"old":1}' >"$work/logdir/ro.jsonl"
log_case "read-only file (user)" user "$work/logdir/ro.jsonl" "Permission denied"
expect "log read-only file: unchanged" test "$(cat "$work/logdir/ro.jsonl")" = '{"old":1}'

mkdir -m 0555 "$work/rodir"
log_case "in a read-only directory (user)" user "$work/rodir/decisions.jsonl" "Permission denied"
expect "log in a read-only directory: nothing created" test -z "$(ls -A "$work/rodir")"

echo "precious" >"$work/target"; touch -d '2020-01-01 00:00:00' "$work/target"
before=$(stat -c '%s %Y %i' "$work/target")
ln -s "$work/target" "$work/logdir/link.jsonl"
log_case "is a symlink to a file" root "$work/logdir/link.jsonl" "it is a symbolic link \\(not followed\\)"
expect "log symlink: target untouched (content, size, mtime)" \
    sh -c "[ \"\$(cat '$work/target')\" = precious ] && [ \"\$(stat -c '%s %Y %i' '$work/target')\" = '$before' ]"
ln -s "$work/created-through-link" "$work/logdir/dangling.jsonl"
log_case "is a dangling symlink (user)" user "$work/logdir/dangling.jsonl" "it is a symbolic link \\(not followed\\)"
expect "log dangling symlink: nothing created at its target" test ! -e "$work/created-through-link"

mkfifo -m 0666 "$work/logdir/fifo.jsonl"
log_case "is a FIFO (no reader: no hang)" root "$work/logdir/fifo.jsonl" "(No such device or address|not a regular file)"

mkdir "$work/tiny"
if mount -t tmpfs -o size=64k,mode=0755 tmpfs "$work/tiny" 2>"$work/err"; then
    mounted=$work/tiny
    # full: not one byte left
    install -m 0622 /dev/null "$work/tiny/full.jsonl"
    dd if=/dev/zero of="$work/tiny/fill" bs=4k count=64 2>/dev/null
    log_case "on a full tmpfs" root "$work/tiny/full.jsonl" "No space left on device"
    expect "log on a full tmpfs: file still empty" test ! -s "$work/tiny/full.jsonl"
    # nearly full: one page left, records are 1-3 KiB, so writes come up short:
    # the log must still hold only complete lines
    rm -f "$work/tiny/fill" "$work/tiny/full.jsonl"
    install -m 0622 /dev/null "$work/tiny/near.jsonl"
    dd if=/dev/zero of="$work/tiny/fill" bs=4k count=15 2>/dev/null
    conf "action=reject" "on_error=reject" "log=$work/tiny/near.jsonl"
    nfail=0; nok=0
    for i in 1 2 3 4 5 6; do
        case $i in 1|3|5) spec=$SMALL ;; *) spec=$BIG ;; esac
        run sbatch --hold -o /dev/null --mm-model="$spec" --gres=gpu:h100:1 --wrap true
        if grep -q 'cannot append the decision record: No space left on device' "$work/err"; then
            nfail=$((nfail + 1)); else nok=$((nok + 1)); fi
    done
    : >"$work/out"; cp "$work/tiny/near.jsonl" "$work/err"
    expect "log on a nearly full tmpfs: short writes undone, only intact lines ($nok written, $nfail refused)" \
        sh -c "[ $nfail -ge 1 ] && [ $nok -ge 1 ] && [ \$(wc -l <'$work/tiny/near.jsonl') -eq $nok ] &&
               log_intact() { python3 -c 'import json,sys
d=open(sys.argv[1],\"rb\").read(); assert d.endswith(b\"\\n\")
[json.loads(l) for l in d.splitlines()]' \"\$1\"; }; log_intact '$work/tiny/near.jsonl'"
    umount "$work/tiny" && mounted=""
else
    skip "disk full: cannot mount a tmpfs here ($(head -1 "$work/err"))"
fi
conf "$@"

# ---- 2. spec faults -------------------------------------------------------------
# changed / removed between submit and job start: the job runs with the
# submit-time prediction, nothing is re-read
for what in changed removed; do
    cp "$SMALL" "$work/spec-$what.yaml"
    sha=$(sha256sum "$work/spec-$what.yaml" | cut -d' ' -f1)
    n0=$(log_lines)
    run sbatch --hold -o "$work/job-$what.out" --mm-model="$work/spec-$what.yaml" --gres=gpu:h100:1 "$work/job.sh"
    id=$(jobid)
    n1=$(log_lines)
    if [ "$what" = changed ]; then cp "$BIG" "$work/spec-$what.yaml"; else rm -f "$work/spec-$what.yaml"; fi
    timeout 10 scontrol release "$id" >/dev/null 2>&1
    st=$(wait_job "$id")
    o=$work/job-$what.out
    cp "$o" "$work/out" 2>/dev/null
    expect "spec $what before the job starts: job ran ($st), one decision logged" \
        sh -c "[ -n '$id' ] && [ '$st' = COMPLETED ] && [ $n1 -eq $((n0 + 1)) ]"
    expect "spec $what: batch step and srun step see the submit-time prediction (sha, peak, model = decision log)" \
        sh -c "grep -qx 'batch: MMGUARD_SPEC_SHA256=$sha' '$o' && grep -qx 'step: MMGUARD_SPEC_SHA256=$sha' '$o' &&
               [ '$(log_field "$n1" spec_sha256)' = '$sha' ] &&
               grep -qx 'batch: MMGUARD_PEAK_BYTES=$(log_field "$n1" peak_bytes)' '$o' &&
               grep -qx 'step: MMGUARD_PEAK_BYTES=$(log_field "$n1" peak_bytes)' '$o' &&
               grep -qx 'step: MMGUARD_MODEL=$(log_field "$n1" model)' '$o' &&
               grep -qx 'step: MMGUARD_DECISION=accept' '$o'"
    expect "spec $what: nothing re-read at job start (no new decision logged)" test "$(log_lines)" -eq "$n1"
done

# unreadable (user), FIFO, directory: no hang, clear error, on_error applied
mkfifo -m 0666 "$work/spec-fifo.yaml"
mkdir -p "$work/spec-dir.yaml"
for policy in reject allow; do
    conf "action=reject" "on_error=$policy" "log=$LOG"
    for kind in unreadable fifo dir; do
        case $kind in
        unreadable) spec=$ROOTSPEC; re="$ROOTSPEC: cannot open: Permission denied" ;;
        fifo) spec=$work/spec-fifo.yaml; re="spec-fifo.yaml: not a regular file" ;;
        dir) spec=$work/spec-dir.yaml; re="spec-dir.yaml: (not a regular file|Is a directory)" ;;
        esac
        o=$work/uout/$kind-$policy.out
        if [ $kind = unreadable ]; then as_user sbatch -o "$o" --mm-model="$spec" --gres=gpu:h100:1 "$work/job.sh"
        else run sbatch -o "$o" --mm-model="$spec" --gres=gpu:h100:1 "$work/job.sh"; fi
        if [ $policy = reject ]; then
            expect "spec $kind, on_error=reject: no hang, exit 1, clear error" \
                sh -c "[ $rc -eq 1 ] && grep -Eq 'error: mmguard: --mm-model=$spec: invalid spec: .*$re' '$work/err' &&
                       grep -q 'on_error=reject: job not submitted' '$work/err' && ! grep -q Submitted '$work/out'"
        else
            id=$(jobid)
            expect "spec $kind, on_error=allow: no hang, submitted with the error as a warning" \
                sh -c "[ $rc -eq 0 ] && [ -n '$id' ] && grep -Eq '^sbatch: mmguard: --mm-model=$spec: invalid spec: .*$re' '$work/err' &&
                       grep -q 'on_error=allow: submitting without a GPU memory check' '$work/err' && ! grep -q 'error:' '$work/err'"
            st=$(wait_job "$id"); cp "$o" "$work/out" 2>/dev/null
            expect "spec $kind, on_error=allow: job ran ($st) with MMGUARD_DECISION=error, no prediction" \
                sh -c "[ '$st' = COMPLETED ] && grep -qx 'step: MMGUARD_DECISION=error' '$o' && ! grep -q PEAK_BYTES '$o'"
        fi
    done
done
conf "$@"

# ---- 3. a root-only spec cannot leak to a user --------------------------------------
# (a) named with --mm-model: the user's sbatch cannot read it (checked above,
#     with both policies); (b) forged option / SLURM_SPANK_* / SPANK_* variables
#     pointing at it: the check is skipped or refused in sbatch, and slurmstepd
#     (root) only copies validated strings -- it never opens a file (remote.c).
o=$work/uout/forged.out
as_user env SLURM_SPANK__SLURM_SPANK_OPTION_mmguard_mm_model="$ROOTSPEC" \
    SLURM_SPANK_MMGUARD="v=4 decision=accept spec=$ROOTSPEC" SLURM_SPANK_MMGUARD_SPEC="$ROOTSPEC" \
    SPANK_MMGUARD="v=4 decision=accept spec=$ROOTSPEC" sbatch -o "$o" --gres=gpu:h100:1 "$work/job.sh"
expect "forged option env without a job: the user's sbatch checks it and cannot read it (rc 1)" \
    sh -c "[ $rc -eq 1 ] && grep -q 'cannot open: Permission denied' '$work/err'"
as_user env SLURM_JOB_ID=1 SLURM_SPANK__SLURM_SPANK_OPTION_mmguard_mm_model="$ROOTSPEC" \
    SLURM_SPANK_MMGUARD="v=4 decision=accept spec=$ROOTSPEC" SLURM_SPANK_MMGUARD_SPEC="$ROOTSPEC" \
    SPANK_MMGUARD="v=4 model=$ROOTSPEC" sbatch -o "$o" "$work/job.sh"
id=$(jobid); st=$(wait_job "$id")
expect "forged option env as if inside a job: submitted unchecked ($st), no forged SLURM_SPANK_MMGUARD reaches it" \
    sh -c "[ $rc -eq 0 ] && [ '$st' = COMPLETED ] && ! grep -q 'SLURM_SPANK_MMGUARD' '$o'"
as_user env SLURM_SPANK_MMGUARD="v=4 decision=accept spec=$ROOTSPEC" \
    SPANK_MMGUARD="v=4 decision=accept spec=$ROOTSPEC" \
    srun -n1 -o "$work/uout/forged-srun.out" sh -c 'env | grep MMGUARD_; true'
expect "forged SLURM_SPANK_MMGUARD on srun: step runs (rc $rc)" test "$rc" -eq 0
as_user sbatch -o "$work/uout/forged-direct.out" --mm-model="$SMALL" --gres=gpu:h100:1 \
    --export=ALL,SLURM_SPANK_MMGUARD="v=4 spec=$ROOTSPEC",SPANK_MMGUARD="v=4 model=$ROOTSPEC" "$work/job.sh"
id=$(jobid); st=$(wait_job "$id")
expect "--export of forged values with a real --mm-model: job ran ($st) with its own checked spec" \
    sh -c "[ '$st' = COMPLETED ] && grep -qx 'step: MMGUARD_SPEC=$SMALL' '$work/uout/forged-direct.out'"
grep -rl -- "$MARKER" "$work/uout" "$work"/job-*.out "$LOG" "$CLUSTER_DIR/log" >"$work/out" 2>/dev/null
expect "no job output, job environment, decision log or Slurm log holds the root-only spec's contents" \
    test ! -s "$work/out"
expect "the root-only spec was not modified" sh -c "grep -q '$MARKER' '$ROOTSPEC' && [ \$(stat -c %a '$ROOTSPEC') = 600 ]"

# ---- 4. slurmctld restarted ----------------------------------------------------------
run sbatch --hold -o "$work/pre.out" --mm-model="$SMALL" --gres=gpu:h100:1 "$work/job.sh"
pre=$(jobid); npre=$(log_lines)
ctld=$(cat "$CLUSTER_DIR/run/slurmctld.pid")
kill -TERM "$ctld" 2>/dev/null
i=0; while kill -0 "$ctld" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill -0 "$ctld" 2>/dev/null && kill -KILL "$ctld"
(timeout 30 sbatch --hold -o /dev/null --mm-model="$SMALL" --gres=gpu:h100:1 --wrap true >"$work/down.out" 2>"$work/down.err"
 echo $? >"$work/down.rc") &
down=$!
(
    setsid slurmctld -D -i >>"$CLUSTER_DIR/log/slurmctld.out" 2>&1 </dev/null &
    echo $! >"$CLUSTER_DIR/run/slurmctld.pid"
)
i=0; until timeout 5 scontrol ping >/dev/null 2>&1 || [ $i -ge 150 ]; do sleep 0.1; i=$((i + 1)); done
wait "$down"
cp "$work/down.err" "$work/err"; cp "$work/down.out" "$work/out"
expect "a submission while slurmctld was down: submitted after a retry or a clean error (rc $(cat "$work/down.rc"))" \
    sh -c "grep -q '^Submitted batch job' '$work/out' || { [ \$(cat '$work/down.rc') -eq 1 ] && grep -q 'Unable to contact' '$work/err'; }"
expect "slurmctld restarted (was $ctld, now $(cat "$CLUSTER_DIR/run/slurmctld.pid"))" sh -c "timeout 5 scontrol ping >/dev/null"
run sbatch -o "$work/post.out" --mm-model="$SMALL" --gres=gpu:h100:1 "$work/job.sh"
post=$(jobid)
expect "after the restart: accept still accepts" sh -c "[ $rc -eq 0 ] && [ -n '$post' ]"
run sbatch -o /dev/null --mm-model="$BIG" --gres=gpu:h100:1 --wrap true
expect "after the restart: reject still rejects" sh -c "[ $rc -eq 1 ] && grep -q 'job rejected' '$work/err'"
run sbatch -o /dev/null --mm-model="$SPECS/invalid.yaml" --gres=gpu:h100:1 --wrap true
expect "after the restart: invalid spec still refused" sh -c "[ $rc -eq 1 ] && grep -q 'invalid spec' '$work/err'"
timeout 10 scontrol release "$pre" >/dev/null 2>&1
st1=$(wait_job "$pre"); st2=$(wait_job "$post")
expect "job held across the restart and the new job run with their MMGUARD_* ($st1, $st2)" \
    sh -c "[ '$st1' = COMPLETED ] && [ '$st2' = COMPLETED ] &&
           grep -qx 'step: MMGUARD_PEAK_BYTES=$(log_field "$npre" peak_bytes)' '$work/pre.out' &&
           grep -Eq '^step: MMGUARD_PEAK_BYTES=[0-9]+$' '$work/post.out'"
cp "$LOG" "$work/err"
expect "decision log intact after all of the above" log_intact "$LOG"
: >"$work/err"

# ---- 5. plugin misconfiguration ---------------------------------------------------------
# Behaviour: sbatch --mm-model is refused naming the file:line / argument and
# the key (on_error itself is not trusted); slurmd starts and logs the error;
# sbatch/srun without --mm-model are untouched (no config read, no message).
cat >"$work/plain.sh" <<'SH'
#!/bin/sh
srun -n1 echo plain-ok
SH
# misconfig NAME CONF_FILE_LINES|- PLUGIN_ARGS MESSAGE_RE
misconfig() {
    _mc=$1; _lines=$2; _args=$3; _re=$4
    sh "$here/cluster.sh" stop >/dev/null 2>&1
    if [ "$_lines" = - ]; then
        PLUGIN=$PLUGIN PLUGIN_ARGS=$_args sh "$here/cluster.sh" start 2>"$work/err"
    else
        printf '%s\n' "$_lines" >"$work/mmguard.conf"
        MMGUARD_CONF=$work/mmguard.conf PLUGIN=$PLUGIN PLUGIN_ARGS=$_args sh "$here/cluster.sh" start 2>"$work/err"
    fi
    _up=$?
    : >"$work/out"
    expect "misconfig $_mc: slurmd starts and is up" sh -c "[ $_up -eq 0 ] && sh '$here/cluster.sh' status >/dev/null"
    . "$CLUSTER_DIR/env.sh"
    cp "$CLUSTER_DIR/log/slurmd.log" "$work/out" 2>/dev/null
    expect "misconfig $_mc: slurmd logs it" has "$CLUSTER_DIR/log/slurmd.log" "mmguard: configuration error.*$_re"
    run sbatch -o /dev/null --mm-model="$SMALL" --gres=gpu:h100:1 --wrap true
    _r=1; [ $rc -eq 1 ] && has "$work/err" "error: mmguard: plugin configuration error: .*$_re" && _r=0
    expect "misconfig $_mc: sbatch --mm-model refused (rc $rc) naming it" test $_r -eq 0
    run sbatch -o "$work/plain.out" "$work/plain.sh"
    _id=$(jobid); _st=$(wait_job "$_id")
    expect "misconfig $_mc: job without --mm-model runs ($_st), no mmguard message" \
        sh -c "[ $rc -eq 0 ] && [ '$_st' = COMPLETED ] && grep -qx plain-ok '$work/plain.out' && ! grep -q mmguard '$work/err'"
}
misconfig "unknown key" "margn=10%" "" "$work/cluster/etc/mmguard.conf:1: unknown key 'margn'"
misconfig "bad margin" "action=reject" "margin=150%" "plugstack.conf argument 2: margin: invalid value '150%'"
misconfig "unknown default GPU" "default_gpu=v100" "" "mmguard.conf: default_gpu: unknown GPU type 'v100'"
misconfig "missing config file" - "config=$work/no/such/mmguard.conf" "$work/no/such/mmguard.conf: cannot open config file: No such file or directory"
misconfig "not key=value" - "garbage" "plugstack.conf argument 1: expected key=value, got 'garbage'"

finish
