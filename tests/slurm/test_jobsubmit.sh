#!/bin/sh
# test_jobsubmit.sh - contrib/job_submit.lua in a real single-node Slurm
# (tests/slurm/cluster.sh with JobSubmitPlugins=lua and the mmguard SPANK plugin).
# Run by `make check-jobsubmit-slurm` (as root).
#   PLUGIN=spank_mmguard.so  MMGUARD=mmguard CLI  JOB_SUBMIT_LUA=job_submit.lua
#   PEAK_TOOL=build/peak_tool
#   KEEP=1 keeps the work directory.
# Prints "N passed, N failed" last; exit status 1 when anything failed.
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PLUGIN=${PLUGIN:-$root/build/spank_mmguard.so}
MMGUARD=${MMGUARD:-$root/build/mmguard}
JOB_SUBMIT_LUA=${JOB_SUBMIT_LUA:-$root/contrib/job_submit.lua}
PEAK_TOOL=${PEAK_TOOL:-$root/build/peak_tool}
SPECS=$root/tests/jobsubmit/specs
FITS=$SPECS/fits-h100x1.yaml       # fits one H100
RESIZE=$SPECS/resize-h100.yaml     # needs 3-4 H100s (ZeRO-3 shards over N)
SWITCH=$SPECS/resize-h200.yaml     # does not fit 4 H100s, fits H200s

. "$here/testlib.sh"
tl_start js
SHOW="out err show"
LOG=$work/plugin.jsonl
CTLD=$work/ctld.jsonl

