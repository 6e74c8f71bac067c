#!/bin/sh
# test_outcome.sh - closing the loop (issue 25) on a real single-node Slurm
# 22.05 (tests/slurm/cluster.sh): slurmstepd hands the job MMGUARD_RECORD, the
# job records with the Python recorder (python/mmguard, here without torch:
# host memory only, CUDA said absent), and when the batch step ends the plugin
# appends an "outcome" line to the decision log carrying the job id and the
# decision the job was published with; `mmguard report --json` joins it to the
# sbatch decision.  A record that is a symlink to a root file is refused and
# logged as "invalid", a job without a record leaves no outcome line, and both
# jobs complete.  Run by `make check-slurm` (root).  PLUGIN, MMGUARD_CLI; KEEP=1.
# Prints "N passed, N failed" last.
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PLUGIN=${PLUGIN:-$root/build/spank_mmguard.so}
MMGUARD_CLI=${MMGUARD_CLI:-$root/build/mmguard}
SMALL=$root/tests/slurm/specs/llava-lora-small.yaml

. "$here/testlib.sh"
tl_start outcome
RUN_TIMEOUT=60
LOG=$work/decisions.jsonl
unset MMGUARD_CONF SLURM_JOB_ID SBATCH_GRES MMGUARD_RECORD
for f in "$PLUGIN" "$MMGUARD_CLI" "$SMALL"; do
    [ -f "$f" ] || { echo "Bail out! $f missing (build first)"; exit 1; }
done
cd "$work" || exit 1
printf 'action=reject\nlog=%s\n' "$LOG" >"$work/mmguard.conf"
if ! MMGUARD_CONF=$work/mmguard.conf PLUGIN=$PLUGIN GRES=h100:4 sh "$here/cluster.sh" start \
    2>"$work/cluster.err"; then
    cat "$work/cluster.err"; echo "Bail out! cluster did not start"; exit 1
fi
. "$CLUSTER_DIR/env.sh"
# the jobs inherit TMPDIR: their records stay in this test's directory
export TMPDIR=$work/tmp
mkdir -p "$TMPDIR"

cat >"$work/record.sh" <<EOF
#!/bin/sh
echo "MMGUARD_RECORD=\$MMGUARD_RECORD"
PYTHONPATH=$root/python python3 - <<'PY'
import mmguard
rec = mmguard.Recorder()
for seq in (128, 512):
    rec.observe(micro_batch=2, seq_len=seq)
    rec.step_done()
rec.close()
PY
EOF
cat >"$work/symlink.sh" <<'EOF'
#!/bin/sh
ln -s /etc/shadow "$MMGUARD_RECORD"
EOF
printf '#!/bin/sh\ntrue\n' >"$work/none.sh"

submit() { # submit SCRIPT: $jid, and $st once it has ended
    st=none
    run sbatch -o "$work/$1.out" --gres=gpu:h100:1 --mm-model="$SMALL" "$work/$1.sh"
    jid=$(jobid)
    if [ -n "$jid" ]; then st=$(wait_job "$jid"); fi
}
# outcome JOB KEY: KEY (dotted) of the outcome line of JOB, "" if none
outcome() {
    python3 - "$LOG" "$1" "$2" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("event") == "outcome" and str(r.get("job_id")) == sys.argv[2]:
        v = r
        for k in sys.argv[3].split("."):
            v = v.get(k) if isinstance(v, dict) else None
        print("" if v is None else v)
PY
}

submit record
J1=$jid
expect "recorded job completed" [ "$st" = COMPLETED ]
expect "the job saw MMGUARD_RECORD in its TMPDIR" \
    has "$work/record.out" "^MMGUARD_RECORD=$TMPDIR/mmguard-record\\.$J1\\.batch\\.json\$"
expect "one outcome line for the job" [ "$(outcome "$J1" record_state)" = ok ]
expect "outcome: the step is batch" [ "$(outcome "$J1" step)" = batch ]
expect "outcome: measured status done after 2 steps" \
    [ "$(outcome "$J1" measured.status)/$(outcome "$J1" measured.steps)" = done/2 ]
expect "outcome: longest sequence and micro-batch" \
    [ "$(outcome "$J1" measured.max_seq_len)/$(outcome "$J1" measured.micro_batch)" = 512/2 ]
expect "outcome: host peak RSS measured" [ "$(outcome "$J1" measured.host_peak_rss_bytes)" -gt 1000000 ]
expect "outcome: CUDA absent on this node" [ "$(outcome "$J1" measured.cuda)" = False ]
expect "outcome: carries the decision it was published with" \
    [ "$(outcome "$J1" predicted.decision)" = accept ]
expect "outcome: the predicted peak" [ "$(outcome "$J1" predicted.peak_bytes)" -gt 0 ]

submit symlink
J2=$jid
expect "job with a symlinked record completed" [ "$st" = COMPLETED ]
expect "symlinked record refused, logged" [ "$(outcome "$J2" record_state)" = invalid ]
expect "the reason names the symlink" sh -c "echo '$(outcome "$J2" record_error)' | grep -q 'symbolic link'"
expect "nothing of the target read" [ -z "$(outcome "$J2" measured)" ]

submit none
J3=$jid
expect "job without a record completed" [ "$st" = COMPLETED ]
expect "no record, no outcome line (slurmd's debug log only)" [ -z "$(outcome "$J3" record_state)" ]

# a record left at the next job's path (job ids restart with a new cluster) is not that
# job's: removed when its step starts, so no outcome line; a record read is removed too
expect "a record read is removed once its outcome is logged" [ ! -e "$TMPDIR/mmguard-record.$J1.batch.json" ]
printf '{"v":1,"status":"done","phase":"step","steps":2,"rank":0,"world_size":1,"cuda":false}\n' \
    >"$TMPDIR/mmguard-record.$((J3 + 1)).batch.json"
submit none
J4=$jid
expect "stale record: the job id it was left for" [ "$J4" = "$((J3 + 1))" ]
expect "stale record: no outcome line for the new job" [ -z "$(outcome "$J4" record_state)" ]
expect "stale record: removed" [ ! -e "$TMPDIR/mmguard-record.$J4.batch.json" ]

run "$MMGUARD_CLI" report --json "$LOG"
cp "$work/out" "$work/report.json"
joined() {
    python3 - "$work/report.json" "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
jobs = {str(j["job_id"]): j for j in r["outcomes"]["jobs"]}
j = jobs[sys.argv[2]]
assert j["record_state"] == "ok", j
assert j["decision"]["decision"] == "accept" and j["decision"]["source"] == "sbatch", j
assert j["decision"]["line"] >= 1, j
assert j["measured"]["host_peak_rss_bytes"] > 0, j
print("ok")
PY
}
expect "report --json joins the outcome to its sbatch decision" [ "$(joined "$J1")" = ok ]
expect "report counts the two outcomes" \
    sh -c "python3 -c 'import json,sys; o=json.load(open(\"$work/report.json\"))[\"outcomes\"]; sys.exit(0 if (o[\"jobs_total\"], o[\"records\"][\"ok\"], o[\"records\"][\"invalid\"], o[\"records\"][\"missing\"]) == (2, 1, 1, 0) else 1)'"
finish
