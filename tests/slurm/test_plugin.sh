#!/bin/sh
# test_plugin.sh - the mmguard SPANK plugin through the real sbatch, salloc and
# srun of a single-node Slurm (tests/slurm/cluster.sh).  Run by `make check-slurm`
# (as root).  PLUGIN=path/to/spank_mmguard.so; KEEP=1 keeps the work directory.
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PLUGIN=${PLUGIN:-$root/build/spank_mmguard.so}
SPECS=$here/specs
SMALL=$SPECS/llava-lora-small.yaml
BIG=$SPECS/llava-finetune-big.yaml
BAD=$SPECS/invalid.yaml

. "$here/testlib.sh"
tl_start test
LOG=$work/decisions.jsonl
cli=${MMGUARD_CLI:-$(dirname "$PLUGIN")/mmguard}
# jobs inherit this environment: keep our own MMGUARD_* settings out of it
unset MMGUARD_CLI MMGUARD_CONF

start() { # start CONF_LINES...: a fresh cluster with an mmguard.conf of these lines
    printf '%s\n' "$@" >"$work/mmguard.conf"
    if ! MMGUARD_CONF=$work/mmguard.conf PLUGIN=$PLUGIN GRES=h100:8,a100-40g:2 \
        sh "$here/cluster.sh" start 2>"$work/cluster.err"; then
        cat "$work/cluster.err"
        echo "Bail out! cluster did not start"
        exit 1
    fi
    . "$CLUSTER_DIR/env.sh"
    rm -f "$LOG"
}

cd "$work" || exit 1
cat >"$work/job.sh" <<'SH'
#!/bin/sh
echo "batch: $(env | grep '^MMGUARD_' | sort | tr '\n' ' ')"
srun -n1 sh -c 'echo "step: $(env | grep "^MMGUARD_" | sort | tr "\n" " ")"'
SH
cat >"$work/job_directive.sh" <<SH
#!/bin/sh
#SBATCH --mm-model=$SMALL
#SBATCH --gres=gpu:h100:1
env | grep '^MMGUARD_' | sort
SH

echo "# plugin: $PLUGIN"
[ -f "$PLUGIN" ] || { echo "Bail out! $PLUGIN not built"; exit 1; }

# ---- the shared object ------------------------------------------------------
nm -D --defined-only "$PLUGIN" | awk '{print $NF}' | sed 's/@.*//' >"$work/out"
expect "exports only slurm_spank_*/plugin_* symbols" \
    sh -c "! grep -Ev '^(slurm_spank_[a-z_]+|plugin_(name|type|version))\$' '$work/out'"
expect "exports slurm_spank_init, slurm_spank_init_post_opt and plugin_name" \
    sh -c "grep -qx slurm_spank_init '$work/out' && grep -qx slurm_spank_init_post_opt '$work/out' && grep -qx plugin_name '$work/out'"
readelf -d "$PLUGIN" >"$work/out" 2>&1
expect "not linked against libslurm, full RELRO (BIND_NOW)" \
    sh -c "! grep -q 'libslurm' '$work/out' && grep -Eq 'BIND_NOW|FLAGS.*NOW' '$work/out'"

# ---- action=reject, on_error=reject ------------------------------------------
start "# test config" "action=reject" "margin=5%" "reserve=1GiB" "log=$LOG" "on_error=reject"

run sbatch --mm-model="$SMALL" --gres=gpu:h100:1 -o "$work/small.out" "$work/job.sh"
id=$(jobid)
expect "sbatch: fitting spec is accepted (rc 0, job id)" test "$rc" -eq 0 -a -n "$id"
expect "sbatch: accepted job prints the prediction" has "$work/err" '^sbatch: mmguard: --mm-model=.*llava-lora-small.yaml: predicted peak .* fits h100'
st=$(wait_job "$id")
expect "sbatch: accepted job ran ($st)" test "$st" = COMPLETED
expect "batch step sees MMGUARD_PEAK_BYTES/DECISION/MAX_MICRO_BATCH" \
    has "$work/small.out" '^batch: .*MMGUARD_DECISION=accept .*MMGUARD_MAX_MICRO_BATCH=[0-9]+ .*MMGUARD_PEAK_BYTES=[0-9]+'
