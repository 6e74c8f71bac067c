#!/bin/sh
# test_hostmem.sh - the host memory check (issue 14) on a real single-node
# Slurm 22.05 (tests/slurm/cluster.sh, GRES h100:4, RealMemory 400000 MB):
# a DeepSpeed ZeRO-3 spec offloading its optimizer and parameters to the CPU
# (tests/slurm/specs/offload-zero3.yaml: 34.8 GiB per GPU process at 4 GPUs,
# + host_overhead 3 GiB = 151.1 GiB per node) fits the GPUs; whether the job
# is refused depends on the memory it asks for: --mem, --mem-per-gpu,
# --mem-per-cpu x tasks, #SBATCH lines, SBATCH_MEM_PER_* (and Slurm's rule
# that an #SBATCH line beats a variable of another memory option), salloc and
# srun, the site's def_mem_per_gpu, a whole node.  Then job_submit.lua makes
# the same decision at slurmctld (the plugin's own host check turned off).
# Run by `make check-slurm` (root).  PLUGIN; KEEP=1 keeps the work directory.
# Prints "N passed, N failed" last.
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PLUGIN=${PLUGIN:-$root/build/spank_mmguard.so}
JOB_SUBMIT_LUA=${JOB_SUBMIT_LUA:-$root/contrib/job_submit.lua}
SPEC=$root/tests/slurm/specs/offload-zero3.yaml

. "$here/testlib.sh"
tl_start hostmem
RUN_TIMEOUT=60
LOG=$work/plugin.jsonl
CTLD=$work/ctld.jsonl
unset MMGUARD_CONF SBATCH_MEM_PER_NODE SBATCH_MEM_PER_GPU SBATCH_MEM_PER_CPU SALLOC_MEM_PER_NODE \
    SLURM_MEM_PER_NODE SLURM_MEM_PER_CPU SLURM_MEM_PER_GPU SLURM_JOB_ID SBATCH_GRES

for f in "$PLUGIN" "$SPEC" "$JOB_SUBMIT_LUA"; do
    [ -f "$f" ] || { echo "Bail out! $f missing (build first)"; exit 1; }
done
cd "$work" || exit 1

conf() { # conf LINE...: mmguard.conf (the cluster's copy is the one read)
    printf '%s\n' "action=reject" "on_error=reject" "log=$LOG" "ctld_log=$CTLD" "$@" \
        >"$CLUSTER_DIR/etc/mmguard.conf"
}
start() { # start LUA PLUGIN_ARGS
    printf 'action=reject\n' >"$work/mmguard.conf"
    if ! MMGUARD_CONF=$work/mmguard.conf PLUGIN=$PLUGIN JOB_SUBMIT_LUA=$1 PLUGIN_ARGS=$2 \
        GRES=h100:4 NODE_MEM=400000 sh "$here/cluster.sh" start 2>"$work/cluster.err"; then
        cat "$work/cluster.err"; echo "Bail out! cluster did not start"; exit 1
    fi
    . "$CLUSTER_DIR/env.sh"
    conf
}
script() { # script FILE DIRECTIVE...
    _f=$1; shift
    { echo "#!/bin/sh"; for _d in "$@"; do echo "#SBATCH $_d"; done; echo "true"; } >"$_f"
}
script "$work/gpus.sh" "--gres=gpu:h100:4"
script "$work/mem64.sh" "--gres=gpu:h100:4" "--mem=64G"
script "$work/mem160.sh" "--gres=gpu:h100:4" "--mem=160G"

SB="sbatch --hold -o /dev/null --mm-model=$SPEC"
MSG='job rejected: predicted host memory 151.1 GiB per node \(4 GPU processes x \(34.8 GiB offloaded \+ 3.0 GiB runtime\)\) does not fit'
# refused NAME HAVE FIX ARGS...: the plugin refuses with the host message,
# the memory the job gets and the size to ask for in the user's own form
refused() {
    _n=$1 _have=$2 _fix=$3; shift 3
    run "$@"
    expect "$_n: refused, naming its request and '$_fix'" \
        sh -c "[ $rc -ne 0 ] && grep -Eq '$MSG the $_have' '$work/err' &&
               grep -Fq 'mmguard: to fit: $_fix' '$work/err' && ! grep -q 'Submitted' '$work/out'"
}
accepted() { # accepted NAME ARGS...
    _n=$1; shift
    run "$@"
    expect "$_n: accepted, the host memory fits" \
        sh -c "[ $rc -eq 0 ] && grep -q 'predicted host memory 151.1 GiB per node .* fits the' '$work/err'"
}

start "" ""
refused "sbatch --mem=64G" "64.0 GiB the job gets \(--mem=64G\)" "--mem=152G" \
    $SB --gres=gpu:h100:4 --mem=64G "$work/gpus.sh"
accepted "sbatch --mem=160G" $SB --gres=gpu:h100:4 --mem=160G "$work/gpus.sh"
expect "the decision log has the host object" \
    sh -c "python3 -c \"import json; r = json.loads(open('$LOG').read().splitlines()[-1])['host']; \
assert r['result'] == 'fits' and r['processes'] == 4 and r['have_bytes'] == 160 << 30, r\""
run sbatch -o "$work/host.out" --mm-model="$SPEC" --gres=gpu:h100:4 --mem=160G \
    --wrap 'echo host=$MMGUARD_HOST_PEAK_BYTES'
_st=$(wait_job "$(jobid)")
expect "the job's tasks see MMGUARD_HOST_PEAK_BYTES (34.8 GiB per process, $_st)" \
    grep -qx 'host=37328428032' "$work/host.out"
