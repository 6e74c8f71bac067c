#!/bin/sh
# test_request.sh - every way of asking for GPUs is judged on the job's own
# GPUs, on a real single-node Slurm (tests/slurm/cluster.sh, GRES h100:4 +
# h200:4), first with the SPANK plugin alone, then with job_submit.lua too:
# sbatch --gres / --gpus / -G / --gpus-per-node / --gpus-per-task x -n / -N,
# #SBATCH lines, SBATCH_* / SALLOC_* / SLURM_* variables and their order of
# precedence, salloc, srun, srun steps inside salloc and inside a batch job,
# a node range, no GPU, --mm-gpus.  The spec (ZeRO-3, written for 4 GPUs)
# does not fit 2 H100s and fits 4, so each way is tried with 2 (refused) and
# 4 (accepted).  Then the request the plugin rebuilds is held against what
# slurmctld records for held jobs (scontrol show job).
# Run by `make check-slurm` (root).  PLUGIN, REQUEST_TOOL; KEEP=1 keeps the
# work directory.  Prints "N passed, N failed" last.
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PLUGIN=${PLUGIN:-$root/build/spank_mmguard.so}
REQUEST_TOOL=${REQUEST_TOOL:-$root/build/request_tool}
JOB_SUBMIT_LUA=${JOB_SUBMIT_LUA:-$root/contrib/job_submit.lua}
SPEC=$root/tests/jobsubmit/specs/resize-h100.yaml

. "$here/testlib.sh"
tl_start req
RUN_TIMEOUT=60
LOG=$work/plugin.jsonl
CTLD=$work/ctld.jsonl
unset MMGUARD_CONF SBATCH_GRES SBATCH_GPUS SALLOC_GPUS SLURM_GPUS SLURM_JOB_ID

for f in "$PLUGIN" "$REQUEST_TOOL" "$SPEC" "$JOB_SUBMIT_LUA"; do
    [ -f "$f" ] || { echo "Bail out! $f missing (build first)"; exit 1; }
done
cd "$work" || exit 1

start() { # start with|without: job_submit.lua installed or not
    printf '%s\n' "action=reject" "margin=5%" "reserve=1GiB" "on_error=reject" \
        "log=$LOG" "ctld_log=$CTLD" >"$work/mmguard.conf"
    rm -f "$LOG" "$CTLD"
    if [ "$1" = with ]; then lua=$JOB_SUBMIT_LUA; else lua=""; fi
    if ! MMGUARD_CONF=$work/mmguard.conf PLUGIN=$PLUGIN JOB_SUBMIT_LUA=$lua GRES=h100:4,h200:4 \
        sh "$here/cluster.sh" start 2>"$work/cluster.err"; then
        cat "$work/cluster.err"; echo "Bail out! cluster did not start"; exit 1
    fi
    . "$CLUSTER_DIR/env.sh"
}

# A batch script with optional #SBATCH lines (arguments), then a command.
script() { # script FILE DIRECTIVE...
    _f=$1; shift
    { echo "#!/bin/sh"; for _d in "$@"; do echo "#SBATCH $_d"; done; echo "true"; } >"$_f"
}
script "$work/plain.sh"
script "$work/dir2.sh" "--gres=gpu:h100:2"
script "$work/dir4.sh" "--gres=gpu:h100:4"
script "$work/dir_n2.sh" "-N 2"

# refused WAY ARGS...: the plugin refuses the job, naming 2 GPUs
refused() {
    _way=$1; shift
    run "$@"
    expect "$mode: $_way: refused on the 2 GPUs asked for" \
        sh -c "[ $rc -ne 0 ] && grep -q 'job rejected: predicted peak .* does not fit h100 .* with 2 GPUs' '$work/err' &&
               ! grep -q 'Submitted batch job' '$work/out'"
}
# accepted WAY ARGS...: the plugin accepts on 4 GPUs; with job_submit.lua,
# slurmctld judged the same 4 GPUs and the same request as the plugin
accepted() {
    _way=$1; shift
    _before=$(ctld_lines)
    run "$@"
    expect "$mode: $_way: accepted on the 4 GPUs asked for" \
        sh -c "[ $rc -eq 0 ] && grep -q 'mmguard: .* fits h100 .* with 4 GPUs' '$work/err'"
    if [ "$mode" = with ]; then
        expect "$mode: $_way: slurmctld judged the same 4 GPUs and request" same_as_plugin "$_before"
    fi
}
ctld_lines() { if [ -f "$CTLD" ]; then wc -l <"$CTLD" | tr -d ' '; else echo 0; fi; }
same_as_plugin() { # the new ctld line: gpus 4, request == the plugin's
    [ "$(ctld_lines)" -gt "$1" ] && python3 - "$CTLD" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
ok = r["gpus"] == 4 and r["request"] == r["plugin_request"] and r["plugin_data_parallel"] == 4
if not ok:
    print("#", r["decision"], r["gpus"], r["request"], r["plugin_request"], r["plugin_data_parallel"])
sys.exit(0 if ok else 1)
PY
}