expect "srun step inside the job sees MMGUARD_PEAK_BYTES" has "$work/small.out" '^step: .*MMGUARD_PEAK_BYTES=[0-9]+'
expect "job sees the GPU type and the model name" has "$work/small.out" 'MMGUARD_GPU=h100 .*MMGUARD_MODEL=llava-1.5-7b-lora-small'
# the plugin's fast search for the largest micro-batch must agree with mm_fit
if [ -x "$cli" ]; then
    # the same card: its memory, and the margin + reserve that leave the usable bytes
    usable=$(sed -n 's/^batch: .*MMGUARD_USABLE_BYTES=\([0-9]*\).*/\1/p' "$work/small.out")
    gpumem=$(sed -n 's/^batch: .*MMGUARD_GPU_MEM=\([0-9]*\).*/\1/p' "$work/small.out")
    want=$("$cli" fit "$SMALL" --gpu-mem "$gpumem" --margin "$((gpumem - usable))" --json | sed -n 's/.*"max_micro_batch": *\([0-9]*\).*/\1/p')
    expect "MMGUARD_MAX_MICRO_BATCH equals \`mmguard fit\` ($want)" has "$work/small.out" "MMGUARD_MAX_MICRO_BATCH=$want "
else
    not_ok "mmguard CLI $cli not built (needed to cross-check MMGUARD_MAX_MICRO_BATCH)"
fi

run sbatch -o "$work/directive.out" "$work/job_directive.sh"
id=$(jobid); st=$(wait_job "$id")
expect "#SBATCH --mm-model is honoured" sh -c "[ '$st' = COMPLETED ] && grep -qx 'MMGUARD_SPEC=$SMALL' '$work/directive.out'"

run sbatch --export=NONE --mm-model="$SMALL" --gres=gpu:h100:1 -o "$work/exportnone.out" "$work/job.sh"
id=$(jobid); st=$(wait_job "$id")
expect "--export=NONE job still sees MMGUARD_PEAK_BYTES (via SLURM_SPANK_*)" has "$work/exportnone.out" '^batch: .*MMGUARD_PEAK_BYTES=[0-9]+'

njobs=$(squeue -h | wc -l)
run sbatch --mm-model="$BIG" --gres=gpu:h100:1 -o /dev/null "$work/job.sh"
expect "sbatch: oversized spec is rejected with exit 1" test "$rc" -eq 1
expect "rejection names the flag, the peak and the usable memory" \
    has "$work/err" '^sbatch: error: mmguard: --mm-model=.*llava-finetune-big.yaml: job rejected: predicted peak [0-9.]+ GiB per GPU does not fit h100 \([0-9.]+ GiB usable of [0-9.]+ GiB\)'
expect "rejection lists the top factors and modules" \
    sh -c "grep -q '^sbatch: error: mmguard: top factors: ' '$work/err' && grep -q '^sbatch: error: mmguard: top modules: language_model' '$work/err'"
expect "rejection suggests a micro-batch size that fits" has "$work/err" 'mmguard: to fit: training.micro_batch_size=[0-9]+ \(largest that fits'
expect "rejected job was not submitted" sh -c "hasnt() { ! grep -q \"\$2\" \"\$1\"; }; hasnt '$work/out' Submitted && [ \$(squeue -h | wc -l) -eq $njobs ]"

run sbatch --mm-model="$BAD" --gres=gpu:h100:1 -o /dev/null "$work/job.sh"
expect "invalid spec: exit 1 with the library's file:line message" \
    sh -c "[ $rc -eq 1 ] && grep -Eq '^sbatch: error: mmguard: --mm-model=.*invalid.yaml: invalid spec: .*invalid.yaml:[0-9]+' '$work/err'"
