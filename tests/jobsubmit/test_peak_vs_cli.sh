#!/bin/sh
# test_peak_vs_cli.sh - job_submit.lua's peak(N) from the published
# MMGUARD_PEAK_MODEL must equal the C library's prediction at N
# (`mmguard predict SPEC --json --set training.data_parallel=N`).
# The model string is built from `mmguard predict --json` (overheads, dp_model)
# exactly as the SPANK plugin publishes it (spank_plugin/publish.c), once from
# the spec's own N and once from N=1.  MMGUARD=path/to/mmguard, LUA=interpreter.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
MMGUARD=${MMGUARD:-$root/build/mmguard}
LUA=${LUA:-lua5.1}
cases=$(mktemp /tmp/mmguard-peak.XXXXXX)
trap 'rm -f "$cases"' EXIT INT TERM

specs=$(ls "$here"/specs/*.yaml "$root"/tests/slurm/specs/*.yaml "$root"/contrib/models/*.yaml 2>/dev/null | grep -v invalid || true)
[ -n "$specs" ] || { echo "no specs"; exit 1; }
for spec in $specs; do
    for base in "" 1; do
        set -- predict "$spec" --json
        [ -n "$base" ] && set -- "$@" --set "training.data_parallel=$base"
        model=$("$MMGUARD" "$@" | python3 -c '
import json, sys
d = json.load(sys.stdin)
o, dp = d["overheads"], d["dp_model"]
terms = ",".join("%d:%d" % (t["fixed"], t["sharded"]) for t in dp["terms"])
print("v1 ctx=%d nccl=%d afix=%d afrac=%.17g dp1=%d terms=%s" % (o["cuda_context"], o["nccl"],
      o["allocator_fixed"], o["allocator_fraction"], dp["allocated_dp1"], terms))') || { echo "predict failed: $spec"; exit 1; }
        for n in 1 2 3 4 5 7 8 16 64; do
            peak=$("$MMGUARD" predict "$spec" --json --set "training.data_parallel=$n" |
                python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_bytes"])') || continue
            printf '%s\t%s\t%s\n' "$peak" "$n" "$model" >>"$cases"
        done
    done
done
echo "# $(wc -l <"$cases") cases from $(echo "$specs" | wc -w) specs"
"$LUA" "$here/peak_check.lua" "$root/contrib/job_submit.lua" "$cases"