SB="sbatch --hold -o /dev/null --mm-model=$SPEC"
matrix() {
    refused "sbatch --gres" $SB --gres=gpu:h100:2 "$work/plain.sh"
    accepted "sbatch --gres" $SB --gres=gpu:h100:4 "$work/plain.sh"
    refused "sbatch --gpus" $SB --gpus=h100:2 "$work/plain.sh"
    accepted "sbatch -G" $SB -G 4 "$work/plain.sh"
    refused "sbatch --gpus-per-node" $SB --gpus-per-node=2 "$work/plain.sh"
    accepted "sbatch --gpus-per-node" $SB --gpus-per-node=h100:4 "$work/plain.sh"
    refused "sbatch --gpus-per-task x -n" $SB --gpus-per-task=1 -n 2 "$work/plain.sh"
    accepted "sbatch --gpus-per-task x -n" $SB --gpus-per-task=2 -n 2 "$work/plain.sh"
    refused "sbatch -N 2 --gres (1 per node)" $SB -N 2 --gres=gpu:h100:1 "$work/plain.sh"
    refused "#SBATCH --gres" $SB "$work/dir2.sh"
    accepted "#SBATCH --gres" $SB "$work/dir4.sh"
    refused "#SBATCH -N 2 with --gres on the command line" $SB --gres=gpu:h100:1 "$work/dir_n2.sh"
    refused "command line over #SBATCH" $SB --gres=gpu:h100:2 "$work/dir4.sh"
    accepted "command line over #SBATCH" $SB --gres=gpu:h100:4 "$work/dir2.sh"
    refused "SBATCH_GRES" env SBATCH_GRES=gpu:h100:2 $SB "$work/plain.sh"
    accepted "SBATCH_GPUS" env SBATCH_GPUS=4 $SB "$work/plain.sh"
    refused "SBATCH_GRES over #SBATCH" env SBATCH_GRES=gpu:h100:2 $SB "$work/dir4.sh"
    accepted "command line over SBATCH_GRES" env SBATCH_GRES=gpu:h100:2 $SB --gres=gpu:h100:4 "$work/plain.sh"
    accepted "sbatch < script (a regular file)" sh -c "$SB < '$work/dir4.sh'"
    refused "salloc --gres" salloc --mm-model="$SPEC" --gres=gpu:h100:2 true
    accepted "salloc --gres" salloc --mm-model="$SPEC" --gres=gpu:h100:4 true
    refused "SALLOC_GPUS" env SALLOC_GPUS=2 salloc --mm-model="$SPEC" true
    refused "srun --gres" srun --mm-model="$SPEC" --gres=gpu:h100:2 -n1 true
    accepted "srun --gres" srun --mm-model="$SPEC" --gres=gpu:h100:4 -n1 true
    refused "SLURM_GPUS for srun" env SLURM_GPUS=2 srun --mm-model="$SPEC" -n1 true
    # steps: the allocation's own GPUs (no GPU option of the step's own)
    refused "srun step in salloc --gres=gpu:h100:2" salloc --gres=gpu:h100:2 srun --mm-model="$SPEC" -n1 true
    run salloc --gres=gpu:h100:4 srun --mm-model="$SPEC" -n1 true
    expect "$mode: srun step in salloc --gres=gpu:h100:4: accepted on the allocation's 4 GPUs" \
        sh -c "[ $rc -eq 0 ] && grep -q 'fits h100 .* with 4 GPUs (--gres=gpu:h100:4 on 1 node, the allocation' '$work/err'"
    run sbatch -o "$work/step.out" --gres=gpu:h100:2 --wrap "srun --mm-model=$SPEC -n1 true; echo step-rc=\$?"
    _id=$(jobid); _st=$(wait_job "$_id")
    expect "$mode: srun step in a batch job with 2 GPUs: refused ($_st)" \
        sh -c "grep -q 'step-rc=[1-9]' '$work/step.out' && grep -q 'job rejected: .* with 2 GPUs (--gres=gpu:h100:2 on 1 node, the allocation' '$work/step.out'"
    # no GPU asked for: said so, on_error=reject
    run $SB "$work/plain.sh"
    expect "$mode: no GPU asked for: said so, on_error applies" \
        sh -c "[ $rc -ne 0 ] && grep -q 'the job asks for no GPU' '$work/err' && grep -q 'on_error=reject' '$work/err'"
    # a spec with a typo and no GPU asked for: the spec's own file:line: key error too, in
    # sbatch, salloc and srun (both problems at once, not one per resubmission)
    for _t in "sbatch -o /dev/null --wrap true" "salloc true" "srun -n1 true"; do
        run ${_t%% *} --mm-model="$root/tests/slurm/specs/invalid.yaml" ${_t#* }
        expect "$mode: ${_t%% *}: typo'd spec, no GPU: both errors" \
            sh -c "[ $rc -ne 0 ] && grep -q 'invalid.yaml:12:3: training.bogus_key: unknown key' '$work/err' && grep -q 'the job asks for no GPU' '$work/err'"
    done
    run sh -c "cat '$work/dir4.sh' | $SB"
    expect "$mode: a script on a pipe: said so, on_error applies" \
        sh -c "[ $rc -ne 0 ] && grep -q 'comes from standard input' '$work/err'"
}

for mode in without with; do
    start "$mode"
    matrix
done

# The plugin's --mm-gpus is only the user's word: slurmctld judges the request.
run $SB --gres=gpu:h100:2 --mm-gpus=4 "$work/plain.sh"
expect "with: --mm-gpus=4 on 2 requested GPUs: the plugin accepts, slurmctld refuses" \
    sh -c "[ $rc -ne 0 ] && grep -q 'fits h100 .* with 4 GPUs (--mm-gpus=4; the job asks for 2 GPUs' '$work/err' &&
           grep -q 'mmguard: job rejected: predicted peak .* does not fit h100 .* with 2 GPUs (gres:gpu:h100:2 on 1 node)' '$work/err'"

# ---- the rebuilt request against what slurmctld records (no --mm-model) -----
# request_tool rebuilds it exactly as the plugin does; scontrol shows the fields
xcheck() { # xcheck ENV_ASSIGNMENT|- SCRIPT|- ARGS...
    _env=$1 _script=$2; shift 2
    if [ "$_env" = - ]; then _env=""; fi
    _mine=$(env $_env "$REQUEST_TOOL" sbatch "$_script" -- sbatch "$@")
    run env $_env sbatch --hold -o /dev/null "$@"
    _id=$(jobid)
    scontrol show job "$_id" >"$work/show" 2>&1
    _real=$(python3 - "$work/show" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
f = lambda k: (re.search(r"\b%s=(\S*)" % k, t) or [None, ""])[1]
print("tpn=%s tpj=%s tpt=%s" % (f("TresPerNode"), f("TresPerJob"), f("TresPerTask")))
PY
)
    _m=$(echo "$_mine" | sed 's/^\(tpn=[^ ]* tpj=[^ ]* tpt=[^ ]*\).*/\1/')
    expect "request of [$_env sbatch $*] as slurmctld records it ($_real)" test "$_m" = "$_real"
    scancel "$_id" 2>/dev/null
}
start without
printf 'action=reject\n' >"$CLUSTER_DIR/etc/mmguard.conf"
xcheck - - --gres=gpu:h100:2,gpu:h200:1 --wrap true
xcheck - - -N1 --gpus-per-node=h100:2 --gres-flags=enforce-binding --wrap true
xcheck - - --gpus=3 --wrap true
xcheck - - --gpus-per-task=1 -n2 --wrap true
xcheck - - --gres=gpu:h100:1 --gres=gpu:h200:2 --wrap true
xcheck - - -J --gres=gpu:4 --wrap true
xcheck SBATCH_GRES=gpu:h100:3 - --wrap true
xcheck SBATCH_GPUS_PER_NODE=2 - --gpus-per-n=h200:1 --wrap true
xcheck - "$work/dir2.sh" "$work/dir2.sh"
xcheck SBATCH_GRES=gpu:1 "$work/dir2.sh" "$work/dir2.sh"
xcheck - "$work/dir2.sh" --gres=gpu:h200:4 "$work/dir2.sh"

finish