expect "invalid spec: on_error=reject is stated" has "$work/err" 'mmguard: on_error=reject: job not submitted'

run sbatch --mm-model="$SMALL" --gres=gpu:h100:1 --mm-gpu=v100 -o /dev/null "$work/job.sh"
expect "--mm-gpu=unknown type: rejected naming the flag and the known types" \
    sh -c "[ $rc -eq 1 ] && grep -q \"mmguard: GPU type 'v100' (--mm-gpu) is not in the site's GPU table (known: h100, h200\" '$work/err'"

run sbatch --mm-model="$SMALL" --gres=gpu:h100:1 --mm-gpus=zero -o /dev/null "$work/job.sh"
expect "--mm-gpus=zero: refused by the option callback" sh -c "[ $rc -ne 0 ] && grep -q \"mmguard: --mm-gpus: 'zero' is not an integer\" '$work/err'"

n_before=$(log_lines)
run sbatch -o "$work/plain.out" "$work/job.sh"
id=$(jobid); st=$(wait_job "$id")
# plain_untouched RC STATE OUT ERR: the job was submitted and ran, printed its
# step line, and neither it nor sbatch shows anything of mmguard
plain_untouched() {
    [ "$1" -eq 0 ] && [ "$2" = COMPLETED ] && grep -q '^step:' "$3" && ! grep -q MMGUARD_ "$3" &&
        ! grep -q mmguard "$4"
}
expect "no --mm-model: job untouched (runs, no MMGUARD_* vars, no message)" \
    plain_untouched "$rc" "$st" "$work/plain.out" "$work/err"
# the check itself can fail: a job that did not run, or one with MMGUARD_*
# (it used to be "...; ! grep ..." whose status ignored the job's state)
refute "the plain-job check fails for a job that did not complete" \
    plain_untouched 0 FAILED "$work/plain.out" "$work/err"
refute "the plain-job check fails for a job that shows MMGUARD_*" \
    plain_untouched 0 COMPLETED "$work/small.out" "$work/err"
expect "no --mm-model: no decision logged" test "$(log_lines)" -eq "$n_before"

# nested submission: the inner job must not inherit the outer job's values
cat >"$work/nested.sh" <<SH
#!/bin/sh
sbatch --wait -o "$work/inner.out" --wrap 'env | grep MMGUARD_ | sort; echo inner-done' >/dev/null
SH
run sbatch -o "$work/outer.out" --mm-model="$SMALL" --gres=gpu:h100:1 "$work/nested.sh"
id=$(jobid); wait_job "$id" >/dev/null
expect "job submitted from an mmguard job without --mm-model gets no stale MMGUARD_*" \
    sh -c "grep -q inner-done '$work/inner.out' && ! grep -q MMGUARD_ '$work/inner.out'"

# salloc and srun
run salloc --mm-model="$SMALL" --gres=gpu:h100:1 sh -c 'env | grep "^SLURM_SPANK_MMGUARD"'
expect "salloc: fitting spec gets an allocation, the one record in SLURM_SPANK_MMGUARD" \
    sh -c "[ $rc -eq 0 ] && grep -Eq '^SLURM_SPANK_MMGUARD=v=4 decision=accept .* peak=[0-9]+ ' '$work/out' && [ \$(wc -l <'$work/out') -eq 1 ]"
run salloc --mm-model="$BIG" --gres=gpu:h100:1 sh -c 'echo allocated'
expect "salloc: oversized spec is refused with the explanation" \
    sh -c "[ $rc -ne 0 ] && grep -q '^salloc: error: mmguard: --mm-model=.*does not fit h100' '$work/err' && ! grep -q allocated '$work/out'"
