#!/bin/sh
# instructions.sh - what one prediction costs, counted in instructions
# (valgrind --tool=callgrind; this VM's perf has no instruction counter, and
# wall time on a shared 2-core VM is noise).  For each spec:
#   process      the whole `mmguard predict SPEC --json` (exec, libraries, spec, output)
#   mm_predict   one prediction inside it
#   steps        its simulated steps (step_run: the folded run and the unfolded one
#                that writes the allocation log), the allocator replay aside
#   max_mb       mm_max_micro_batch at 90% of an H100 (what the plugin adds to an
#                accepted --mm-model submission), from `mmguard fit`: the search
#                both run, fit_max_micro_batch (mm_fit calls it directly, to keep
#                the verdict at its answer)
#   fit          the whole mm_fit of `mmguard fit --gpu-mem 81559MiB --margin 10%`
#
#   MMGUARD=build/mmguard sh bench/instructions.sh SPEC...
set -eu
MMGUARD=${MMGUARD:-build/mmguard}
command -v valgrind >/dev/null || { echo "instructions: valgrind not installed" >&2; exit 1; }

# count [--toggle-collect=FN] CMD...: instructions callgrind collected
count() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 >/dev/null |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
m() { awk -v x="$1" 'BEGIN { printf "%8.2f M", x / 1e6 }'; }

printf '%-34s %12s %12s %12s %12s %12s\n' "instructions" process mm_predict steps max_mb fit
for spec in "$@"; do
    proc=$(count "$MMGUARD" predict "$spec" --json)
    pred=$(count --toggle-collect=mm_predict "$MMGUARD" predict "$spec" --json)
    steps=$(count --toggle-collect=step_run "$MMGUARD" predict "$spec" --json)
    mmb=$(count --toggle-collect=fit_max_micro_batch "$MMGUARD" fit "$spec" --gpu-mem 81559MiB --margin 10%)
    fit=$(count --toggle-collect=mm_fit "$MMGUARD" fit "$spec" --gpu-mem 81559MiB --margin 10%)
    printf '%-34s %12s %12s %12s %12s %12s\n' "$(basename "$spec" .yaml)" "$(m "$proc")" \
        "$(m "$pred")" "$(m "$steps")" "$(m "$mmb")" "$(m "$fit")"
done
