#!/bin/sh
# test_jobsubmit.sh - contrib/job_submit.lua in a real single-node Slurm
# (tests/slurm/cluster.sh with JobSubmitPlugins=lua and the mmguard SPANK plugin).
# Run by `make check-jobsubmit-slurm` (as root).
#   PLUGIN=spank_mmguard.so  MMGUARD=mmguard CLI  JOB_SUBMIT_LUA=job_submit.lua
#   KEEP=1 keeps the work directory.
# Prints "N passed, N failed" last; exit status 1 when anything failed.
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PLUGIN=${PLUGIN:-$root/build/spank_mmguard.so}
MMGUARD=${MMGUARD:-$root/build/mmguard}
JOB_SUBMIT_LUA=${JOB_SUBMIT_LUA:-$root/contrib/job_submit.lua}
SPECS=$root/tests/jobsubmit/specs
FITS=$SPECS/fits-h100x1.yaml       # fits one H100
RESIZE=$SPECS/resize-h100.yaml     # needs 3-4 H100s (ZeRO-3 shards over N)
SWITCH=$SPECS/resize-h200.yaml     # does not fit 4 H100s, fits H200s

. "$here/testlib.sh"
tl_start js
SHOW="out err show"
LOG=$work/plugin.jsonl
CTLD=$work/ctld.jsonl

start() { # start CONF_LINES...: fresh cluster with this mmguard.conf
    printf '%s\n' "$@" "log=$LOG" "ctld_log=$CTLD" >"$work/mmguard.conf"
    if ! MMGUARD_CONF=$work/mmguard.conf PLUGIN=$PLUGIN JOB_SUBMIT_LUA=$JOB_SUBMIT_LUA \
        GRES=h100:4,h200:4 sh "$here/cluster.sh" start 2>"$work/cluster.err"; then
        cat "$work/cluster.err"
        echo "Bail out! cluster did not start"
        fail=$((fail + 1)); finish
    fi
    . "$CLUSTER_DIR/env.sh"
}

show() { scontrol show job "$1" >"$work/show" 2>&1; }
# last_ctld KEY: field of the last job_submit.lua decision-log line
last_ctld() {
    python3 -c 'import json,sys; l=open(sys.argv[1]).read().splitlines(); print(json.loads(l[-1]).get(sys.argv[2]))' "$CTLD" "$1" 2>/dev/null
}
ctld_lines() { if [ -f "$CTLD" ]; then wc -l <"$CTLD" | tr -d ' '; else echo 0; fi; }

for f in "$PLUGIN" "$MMGUARD" "$JOB_SUBMIT_LUA" "$RESIZE" "$SWITCH" "$FITS"; do
    [ -f "$f" ] || { echo "Bail out! $f missing (build first)"; exit 1; }
done
echo "# plugin $PLUGIN, job_submit.lua $JOB_SUBMIT_LUA"
cd "$work" || exit 1

# The job prints what a training launcher would use to size itself.
cat >"$work/job.sh" <<'SH'
#!/bin/sh
n=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
echo "gpus=$n CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES SLURM_GPUS_ON_NODE=${SLURM_GPUS_ON_NODE:-} SLURM_GPUS_PER_NODE=${SLURM_GPUS_PER_NODE:-} MMGUARD_ADMISSION=${MMGUARD_ADMISSION:-}"
SH

# ---- action=resize: more GPUs of the same type --------------------------------
start "action=resize" "margin=5%" "reserve=1GiB" "max_gpus_per_node=4" "resize_types=h200" "on_error=reject"

run sbatch --mm-model="$RESIZE" --gres=gpu:h100:2 -o "$work/resize.out" "$work/job.sh"
id=$(jobid)
cp "$work/err" "$work/resize.err"
expect "resize: job submitted (rc 0, id)" test "$rc" -eq 0 -a -n "$id"
expect "resize: user is told about the resize" has "$work/err" 'mmguard: .*job resized to gpu:h100:[34]'
show "$id"
new=$(sed -n 's/.*TresPerNode=gres:gpu:h100:\([0-9]*\).*/\1/p' "$work/show")
expect "resize: TresPerNode raised to gres:gpu:h100:3 or :4 (got '$new')" sh -c "[ '$new' = 3 ] || [ '$new' = 4 ]"
expect "resize: AdminComment records old -> new and the prediction" \
    has "$work/show" "AdminComment=mmguard: resized gpu:h100:2 -> gpu:h100:$new, predicted [0-9.]+ GiB/GPU"
st=$(wait_job "$id")
expect "resize: job ran ($st)" test "$st" = COMPLETED
expect "resize: CUDA_VISIBLE_DEVICES inside the job shows $new GPUs" has "$work/resize.out" "^gpus=$new "
expect "resize: ctld log says resize with old and new tres" \
    sh -c "[ '$(last_ctld decision)' = resize ] && [ '$(last_ctld requested_tres)' = gres:gpu:h100:2 ] && [ '$(last_ctld new_tres)' = gres:gpu:h100:$new ]"