run srun --mm-model="$SMALL" --gres=gpu:h100:1 -n1 sh -c 'env | grep "^MMGUARD_" | sort'
expect "srun: fitting spec runs and the task sees MMGUARD_PEAK_BYTES" \
    sh -c "[ $rc -eq 0 ] && grep -Eq '^MMGUARD_PEAK_BYTES=[0-9]+' '$work/out'"
run srun --mm-model="$BIG" --gres=gpu:h100:1 -n1 echo ran
expect "srun: oversized spec is refused with the explanation" \
    sh -c "[ $rc -ne 0 ] && grep -q '^srun: error: mmguard: --mm-model=.*does not fit' '$work/err' && ! grep -q ran '$work/out'"

# the decision log: one valid JSON object per decision, in order
# decisions: small, directive, exportnone, big, bad, v100, nested-outer, salloc x2, srun x2
expect "decision log has exactly one line per decision (11)" test "$(log_lines)" -eq 11
expect "every log line is a JSON object with the required fields" python3 - "$LOG" <<'PY'
import json, re, sys
req = ["time", "user", "uid", "job_name", "spec", "model", "decision", "reason", "source", "gpu",
       "margin"]
ok = True
for n, line in enumerate(open(sys.argv[1]), 1):
    r = json.loads(line)
    miss = [k for k in req if k not in r]
    if miss or not re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", r["time"]):
        print("# line", n, "missing", miss, r.get("time")); ok = False
    if r["decision"] in ("accept", "reject") and not (
            re.match(r"^[0-9a-f]{64}$", r["spec_sha256"]) and r["peak_bytes"] > 0
            and r["usable_bytes"] > 0 and "activations" in r["factors"] and r["modules"]):
        print("# line", n, "incomplete prediction record"); ok = False
sys.exit(0 if ok else 1)
PY
got=$(python3 -c 'import json,sys; print(" ".join(json.loads(l)["decision"] + "/" + json.loads(l)["source"] for l in open(sys.argv[1])))' "$LOG")
expect "log decisions/sources in order ($got)" test "$got" = \
    "accept/sbatch accept/sbatch accept/sbatch reject/sbatch error/sbatch error/sbatch accept/sbatch accept/salloc reject/salloc accept/srun reject/srun"
expect "log records the usable memory after margin=5% and reserve=1GiB" \
    test "$(log_field 1 usable_bytes)" -eq $(( 85520809984 - (85520809984 * 5 + 99) / 100 - 1073741824 ))
expect "log records the spec digest that the job sees" \
    sh -c "grep -q \"MMGUARD_SPEC_SHA256=$(log_field 1 spec_sha256)\" '$work/small.out'"

# ---- action=warn, on_error=allow ------------------------------------------------
start "action=warn" "log=$LOG" "on_error=allow"
run sbatch --mm-model="$BIG" --gres=gpu:h100:1 -o /dev/null --wrap true
id=$(jobid)
expect "warn mode: oversized spec is submitted" test "$rc" -eq 0 -a -n "$id"
expect "warn mode: the explanation is shown as a warning" \
    sh -c "grep -q '^sbatch: mmguard: --mm-model=.*: warning: predicted peak' '$work/err' && grep -q '^sbatch: mmguard: to fit:' '$work/err' && ! grep -q 'error:' '$work/err'"
run sbatch --mm-model="$BAD" --gres=gpu:h100:1 -o /dev/null --wrap true
expect "on_error=allow: invalid spec is submitted with the file:line message" \
    sh -c "[ $rc -eq 0 ] && grep -Eq 'mmguard: --mm-model=.*invalid.yaml: invalid spec: .*invalid.yaml:[0-9]+' '$work/err' && grep -q 'on_error=allow' '$work/err'"
expect "warn/allow decisions logged as warn, error" \
    test "$(python3 -c 'import json,sys; print(" ".join(json.loads(l)["decision"] for l in open(sys.argv[1])))' "$LOG")" = "warn error"

