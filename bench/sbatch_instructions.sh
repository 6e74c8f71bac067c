#!/bin/sh
# sbatch_instructions.sh - what the mmguard SPANK plugin adds to one `sbatch`,
# counted in instructions (valgrind --tool=callgrind on sbatch itself; this
# VM's perf has no instruction counter), on the single-node loopback Slurm of
# tests/slurm/cluster.sh (root).  Wall time on a shared 2-core VM is noise;
# instruction counts repeat to within a fraction of a percent.
#
#   PLUGIN=build/spank_mmguard.so [BASE_PLUGIN=old.so] sh bench/sbatch_instructions.sh
#
# Cases, each one held `sbatch --gres=gpu:h100:8 --wrap true`:
#   none     plugin not in plugstack.conf
#   plain    plugin loaded, no --mm-model
#   mm       plugin loaded, --mm-model=SPEC (LLaVA-1.5-7B fine-tune, fits)
#   mm-nommb the same under max_micro_batch=no (the largest micro-batch not
#            searched: MMGUARD_MAX_MICRO_BATCH and mmb= absent)
#   base-mm  BASE_PLUGIN (an older build, e.g. before the one-variable record)
# and for `mm` the inclusive instructions of the plugin's parts.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
PLUGIN=${PLUGIN:-$root/build/spank_mmguard.so}
SPEC=${SPEC:-$root/contrib/models/llava-1.5-7b-finetune.yaml}
command -v valgrind >/dev/null || { echo "valgrind not installed" >&2; exit 1; }

dir=$(mktemp -d /tmp/mmguard-ibench.XXXXXX)
chmod 0755 "$dir"
export CLUSTER_DIR="$dir/cluster"
trap 'sh "$root/tests/slurm/cluster.sh" stop >/dev/null 2>&1; rm -rf "$dir"' EXIT INT TERM
printf 'action=reject\nmargin=10%%\nlog=%s/decisions.jsonl\n' "$dir" >"$dir/mmguard.conf"
MMGUARD_CONF=$dir/mmguard.conf PLUGIN=$PLUGIN GRES=h100:8 sh "$root/tests/slurm/cluster.sh" start 2>/dev/null
. "$CLUSTER_DIR/env.sh"
cd "$dir"
plugstack=$CLUSTER_DIR/etc/plugstack.conf
cp "$plugstack" "$dir/plugstack.with"

# count NAME PLUGSTACK-LINE ARGS...: callgrind one sbatch, print its total
count() {
    _name=$1 _line=$2; shift 2
    printf '%s\n' "$_line" >"$plugstack"
    valgrind --tool=callgrind --callgrind-out-file="$dir/cg.$_name" \
        sbatch --hold -o /dev/null --gres=gpu:h100:8 "$@" --wrap true >/dev/null 2>"$dir/vg.$_name"
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$dir/vg.$_name"
}
with=$(cat "$dir/plugstack.with")
sbatch --hold -o /dev/null --gres=gpu:h100:8 --mm-model="$SPEC" --wrap true >/dev/null 2>&1 # warm caches
none=$(count none "")
plain=$(count plain "$with")
mm=$(count mm "$with" --mm-model="$SPEC")
conf=$CLUSTER_DIR/etc/mmguard.conf # the copy the plugstack line names
cp "$conf" "$dir/mmguard.conf.mmb"
printf 'max_micro_batch=no\n' >>"$conf"
nommb=$(count nommb "$with" --mm-model="$SPEC")
cp "$dir/mmguard.conf.mmb" "$conf"
base=""
if [ -n "${BASE_PLUGIN:-}" ]; then
    base=$(count base "$(echo "$with" | sed "s|[^ ]*spank_mmguard.so|$BASE_PLUGIN|")" --mm-model="$SPEC")
fi
scancel --quiet --user="$(id -un)" || true

# inclusive instructions of FUNCTION in a profile (first match)
incl() {
    callgrind_annotate --inclusive=yes --threshold=100 "$dir/cg.$1" 2>/dev/null |
        awk -v f="$2" '$0 ~ (":" f "( |$)") { gsub(",", "", $1); print $1; exit }'
}
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.1f%%", (a - b) / b * 100 }'; }
echo "sbatch --hold --gres=gpu:h100:8 --wrap true, instructions (callgrind):"
printf '  plugin not loaded:              %12s\n' "$none"
printf '  plugin loaded, no --mm-model:   %12s  (%s)\n' "$plain" "$(pct "$plain" "$none")"
printf '  plugin loaded, --mm-model:      %12s  (%s over not loaded)\n' "$mm" "$(pct "$mm" "$none")"
printf '  --mm-model, max_micro_batch=no: %12s  (%s over not loaded)\n' "$nommb" "$(pct "$nommb" "$none")"
[ -n "$base" ] && printf '  BASE_PLUGIN, --mm-model:        %12s  (%s over not loaded)\n' "$base" "$(pct "$base" "$none")"
echo "where the --mm-model instructions go (inclusive):"
for f in slurm_spank_init_post_opt mmg_gather_request mm_spec_load_file mm_predict_verdict mm_predict_keep mm_verdict_for \
         mm_max_micro_batch mmg_publish mmg_log_decision setenvfs slurm_xcalloc; do
    printf '  %-22s %12s\n' "$f" "$(incl mm "$f" || true)"
done
echo "the same under max_micro_batch=no:"
for f in slurm_spank_init_post_opt mm_spec_load_file mm_predict_verdict mm_max_micro_batch mmg_publish \
         mmg_log_decision setenvfs slurm_xcalloc; do
    printf '  %-22s %12s\n' "$f" "$(incl nommb "$f" || true)"
done
if [ -n "$base" ]; then
    echo "the same in BASE_PLUGIN:"
    for f in slurm_spank_init_post_opt mm_predict_verdict mm_predict mm_max_micro_batch setenvfs slurm_xcalloc; do
        printf '  %-22s %12s\n' "$f" "$(incl base "$f" || true)"
    done
fi