start() { # start CONF_LINES...: fresh cluster with this mmguard.conf (next to
    # slurm.conf, where job_submit.lua finds it by default)
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

for f in "$PLUGIN" "$MMGUARD" "$JOB_SUBMIT_LUA" "$RESIZE" "$SWITCH" "$FITS" "$PEAK_TOOL"; do
    [ -f "$f" ] || { echo "Bail out! $f missing (build first)"; exit 1; }
done
echo "# plugin $PLUGIN, job_submit.lua $JOB_SUBMIT_LUA"
cd "$work" || exit 1

# The job prints what a training launcher would use to size itself.
cat >"$work/job.sh" <<'SH'
#!/bin/sh
n=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
echo "gpus=$n CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES SLURM_GPUS_ON_NODE=${SLURM_GPUS_ON_NODE:-} SLURM_GPUS_PER_NODE=${SLURM_GPUS_PER_NODE:-} MMGUARD_ADMISSION=${MMGUARD_ADMISSION:-} MMGUARD_DATA_PARALLEL=${MMGUARD_DATA_PARALLEL:-}"
srun -n1 sh -c 'echo "step: MMGUARD_DATA_PARALLEL=$MMGUARD_DATA_PARALLEL"'
SH

# ---- action=resize: more GPUs of the same type --------------------------------
start "action=resize" "margin=5%" "reserve=1GiB" "max_gpus_per_node=4" "resize_types=h200" "on_error=reject"

run sbatch --mm-model="$RESIZE" --gres=gpu:h100:2 -o "$work/resize.out" "$work/job.sh"
id=$(jobid)
cp "$work/err" "$work/resize.err"
expect "resize: job submitted (rc 0, id)" test "$rc" -eq 0 -a -n "$id"
expect "resize: user is told about the resize" has "$work/err" 'mmguard: .*job resized to gpu:h100:[34]'
expect "resize: the plugin in sbatch already said it does not fit 2 GPUs" \
    has "$work/err" 'mmguard: --mm-model=.*: warning: predicted peak .* does not fit h100 .* with 2 GPUs \(--gres=gpu:h100:2 on 1 node\)'
show "$id"
new=$(sed -n 's/.*TresPerNode=gres:gpu:h100:\([0-9]*\).*/\1/p' "$work/show")
expect "resize: TresPerNode raised to gres:gpu:h100:3 or :4 (got '$new')" sh -c "[ '$new' = 3 ] || [ '$new' = 4 ]"
expect "resize: AdminComment records old -> new and the prediction" \
    has "$work/show" "AdminComment=mmguard: resized gpu:h100:2 -> gpu:h100:$new, predicted [0-9.]+ GiB/GPU"
st=$(wait_job "$id")
expect "resize: job ran ($st)" test "$st" = COMPLETED
expect "resize: CUDA_VISIBLE_DEVICES inside the job shows $new GPUs" has "$work/resize.out" "^gpus=$new "
expect "resize: the job and its steps see MMGUARD_DATA_PARALLEL=$new (the record follows the resize)" \
    sh -c "grep -q 'MMGUARD_DATA_PARALLEL=$new\$' '$work/resize.out' && grep -q '^step: MMGUARD_DATA_PARALLEL=$new\$' '$work/resize.out'"
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

# ---- the values the plugin really publishes: Lua peak(N) == C mm_peak_for_dp(N) ----
run salloc --mm-model="$RESIZE" --gres=gpu:h100:4 sh -c 'echo "$SLURM_SPANK_MMGUARD"'
rec=$(grep '^v=4 ' "$work/out")
lua=$(command -v lua5.1 || command -v lua5.3 || command -v lua)
"$PEAK_TOOL" record "$rec" >"$work/cases" 2>"$work/err"
expect "published MMGUARD record (replayed where job_submit.lua may resize): job_submit.lua's peak(N) equals mm_peak_for_dp(N) for N=1..4096" \
    sh -c "[ $rc -eq 0 ] && grep -q ' res=[1-9]' '$work/cases' && '$lua' '$root/tests/jobsubmit/peak_check.lua' '$JOB_SUBMIT_LUA' '$work/cases' >'$work/err' 2>&1"

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

# ---- fits with cache flushes: flush=warn|accept|reject at slurmctld ---------------
# llava-1.5-7b-finetune (ZeRO-3) on 4 GPUs of 60 GiB: runs only with cache flushes
# (1 cudaMalloc retry per step); on 4 H200s it fits.  job_submit.lua decides by
# the verdicts the plugin published (cards=), the same as `mmguard check`.
# (its own logs: the report below counts the others)
FLUSH=$root/contrib/models/llava-1.5-7b-finetune.yaml
saved_logs="$LOG $CTLD"
LOG=$work/flush-plugin.jsonl CTLD=$work/flush-ctld.jsonl
start "action=reject" "margin=0" "gpu.h100=60GiB" "max_gpus_per_node=4" "resize_types=h200"
conf() { printf '%s\n' "margin=0" "gpu.h100=60GiB" "max_gpus_per_node=4" "resize_types=h200" \
    "log=$LOG" "ctld_log=$CTLD" "$@" >"$CLUSTER_DIR/etc/mmguard.conf"; }
cli_verdict() { "$MMGUARD" check "$FLUSH" --gpu-mem "$1" --margin 0 --set training.data_parallel=4 --json |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["verdict"], d["alloc_retries_per_step"], d["peak_bytes"])'; }
want=$(cli_verdict 60GiB)
ctld_verdict() { echo "$(last_ctld verdict) $(last_ctld alloc_retries_per_step) $(last_ctld card_peak_bytes)"; }

run sbatch --hold --mm-model="$FLUSH" --gres=gpu:h100:4 -o /dev/null --wrap true
expect "flush=warn (default) at slurmctld: submitted, the warning says the retries and the cost" \
    sh -c "[ $rc -eq 0 ] && grep -q 'mmguard: WARNING: predicted peak .* fits h100 .* with 4 GPUs (gres:gpu:h100:4 on 1 node) only with cache flushes (1 cudaMalloc retry per step); the caching allocator frees its cache and retries cudaMalloc; each flush synchronises the device: slower, not out of memory (flush=warn)' '$work/err'"
expect "flush=warn: ctld log warn with the verdict of \`mmguard check --json\` ($want)" \
    sh -c "[ '$(last_ctld decision)' = warn ] && [ '$(ctld_verdict)' = '$want' ] && [ '$(last_ctld flush)' = warn ]"

conf "action=reject" "flush=accept"
run sbatch --hold --mm-model="$FLUSH" --gres=gpu:h100:4 -o /dev/null --wrap true
expect "flush=accept at slurmctld: accepted, an info line, no warning" \
    sh -c "[ $rc -eq 0 ] && grep -q 'mmguard: predicted peak .* only with cache flushes .*(flush=accept)' '$work/err' && ! grep -qi 'warning' '$work/err' && [ '$(last_ctld decision)' = accept ] && [ '$(last_ctld verdict)' = flushes ]"

# the plugin judges 4 H200s (--mm-gpu: fits), slurmctld the 4 H100s the job asks for
conf "action=reject" "flush=reject"
run sbatch --hold --mm-model="$FLUSH" --mm-gpu=h200 --gres=gpu:h100:4 -o /dev/null --wrap true
expect "flush=reject at slurmctld: rejected as a misfit (the plugin accepted 4 H200s)" \
    sh -c "[ $rc -ne 0 ] && grep -q 'mmguard: job rejected: predicted peak .* fits h100 .* only with cache flushes .*; flush=reject' '$work/err' && [ '$(last_ctld decision)' = reject ] && [ '$(last_ctld verdict)' = flushes ]"

conf "action=resize" "flush=reject"
run sbatch --hold --mm-model="$FLUSH" --gres=gpu:h100:4 -o /dev/null --wrap true
id=$(jobid); show "$id"
expect "flush=reject, action=resize: moved to 4 H200s, where it fits without flushes" \
    sh -c "[ $rc -eq 0 ] && grep -q 'TresPerNode=gres:gpu:h200:4' '$work/show' && [ '$(last_ctld decision)' = resize ] && [ '$(last_ctld new_verdict)' = fits ]"
conf "action=resize"
run sbatch --hold --mm-model="$FLUSH" --gres=gpu:h100:4 -o /dev/null --wrap true
id=$(jobid); show "$id"
expect "flush=warn, action=resize: not moved (it runs), warned" \
    sh -c "[ $rc -eq 0 ] && grep -q 'TresPerNode=gres:gpu:h100:4' '$work/show' && [ '$(last_ctld decision)' = warn ]"
conf "action=reject" "gpu.h100=50GiB"
want=$(cli_verdict 50GiB)
run sbatch --hold --mm-model="$FLUSH" --mm-gpu=h200 --gres=gpu:h100:4 -o /dev/null --wrap true
expect "out of memory on 50 GiB at slurmctld: rejected; the verdict is \`mmguard check\`'s ($want)" \
    sh -c "[ $rc -ne 0 ] && grep -q 'mmguard: job rejected: predicted peak .* does not fit h100 (50.0 GiB usable of 50.0 GiB) with 4 GPUs (gres:gpu:h100:4 on 1 node): out of memory' '$work/err' && [ '$(ctld_verdict)' = '$want' ]"
scancel -u "$(id -un)" 2>/dev/null
set -- $saved_logs; LOG=$1 CTLD=$2

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
# The plugin judges the request it rebuilds in sbatch; --mm-gpus=4 makes it
# judge 4 GPUs (the user's word), but slurmctld judges the 2 the job asks for.
start "action=reject" "margin=5%" "reserve=1GiB" "on_error=reject"
run sbatch --mm-model="$RESIZE" --mm-gpus=4 --gres=gpu:h100:2 -t 30 -o /dev/null "$work/job.sh"
expect "reject: sbatch exit 1" test "$rc" -eq 1
expect "reject: the message names the peak, the GPU count and the usable memory" \
    has "$work/err" 'mmguard: job rejected: predicted peak [0-9.]+ GiB per GPU does not fit h100 \([0-9.]+ GiB usable of [0-9.]+ GiB\) with 2 GPUs \(gres:gpu:h100:2 on 1 node\): out of memory; to fit: ask for [34] GPUs per node'
expect "reject: ctld log line with gpus, time limit and the plugin's own N" \
    sh -c "[ '$(last_ctld decision)' = reject ] && [ '$(last_ctld gpus)' = 2 ] && [ '$(last_ctld time_limit_minutes)' = 30 ] && [ '$(last_ctld source)' = slurmctld ] && [ '$(last_ctld plugin_data_parallel)' = 4 ]"
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

# ---- require= for GPU jobs without --mm-model ---------------------------------------
start "action=reject" "require=reject"
run sbatch --gres=gpu:h100:1 -o /dev/null --wrap true
expect "require=reject: a GPU job without --mm-model is refused, saying why" \
    sh -c "[ $rc -eq 1 ] && grep -q 'mmguard: job rejected: GPU job without --mm-model (require=reject)' '$work/err' && [ '$(last_ctld decision)' = reject ]"
run sbatch -o /dev/null --wrap true
expect "require=reject: a job without GPUs is untouched" test "$rc" -eq 0
start "action=reject" "require=warn"
run sbatch --gpus=1 -o /dev/null --wrap true
expect "require=warn: accepted with a warning" \
    sh -c "[ $rc -eq 0 ] && grep -q 'mmguard: WARNING: GPU job without --mm-model (require=warn)' '$work/err'"

# ---- where job_submit.lua finds mmguard.conf ----------------------------------------
# next to slurm.conf by default (every cluster above); MMGUARD_CONF in
# slurmctld's environment overrides it
printf '%s\n' "action=warn" "require=reject" "ctld_log=$CTLD" >"$work/other.conf"
CTLD_MMGUARD_CONF=$work/other.conf start "action=reject" "require=off"
run sbatch --gres=gpu:h100:1 -o /dev/null --wrap true
expect "MMGUARD_CONF of slurmctld overrides mmguard.conf next to slurm.conf" \
    sh -c "[ $rc -eq 1 ] && grep -q 'require=reject' '$work/err'"
grep -q "mmguard: job_submit.lua loaded (mmguard.conf: $work/other.conf)" "$CLUSTER_DIR/log/slurmctld.log"
expect "slurmctld's log names the mmguard.conf in use" test $? -eq 0

# ---- ctld_log: never through a symlink ------------------------------------------------
mkdir -p "$work/ctlddir" && echo keep >"$work/ctlddir/target"
ln -s "$work/ctlddir/target" "$work/ctlddir/link"
start "action=reject"
sed -i "s|^ctld_log=.*|ctld_log=$work/ctlddir/link|" "$CLUSTER_DIR/etc/mmguard.conf"
run sbatch --mm-model="$FITS" --gres=gpu:h100:1 -o /dev/null "$work/job.sh"
expect "ctld_log a symlink: the decision stands, the target is unchanged, slurmctld says why" \
    sh -c "[ $rc -eq 0 ] && [ \"\$(cat '$work/ctlddir/target')\" = keep ] &&
           grep -q 'ctld_log=$work/ctlddir/link: cannot append the decision record: it is a symbolic link' '$CLUSTER_DIR/log/slurmctld.log'"

if [ "${SHOW:-0}" = 1 ] || [ -n "${TRANSCRIPT:-}" ]; then
    {
        echo "## resize: sbatch"; cat "$work/resize.err"
        echo "## resize: scontrol show job"; grep -E 'JobId=|TresPerNode|AdminComment' "$work/resize.show"
        echo "## job output"; cat "$work/resize.out"
        echo "## mmguard report"; cat "$work/report.txt"
    } >"${TRANSCRIPT:-/dev/stdout}"
fi
finish