# ---- the capacity-aware verdict: fits / fits with cache flushes / out of memory ----
# llava-1.5-7b-finetune (ZeRO-3) on 8 GPUs: out of memory on a 40 GiB card, runs
# with cache flushes on 50 GiB, fits on 60 GiB (docs/allocator.md; gpu.h100=
# sets the card).  The plugin reads mmguard.conf at every submission.
FLUSH=$root/contrib/models/llava-1.5-7b-finetune.yaml
start "action=reject" "log=$LOG"
conf() { printf '%s\n' "margin=0" "log=$LOG" "$@" >"$CLUSTER_DIR/etc/mmguard.conf"; rm -f "$LOG"; }
# verdict_logged DECISION VERDICT FLUSH CARD_GIB: the log line of the last decision
verdict_logged() {
    python3 - "$LOG" "$@" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
want = {"decision": sys.argv[2], "verdict": sys.argv[3], "flush": sys.argv[4]}
got = {k: r.get(k) for k in want}
card = int(sys.argv[5]) << 30
ok = (got == want and r["data_parallel"] == 8 and r["card_peak_bytes"] <= card
      and (sys.argv[3] != "flushes" or r["alloc_retries_per_step"] > 0)
      and (sys.argv[3] != "fits" or r["alloc_retries_per_step"] == 0))
if not ok:
    print("# log:", got, r.get("card_peak_bytes"), r.get("alloc_retries_per_step"))
sys.exit(0 if ok else 1)
PY
}
conf "action=reject" "gpu.h100=50GiB"
run sbatch --hold --mm-model="$FLUSH" --gres=gpu:h100:8 -o /dev/null --wrap true
expect "flush= unset (warn): a job that fits only with cache flushes is submitted" test "$rc" -eq 0 -a -n "$(jobid)"
expect "flush=warn: the warning says how many cudaMalloc retries per step and that each flush synchronises the device" \
    sh -c "grep -q '^sbatch: mmguard: --mm-model=.*: warning: predicted peak [0-9.]* GiB per GPU fits h100 (50.0 GiB usable of 50.0 GiB) with 8 GPUs .* only with cache flushes (1 cudaMalloc retry per step)' '$work/err' && grep -q 'each flush synchronises the device: slower' '$work/err' && grep -q 'flush=warn: submitting' '$work/err'"
expect "flush=warn: the bytes are named (live tensors, allocator cache, CUDA context and NCCL), no 'overhead'" \
    sh -c "grep -q 'live tensors .* allocator cache .* CUDA context and NCCL' '$work/err' && ! grep -q overhead '$work/err'"
expect "flush=warn: logged as warn, verdict flushes, retries, the card's peak within the card" verdict_logged warn flushes warn 50
cp "$work/err" "$work/flush-warn.err"

conf "action=reject" "gpu.h100=50GiB" "flush=accept"
run sbatch --hold --mm-model="$FLUSH" --gres=gpu:h100:8 -o /dev/null --wrap true
expect "flush=accept: submitted with an info line, no warning" \
    sh -c "[ $rc -eq 0 ] && grep -q '^sbatch: mmguard: --mm-model=.*: predicted peak .* only with cache flushes' '$work/err' && ! grep -q 'warning' '$work/err' && grep -q 'flush=accept: submitted' '$work/err'"
expect "flush=accept: logged as accept, verdict flushes" verdict_logged accept flushes accept 50

conf "action=reject" "gpu.h100=50GiB" "flush=reject"
njobs=$(squeue -h | wc -l)
run sbatch --hold --mm-model="$FLUSH" --gres=gpu:h100:8 -o /dev/null --wrap true
expect "flush=reject: refused with exit 1, as a misfit, saying why" \
    sh -c "[ $rc -eq 1 ] && grep -q '^sbatch: error: mmguard: --mm-model=.*: job rejected: predicted peak .* only with cache flushes' '$work/err' && grep -q 'flush=reject: a job that needs cache flushes does not fit here' '$work/err' && grep -q 'mmguard: to fit:' '$work/err' && [ \$(squeue -h | wc -l) -eq $njobs ]"