cp "$work/show" "$work/resize.show"

# --gpus-per-node: the job's SLURM_GPUS_PER_NODE follows the new count
run sbatch --mm-model="$RESIZE" --gpus-per-node=h100:2 -o "$work/gpn.out" "$work/job.sh"
id=$(jobid); show "$id"; st=$(wait_job "$id")
expect "resize --gpus-per-node: TresPerNode and SLURM_GPUS_PER_NODE in the job follow ($st)" \
    sh -c "grep -q 'TresPerNode=gres:gpu:h100:$new' '$work/show' && grep -q '^gpus=$new .*SLURM_GPUS_PER_NODE=h100:$new ' '$work/gpn.out'"

# ---- type switch when 4 H100s (the per-node maximum) are not enough -------------
run sbatch --mm-model="$SWITCH" --gres=gpu:h100:2 -o "$work/switch.out" "$work/job.sh"
id=$(jobid); show "$id"
tsw=$(sed -n 's/.*TresPerNode=gres:gpu:h200:\([0-9]*\).*/\1/p' "$work/show")
expect "type switch: TresPerNode=gres:gpu:h200:N (N=$tsw <= 4)" sh -c "[ -n '$tsw' ] && [ '$tsw' -le 4 ]"
expect "type switch: AdminComment gpu:h100:2 -> gpu:h200:$tsw" has "$work/show" "AdminComment=mmguard: resized gpu:h100:2 -> gpu:h200:$tsw,"
st=$(wait_job "$id")
expect "type switch: job ran on $tsw GPUs ($st)" sh -c "[ '$st' = COMPLETED ] && grep -q '^gpus=$tsw ' '$work/switch.out'"