refused "#SBATCH --mem=64G" "64.0 GiB the job gets \(--mem=64G, #SBATCH line 3 of mem64.sh\)" \
    "#SBATCH --mem=152G (mem64.sh line 3)" $SB "$work/mem64.sh"
accepted "#SBATCH --mem=160G" $SB "$work/mem160.sh"
accepted "the command line over #SBATCH" $SB --mem=160G "$work/mem64.sh"
refused "--mem-per-gpu=20G x 4 GPUs" "80.0 GiB the job gets \(--mem-per-gpu=20G x 4 GPUs\)" \
    "--mem-per-gpu=38G" $SB --mem-per-gpu=20G "$work/gpus.sh"
accepted "--mem-per-gpu=38G" $SB --mem-per-gpu=38G "$work/gpus.sh"
refused "--mem-per-cpu=40G x 2 tasks" "80.0 GiB the job gets \(--mem-per-cpu=40G x 2 CPUs\)" \
    "--mem-per-cpu=76G" $SB --mem-per-cpu=40G -n 2 "$work/gpus.sh"
accepted "--mem-per-cpu=76G x 2 tasks" $SB --mem-per-cpu=76G -n 2 "$work/gpus.sh"
refused "SBATCH_MEM_PER_NODE" "64.0 GiB the job gets \(SBATCH_MEM_PER_NODE=64G\)" \
    "SBATCH_MEM_PER_NODE=152G" env SBATCH_MEM_PER_NODE=64G $SB "$work/gpus.sh"
refused "an #SBATCH --mem line beats SBATCH_MEM_PER_GPU (Slurm's rule)" \
    "64.0 GiB the job gets \(--mem=64G, #SBATCH" "#SBATCH --mem=152G (mem64.sh line 3)" \
    env SBATCH_MEM_PER_GPU=64G $SB "$work/mem64.sh"
refused "salloc --mem=64G" "64.0 GiB the job gets \(--mem=64G\)" "--mem=152G" \
    salloc --mm-model="$SPEC" --gres=gpu:h100:4 --mem=64G true
refused "srun --mem=64G" "64.0 GiB the job gets \(--mem=64G\)" "--mem=152G" \
    srun --mm-model="$SPEC" --gres=gpu:h100:4 --mem=64G -n1 true
# no memory request: the whole node, whose size mmguard.conf does not give
run $SB "$work/gpus.sh"
expect "no --mem and no default: accepted, said not checked" \
    sh -c "[ $rc -eq 0 ] && grep -q 'host memory not checked (151.1 GiB needed per node): the job gets a whole node' '$work/err'"
conf "node_mem=100GiB"
refused "no --mem, node_mem=100GiB" "100.0 GiB the job gets \(a whole node: no --mem and no def_mem_\* default" \
    "a node holds no more" $SB "$work/gpus.sh"
conf "def_mem_per_gpu=16GiB"
refused "no --mem: the site default def_mem_per_gpu" "64.0 GiB the job gets \(no --mem: the site.s def_mem_per_gpu=16.0 GiB x 4 GPUs\)" \
    "--mem=152G" $SB "$work/gpus.sh"
conf "host_mem=warn"
run $SB --mem=64G "$work/gpus.sh"
expect "host_mem=warn: submitted with a warning" \
    sh -c "[ $rc -eq 0 ] && grep -q 'warning: predicted host memory' '$work/err' && grep -q 'Submitted' '$work/out'"
conf "host_mem=off"
run $SB --mem=1G "$work/gpus.sh"
expect "host_mem=off: not checked" sh -c "[ $rc -eq 0 ] && ! grep -q 'host memory' '$work/err'"

# ---- slurmctld: job_submit.lua on job_desc (the plugin's host check off) ----
start "$JOB_SUBMIT_LUA" "host_mem=off"
run $SB --gres=gpu:h100:4 --mem=64G "$work/gpus.sh"
expect "slurmctld: --mem=64G rejected by job_submit.lua, with the size to ask for" \
    sh -c "[ $rc -ne 0 ] && grep -Eq 'mmguard: $MSG the 64.0 GiB the job gets \(--mem=65536M\); to fit: --mem=152G' '$work/err'"
run $SB --mem-per-gpu=20G "$work/gpus.sh"
expect "slurmctld: --mem-per-gpu=20G rejected (mem_per_tres)" \
    sh -c "[ $rc -ne 0 ] && grep -q 'to fit: --mem-per-gpu=38G' '$work/err'"
run $SB --mem-per-cpu=40G -n 2 "$work/gpus.sh"
expect "slurmctld: --mem-per-cpu=40G x 2 rejected (min_mem_per_cpu)" \
    sh -c "[ $rc -ne 0 ] && grep -q 'to fit: --mem-per-cpu=76G' '$work/err'"
run $SB "$work/mem160.sh"
expect "slurmctld: #SBATCH --mem=160G accepted" sh -c "[ $rc -eq 0 ]"
# both readers, same job: the plugin's need equals slurmctld's
start "$JOB_SUBMIT_LUA" ""
run $SB "$work/mem160.sh"
expect "plugin and slurmctld agree on the need and the memory of the node" python3 - "$LOG" "$CTLD" <<'PY'
import json, sys
p = json.loads(open(sys.argv[1]).read().splitlines()[-1])["host"]
c = json.loads(open(sys.argv[2]).read().splitlines()[-1])["host"]
keys = ("result", "need_bytes", "have_bytes", "processes", "peak_bytes_per_process")
ok = all(p[k] == c[k] for k in keys)
if not ok:
    print("#", [(k, p[k], c[k]) for k in keys])
sys.exit(0 if ok else 1)
PY

finish
