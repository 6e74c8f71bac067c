#!/bin/sh
# sbatch_bench.sh - what the mmguard SPANK plugin adds to `sbatch`: time N
# submissions without and with --mm-model on one single-node Slurm
# (tests/slurm/cluster.sh, needs root), interleaved in rounds so that drift hits
# both sides alike.  Jobs are submitted held (--gres=gpu:h100:8) and cancelled
# at the end.  Wall time on a shared VM is noisy: bench/sbatch_instructions.sh
# counts instructions instead.
#   PLUGIN=build/spank_mmguard.so N=50 SPEC=contrib/models/llava-1.5-7b-finetune.yaml
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
PLUGIN=${PLUGIN:-$root/build/spank_mmguard.so}
N=${N:-50}
ROUNDS=${ROUNDS:-5}
SPEC=${SPEC:-$root/contrib/models/llava-1.5-7b-finetune.yaml}

dir=$(mktemp -d /tmp/mmguard-bench.XXXXXX)
chmod 0755 "$dir"
export CLUSTER_DIR="$dir/cluster"
trap 'sh "$root/tests/slurm/cluster.sh" stop; rm -rf "$dir"' EXIT INT TERM
printf 'action=reject\nmargin=10%%\nlog=%s/decisions.jsonl\n' "$dir" >"$dir/mmguard.conf"
cd "$dir"

now_ns() { date +%s%N; }
# batch K ARGS...: K held submissions, prints elapsed ns
batch() {
    _k=$1; shift
    _t0=$(now_ns)
    _i=0
    while [ $_i -lt "$_k" ]; do
        sbatch --hold -o /dev/null --gres=gpu:h100:8 "$@" --wrap true >/dev/null 2>&1 || { echo "sbatch failed" >&2; exit 1; }
        _i=$((_i + 1))
    done
    echo $(( $(now_ns) - _t0 ))
}

per=$(( (N + ROUNDS - 1) / ROUNDS ))
n=$((per * ROUNDS))

# 1. reference: the same cluster without the plugin in plugstack.conf
PLUGIN=none sh "$root/tests/slurm/cluster.sh" start
. "$CLUSTER_DIR/env.sh"
batch 3 >/dev/null
none=$(batch "$n")

# 2. with the plugin: without and with --mm-model, interleaved
MMGUARD_CONF=$dir/mmguard.conf PLUGIN=$PLUGIN sh "$root/tests/slurm/cluster.sh" start
. "$CLUSTER_DIR/env.sh"
batch 3 >/dev/null; batch 3 --mm-model="$SPEC" >/dev/null # warm up
base=0; with=0; r=0
while [ $r -lt "$ROUNDS" ]; do
    base=$((base + $(batch "$per"))) 
    with=$((with + $(batch "$per" --mm-model="$SPEC")))
    r=$((r + 1))
done
scancel --quiet --user="$(id -un)" || true
logged=$(wc -l <"$dir/decisions.jsonl")
awk -v z="$none" -v b="$base" -v w="$with" -v n="$n" -v l="$logged" -v spec="$(basename "$SPEC")" 'BEGIN {
    printf "sbatch x %d (held jobs, %d decisions logged)\n", n, l
    printf "  plugin not loaded:  %8.2f ms per sbatch\n", z / n / 1e6
    printf "  without --mm-model: %8.2f ms per sbatch (plugin loaded)\n", b / n / 1e6
    printf "  with --mm-model=%s: %8.2f ms per sbatch\n", spec, w / n / 1e6
    printf "  ratio with/without: %.3f (plugin adds %+.1f%%, %.2f ms)\n", w / b, (w / b - 1) * 100, (w - b) / n / 1e6
}'