# ---- the values the plugin really publishes: Lua peak(N) == mmguard predict at N ----
run salloc --mm-model="$RESIZE" --gres=gpu:h100:4 sh -c 'echo "$SLURM_SPANK_MMGUARD_PEAK_MODEL dp1=$SLURM_SPANK_MMGUARD_ALLOC_DP1_BYTES"'
: >"$work/cases"
for n in 1 2 3 4 6 8 16; do
    peak=$("$MMGUARD" predict "$RESIZE" --json --set "training.data_parallel=$n" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_bytes"])')
    printf '%s\t%s\t%s\n' "$peak" "$n" "$(cat "$work/out")" >>"$work/cases"
done
lua=$(command -v lua5.1 || command -v lua5.3 || command -v lua)
expect "published MMGUARD_PEAK_MODEL + MMGUARD_ALLOC_DP1_BYTES: Lua peak(N) equals mmguard predict for N=1..16" \
    sh -c "[ $rc -eq 0 ] && grep -q '^v1 ' '$work/out' && '$lua' '$root/tests/jobsubmit/peak_check.lua' '$JOB_SUBMIT_LUA' '$work/cases' >'$work/err' 2>&1"

# ---- fitting job and job without --mm-model: untouched --------------------------
run sbatch --mm-model="$FITS" --gres=gpu:h100:1 -o /dev/null "$work/job.sh"
id=$(jobid); show "$id"
expect "fits: accepted untouched (TresPerNode=gres:gpu:h100:1, no AdminComment)" \
    sh -c "[ $rc -eq 0 ] && grep -q 'TresPerNode=gres:gpu:h100:1' '$work/show' && ! grep -q 'AdminComment=mmguard' '$work/show' && [ '$(last_ctld decision)' = accept ]"
n0=$(ctld_lines)
run sbatch --gres=gpu:h100:1 -o "$work/plain.out" "$work/job.sh"
id=$(jobid); show "$id"; st=$(wait_job "$id")
expect "no --mm-model: untouched, ran on 1 GPU, no decision logged" \
    sh -c "[ $rc -eq 0 ] && grep -q 'TresPerNode=gres:gpu:h100:1' '$work/show' && ! grep -q 'AdminComment=mmguard' '$work/show' && grep -q '^gpus=1 ' '$work/plain.out' && [ $(ctld_lines) -eq $n0 ] && ! grep -q mmguard '$work/err'"

# ---- per-node maximum: no type to switch to -> reject ---------------------------
start "action=resize" "margin=5%" "reserve=1GiB" "max_gpus_per_node=4" "on_error=reject"
njobs=$(squeue -h | wc -l)
run sbatch --mm-model="$SWITCH" --gres=gpu:h100:2 -t 30 -o /dev/null "$work/job.sh"
expect "per-node maximum: nothing fits in 4 H100s -> sbatch exit 1" test "$rc" -eq 1
expect "per-node maximum: message says no resize fits up to 4 GPUs/node" \
    has "$work/err" 'mmguard: job rejected: .*no resize fits \(up to 4 GPUs/node of h100\)'
expect "per-node maximum: nothing queued, ctld log says reject" \
    sh -c "[ \$(squeue -h | wc -l) -eq $njobs ] && [ '$(last_ctld decision)' = reject ]"

# ---- action=reject at slurmctld ---------------------------------------------------
# The plugin in sbatch checks the spec's own data_parallel (4: fits); only slurmctld
# sees that the job asks for 2 GPUs, and rejects it.
start "action=reject" "margin=5%" "reserve=1GiB" "on_error=reject"
run sbatch --mm-model="$RESIZE" --gres=gpu:h100:2 -t 30 -o /dev/null "$work/job.sh"
expect "reject: sbatch exit 1" test "$rc" -eq 1
expect "reject: the message names the peak, the data-parallel degree and the usable memory" \
    has "$work/err" 'mmguard: job rejected: predicted peak [0-9.]+ GiB/GPU at 2-way data parallel exceeds [0-9.]+ GiB usable on h100'
expect "reject: ctld log line with gpus and time limit" \
    sh -c "[ '$(last_ctld decision)' = reject ] && [ '$(last_ctld gpus)' = 2 ] && [ '$(last_ctld time_limit_minutes)' = 30 ] && [ '$(last_ctld source)' = slurmctld ]"
run sbatch --mm-model="$RESIZE" --gres=gpu:h100:4 -t 90 -o /dev/null "$work/job.sh"
expect "reject mode: the same spec on 4 GPUs is accepted" sh -c "[ $rc -eq 0 ] && [ '$(last_ctld decision)' = accept ]"

# ---- action=warn ---------------------------------------------------------------------
start "action=warn" "margin=5%" "reserve=1GiB"
run sbatch --mm-model="$RESIZE" --gres=gpu:h100:2 -o /dev/null "$work/job.sh"
id=$(jobid); show "$id"
expect "warn: accepted unchanged with a warning" \
    sh -c "[ $rc -eq 0 ] && grep -q 'TresPerNode=gres:gpu:h100:2' '$work/show' && grep -q 'mmguard: WARNING' '$work/err' && [ '$(last_ctld decision)' = warn ]"

# ---- no usable published prediction: on_error --------------------------------------
# With on_error=allow the plugin submits a job whose spec is invalid, publishing
# MMGUARD_DECISION=error and no MMGUARD_PEAK_MODEL; slurmctld applies on_error.
start "action=resize" "on_error=allow"
run sbatch --mm-model="$root/tests/slurm/specs/invalid.yaml" --gres=gpu:h100:1 -o /dev/null "$work/job.sh"
id=$(jobid); show "$id"
expect "no prediction + on_error=allow: accepted untouched, logged as error" \
    sh -c "[ $rc -eq 0 ] && grep -q 'TresPerNode=gres:gpu:h100:1' '$work/show' && [ '$(last_ctld decision)' = error ]"

# ---- mmguard report on the logs produced -------------------------------------------------
run "$MMGUARD" report "$CTLD" "$LOG"
expect "report: rc 0 and the human tables" \
    sh -c "[ $rc -eq 0 ] && grep -q '^Decisions' '$work/out' && grep -Eq '^  resize +[1-9]' '$work/out' && grep -q 'Rejected jobs: GPU-hours' '$work/out'"
cp "$work/out" "$work/report.txt"
run "$MMGUARD" report --json "$CTLD" "$LOG"
expect "report --json: 3 resize, 2 reject = 2.0 GPU-hours (2 GPUs x 30 min x 2), both sources, no malformed lines" python3 - "$work/out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
src = {s["source"] for s in r["sources"]}
g = r["rejected_gpu_hours"]
ok = (r["decisions"]["resize"] == 3 and r["decisions"]["reject"] == 2 and r["malformed"] == 0
      and {"slurmctld", "sbatch"} <= src and g["jobs"] == 2 and abs(g["gpu_hours"] - 2.0) < 1e-9
      and g["by_gpus"] == [{"gpus": 2, "jobs": 2, "unknown_time": 0, "gpu_hours": 2}])
if not ok:
    print("#", json.dumps(r["decisions"]), json.dumps(g))
sys.exit(0 if ok else 1)
PY
printf '{"decision":"accept"}\nnot json\n' >"$work/bad.jsonl"
run "$MMGUARD" report "$CTLD" "$work/bad.jsonl"
expect "report: a malformed line is listed as FILE:LINE, exit 0" \
    sh -c "[ $rc -eq 0 ] && grep -q 'bad.jsonl:2: invalid JSON' '$work/out'"

if [ "${SHOW:-0}" = 1 ] || [ -n "${TRANSCRIPT:-}" ]; then
    {
        echo "## resize: sbatch"; cat "$work/resize.err"
        echo "## resize: scontrol show job"; grep -E 'JobId=|TresPerNode|AdminComment' "$work/resize.show"
        echo "## job output"; cat "$work/resize.out"
        echo "## mmguard report"; cat "$work/report.txt"
    } >"${TRANSCRIPT:-/dev/stdout}"
fi
finish
