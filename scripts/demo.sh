#!/bin/sh
# demo.sh - mmguard end to end on a throw-away single-node Slurm (needs root):
# start munged/slurmctld/slurmd with the mmguard SPANK plugin, submit the
# shipped LLaVA specs through the real sbatch with their GPU requests (accepted
# when the GPUs asked for hold the predicted peak, rejected with the
# explanation and ways to fit when not), let the accepted job record what it
# used (python/mmguard), show the decision log with the job's outcome and the
# report, stop the cluster.
# `make demo` installs the packages and builds the plugin first.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
PLUGIN=${PLUGIN:-$root/build/spank_mmguard.so}
cli=${MMGUARD_CLI:-$(dirname "$PLUGIN")/mmguard}
unset MMGUARD_CLI # jobs inherit this environment: keep it free of our settings
FITS=$root/contrib/models/llava-1.5-7b-finetune.yaml     # ZeRO-3, written for 8 GPUs
TOO_BIG=$root/contrib/models/llava-1.5-13b-finetune.yaml # ZeRO-3: needs 8 H100s, not 4

dir=$(mktemp -d /tmp/mmguard-demo.XXXXXX)
chmod 0755 "$dir"
export CLUSTER_DIR="$dir/cluster"
trap 'sh "$root/tests/slurm/cluster.sh" stop; rm -rf "$dir"' EXIT INT TERM

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '$ %s\n' "$*"; }

cat >"$dir/mmguard.conf" <<CONF
# what an admin would put in /etc/slurm/mmguard.conf
action=reject
margin=10%
log=$dir/decisions.jsonl
CONF
say "starting a single-node Slurm (8x h100, 8x h200 as /dev/null GRES) with the plugin"
echo "plugstack.conf: required $PLUGIN config=$CLUSTER_DIR/etc/mmguard.conf"
sed 's/^/mmguard.conf:   /' "$dir/mmguard.conf"
MMGUARD_CONF=$dir/mmguard.conf PLUGIN=$PLUGIN GRES=h100:8,h200:8 \
    sh "$root/tests/slurm/cluster.sh" start
. "$CLUSTER_DIR/env.sh"
cd "$dir"

cat >"$dir/train.sh" <<JOB
#!/bin/sh
#SBATCH --gres=gpu:h100:8
echo "job \$SLURM_JOB_ID on \$(hostname): the plugin's prediction, as the training script sees it:"
env | grep '^MMGUARD_' | sort | sed 's/^/  /'
# the job-side recorder (python/mmguard, here without torch: host memory only;
# on a GPU node with torch it adds the CUDA counters and NVML's peak)
if command -v python3 >/dev/null 2>&1; then
    PYTHONPATH=$root/python python3 -c '
import mmguard
rec = mmguard.Recorder()
for seq in (1024, 2048):
    rec.observe(micro_batch=16, seq_len=seq)
    rec.step_done()
rec.close()
print("  recorded:", rec.path)'
fi
JOB

wait_job() {
    i=0
    while [ $i -lt 300 ]; do
        case $(scontrol show job "$1" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p') in
            COMPLETED|FAILED|CANCELLED|TIMEOUT) return 0 ;;
        esac
        sleep 0.1; i=$((i + 1))
    done
}

say "1. LLaVA-1.5-7B full fine-tune on 8 H100s (#SBATCH --gres=gpu:h100:8 in train.sh): accepted"
show "sbatch --mm-model=contrib/models/$(basename "$FITS") -o job.out train.sh"
out=$(sbatch --mm-model="$FITS" -o "$dir/job.out" "$dir/train.sh")
echo "$out"
id=${out##* }
wait_job "$id"
cat "$dir/job.out"

say "2. the same spec on the 1 GPU the command line asks for: rejected, with ways to fit"
show "sbatch --mm-model=contrib/models/$(basename "$FITS") --gres=gpu:h100:1 train.sh"
rc=0
sbatch --mm-model="$FITS" --gres=gpu:h100:1 "$dir/train.sh" || rc=$?
echo "(sbatch exit status $rc; no job was queued)"

say "3. LLaVA-1.5-13B full fine-tune on 4 H100s: rejected at submit time"
show "sbatch --mm-model=contrib/models/$(basename "$TOO_BIG") --gres=gpu:h100:4 train.sh"
rc=0
sbatch --mm-model="$TOO_BIG" --gres=gpu:h100:4 "$dir/train.sh" || rc=$?
echo "(sbatch exit status $rc; no job was queued)"

say "4. the same 13B fine-tune on 4 H200s: accepted"
show "sbatch --mm-model=contrib/models/$(basename "$TOO_BIG") --gres=gpu:h200:4 -o job2.out train.sh"
sbatch --mm-model="$TOO_BIG" --gres=gpu:h200:4 -o "$dir/job2.out" "$dir/train.sh"

say "5. the decision log ($dir/decisions.jsonl): one JSON object per decision, and the
   outcome of job 1 (its record, read by slurmstepd when the batch step ended)"
if command -v python3 >/dev/null 2>&1; then
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("event") == "outcome":
        m = r.get("measured") or {}
        print("%s outcome job %s: record %s, status %s, %s steps, host peak %.2f GiB, "
              "longest sequence %s, CUDA %s" % (
            r["time"], r["job_id"], r["record_state"], m.get("status"), m.get("steps"),
            (m.get("host_peak_rss_bytes") or 0) / 2**30, m.get("max_seq_len"),
            "measured" if m.get("cuda") else "absent (no GPU here)"))
        continue
    print("%s %-6s %-7s %-28s gpu=%-5s peak=%6.1f GiB usable=%6.1f GiB  %s" % (
        r["time"], r["source"], r["decision"], r.get("model"), r.get("gpu"),
        r.get("peak_bytes", 0) / 2**30, r.get("usable_bytes", 0) / 2**30, r["user"]))
' "$dir/decisions.jsonl"
else
    cat "$dir/decisions.jsonl"
fi
if [ -x "$cli" ]; then
    show "mmguard report decisions.jsonl"
    "$cli" report "$dir/decisions.jsonl" || true
    echo "(on a GPU node the outcome carries the device peak: predicted vs measured, the error"
    echo " distribution and the margin advice above fill in; here the node has no GPU)"
fi

say "stopping the cluster"
