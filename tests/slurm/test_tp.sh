#!/bin/sh
# test_tp.sh - a tensor-parallel spec (training.tensor_parallel: 2) through
# the real sbatch of a single-node Slurm (tests/slurm/cluster.sh): the plugin
# judges it at training.data_parallel = the job's GPUs / 2, refuses a GPU
# count that 2 does not divide naming the key and the request, and passes on
# the spec's own refusal of data parallel beside tensor parallel.  Run by
# `make check-slurm` (as root).  PLUGIN=path/to/spank_mmguard.so; KEEP=1
# keeps the work directory.
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PLUGIN=${PLUGIN:-$root/build/spank_mmguard.so}
TP=$here/specs/llama-8b-tp2.yaml

. "$here/testlib.sh"
tl_start tp
LOG=$work/decisions.jsonl
unset MMGUARD_CLI MMGUARD_CONF
cd "$work" || exit 1
echo "# plugin: $PLUGIN"
[ -f "$PLUGIN" ] || { echo "Bail out! $PLUGIN not built"; exit 1; }

printf '%s\n' "action=reject" "margin=0%" "log=$LOG" >"$work/mmguard.conf"
if ! MMGUARD_CONF=$work/mmguard.conf PLUGIN=$PLUGIN GRES=h100:8 \
    sh "$here/cluster.sh" start 2>"$work/cluster.err"; then
    cat "$work/cluster.err"
    echo "Bail out! cluster did not start"
    exit 1
fi
. "$CLUSTER_DIR/env.sh"

# 2 GPUs: one tensor-parallel group, data_parallel 1 (it was judged at 2, which
# the spec refuses beside tensor parallel: every such job was an error)
run sbatch --hold --mm-model="$TP" --gres=gpu:h100:2 -o /dev/null --wrap true
expect "2 GPUs, tensor_parallel 2: accepted" \
    sh -c "[ $rc -eq 0 ] && grep -q '^Submitted batch job' '$work/out' && grep -q 'mmguard: --mm-model=.*llama-8b-tp2.yaml: predicted peak .* fits h100' '$work/err'"
expect "the decision log says data_parallel 1, tensor_parallel 2 on 2 GPUs" \
    sh -c "[ '$(log_field 1 decision)' = accept ] && [ '$(log_field 1 data_parallel)' = 1 ] && [ '$(log_field 1 tensor_parallel)' = 2 ] && [ '$(log_field 1 gpus)' = 2 ] && [ '$(log_field 1 verdict_data_parallel)' = 1 ]"
# its peak is the CLI's at data_parallel 1 on the same card (usable = 80 GiB
# less nothing: margin=0%)
want=$("$root/build/mmguard" check "$TP" --gpu-mem 85520809984 --margin 0 --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["verdict"])')
expect "its verdict is mmguard check's at data_parallel 1 ($want)" \
    sh -c "[ -n '$want' ] && [ '$(log_field 1 verdict)' = '$want' ]"

# 3 GPUs: not a multiple of the tensor-parallel degree
run sbatch --hold --mm-model="$TP" --gres=gpu:h100:3 -o /dev/null --wrap true
expect "3 GPUs: refused naming training.tensor_parallel and the request" \
    sh -c "[ $rc -eq 1 ] && grep -q 'mmguard: --mm-model=.*llama-8b-tp2.yaml: training.tensor_parallel=2 splits each model replica over 2 GPUs, but the job gets 3 GPUs (--gres=gpu:h100:3.*): ask for a multiple of 2 GPUs' '$work/err'"

# 4 GPUs: data_parallel 2 beside tensor parallel, which the spec refuses
run sbatch --hold --mm-model="$TP" --gres=gpu:h100:4 -o /dev/null --wrap true
expect "4 GPUs: data_parallel 2 x tensor_parallel 2, refused with the spec's reason" \
    sh -c "[ $rc -eq 1 ] && grep -q 'mmguard: --mm-model=.*: 4 GPUs = training.data_parallel=2 x training.tensor_parallel=2: .*training.tensor_parallel: 2: data parallel beside tensor parallel' '$work/err'"
expect "three decisions logged: accept, error, error" \
    sh -c "[ \$(wc -l <'$LOG') -eq 3 ] && [ '$(log_field 2 decision)' = error ] && [ '$(log_field 3 decision)' = error ]"
scancel --quiet --user="$(id -un)" || true
finish