expect "flush=reject: logged as reject, verdict flushes" verdict_logged reject flushes reject 50

conf "action=reject" "gpu.h100=40GiB" "flush=accept"
run sbatch --hold --mm-model="$FLUSH" --gres=gpu:h100:8 -o /dev/null --wrap true
expect "out of memory (40 GiB): refused whatever flush= says, with the failing request" \
    sh -c "[ $rc -eq 1 ] && grep -q 'job rejected: predicted peak .* does not fit h100 (40.0 GiB usable of 40.0 GiB) with 8 GPUs .*: out of memory at forward language_model loss' '$work/err' && grep -q 'out of memory at .*: a request of .* reserved after freeing the cache (largest free block' '$work/err'"
expect "out of memory: logged as reject, verdict oom, the card's peak within the card" verdict_logged reject oom accept 40

conf "action=reject" "gpu.h100=60GiB" "flush=reject"
run sbatch --hold --mm-model="$FLUSH" --gres=gpu:h100:8 -o /dev/null --wrap true
expect "fits (60 GiB): accepted with one line, whatever flush= says" \
    sh -c "[ $rc -eq 0 ] && grep -q 'predicted peak .* fits h100 (60.0 GiB usable' '$work/err' && ! grep -q 'cache flushes' '$work/err' && [ \$(grep -c mmguard '$work/err') -eq 1 ]"
expect "fits: logged as accept, verdict fits" verdict_logged accept fits reject 60
# logged_mmb yes|no: whether the last decision carries the largest micro-batch
logged_mmb() {
    python3 -c 'import json,sys; r = json.loads(open(sys.argv[1]).read().splitlines()[-1]); sys.exit(0 if ("max_micro_batch" in r) == (sys.argv[2] == "yes") else 1)' "$LOG" "$1"
}
expect "max_micro_batch= unset (yes): an accepted job's largest micro-batch is searched and logged" logged_mmb yes
conf "action=reject" "gpu.h100=60GiB" "flush=reject" "max_micro_batch=no"
run sbatch --hold --mm-model="$FLUSH" --gres=gpu:h100:8 -o /dev/null --wrap true
expect "max_micro_batch=no: the same job is accepted with the same one line" \
    sh -c "[ $rc -eq 0 ] && grep -q 'predicted peak .* fits h100 (60.0 GiB usable' '$work/err' && [ \$(grep -c mmguard '$work/err') -eq 1 ]"
expect "max_micro_batch=no: logged as accept, verdict fits" verdict_logged accept fits reject 60
expect "max_micro_batch=no: no largest micro-batch searched or logged" logged_mmb no
scancel -u "$(id -un)" 2>/dev/null

# ---- configuration errors -------------------------------------------------------
start "action=reject" "bogus_key=1"
run sbatch --mm-model="$SMALL" -o /dev/null --wrap true
expect "config error: --mm-model job refused naming file:line and the key" \
    sh -c "[ $rc -eq 1 ] && grep -q \"mmguard: plugin configuration error: $CLUSTER_DIR/etc/mmguard.conf:2: unknown key 'bogus_key'\" '$work/err'"
run sbatch -o /dev/null --wrap true
expect "config error: jobs without --mm-model are unaffected" test "$rc" -eq 0
expect "config error: slurmd logs it at start-up and keeps running" \
    sh -c "grep -q \"mmguard: configuration error.*unknown key 'bogus_key'\" '$CLUSTER_DIR/log/slurmd.log' && sh '$here/cluster.sh' status >/dev/null"

start "action=reject" "log=$work/no/such/dir/decisions.jsonl"
run sbatch --mm-model="$SMALL" --gres=gpu:h100:1 -o /dev/null --wrap true
expect "unwritable log: the decision stands and the failure is reported once" \
    sh -c "[ $rc -eq 0 ] && [ \$(grep -c 'cannot append the decision record' '$work/err') -eq 1 ]"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
