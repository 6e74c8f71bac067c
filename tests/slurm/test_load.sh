#!/bin/sh
# test_load.sh - the mmguard SPANK plugin under load on a real single-node Slurm
# (tests/slurm/cluster.sh): N `sbatch --mm-model` submissions, P at a time, a
# mix of accepted, rejected and invalid specs (plus plain sbatch without
# --mm-model).  Every submission must get its own outcome (exit status and
# message) and the decision log must hold exactly one intact JSON line per
# decision, matched to its submission by job name.  Also measures submissions
# per second with the plugin not loaded and loaded.  Run by `make check-load`
# (as root); `make bench-load` runs it with a larger N.
#   PLUGIN=spank_mmguard.so  N=200  P=20  ROUNDS=1  KEEP=1 keeps the work directory.
# Prints "N passed, N failed" last; exit status 1 when anything failed.
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
PLUGIN=${PLUGIN:-$root/build/spank_mmguard.so}
N=${N:-200}
P=${P:-20}
SPECS=$here/specs
SMALL=$SPECS/llava-lora-small.yaml          # fits one h100: accept
BIG=$SPECS/llava-finetune-big.yaml          # does not fit: reject
BAD=$SPECS/invalid.yaml                     # invalid spec: error, on_error=reject
FT7=$root/contrib/models/llava-1.5-7b-finetune.yaml  # 8 GPUs: accept
FT13=$root/contrib/models/llava-1.5-13b-finetune.yaml # 4 GPUs: reject (needs 8)

. "$here/testlib.sh"
tl_start load
SHOW=why
LOG=$work/decisions.jsonl
unset MMGUARD_CONF

start() { # start PLUGIN [CONF_LINES...]
    _plugin=$1; shift
    printf '%s\n' "$@" >"$work/mmguard.conf"
    if [ "$_plugin" = none ]; then
        PLUGIN=none sh "$here/cluster.sh" start 2>"$work/cluster.err"
    else
        MMGUARD_CONF=$work/mmguard.conf PLUGIN=$_plugin sh "$here/cluster.sh" start 2>"$work/cluster.err"
    fi || {
        cat "$work/cluster.err"; echo "Bail out! cluster did not start"
        fail=$((fail + 1)); finish
    }
    . "$CLUSTER_DIR/env.sh"
}

# one submission: KIND I -> $work/r/I.{rc,out,err}.  Held jobs (nothing runs),
# a unique job name per submission so that the log line can be matched to it.
cat >"$work/one.sh" <<SH
#!/bin/sh
kind=\$1; i=\$2
case \$kind in
plain) set -- ;;
small) set -- --mm-model=$SMALL --gres=gpu:h100:1 ;;
big)   set -- --mm-model=$BIG --gres=gpu:h100:1 ;;
bad)   set -- --mm-model=$BAD --gres=gpu:h100:1 ;;
ft7)   set -- --mm-model=$FT7 --gres=gpu:h100:8 ;;
ft13x4) set -- --mm-model=$FT13 --gres=gpu:h100:4 ;;
esac
timeout 60 sbatch --hold -J "load-\$kind-\$i" -o /dev/null "\$@" --wrap true \
    >"$work/r/\$i.out" 2>"$work/r/\$i.err"
echo \$? >"$work/r/\$i.rc"
SH

# the workload: N lines "KIND I"; KINDS is a space-separated cycle
plan() { # plan KINDS...
    _i=0
    while [ $_i -lt "$N" ]; do
        for _k in "$@"; do
            [ $_i -lt "$N" ] || break
            echo "$_k $_i"; _i=$((_i + 1))
        done
    done >"$work/plan"
}

# fire the plan, P at a time (bounded: every sbatch has timeout 60, the whole
# run 300 s); prints the wall time in ns
fire() {
    rm -rf "$work/r"; mkdir "$work/r"
    _t0=$(date +%s%N)
    timeout 300 xargs -P "$P" -L 1 sh "$work/one.sh" <"$work/plan"
    _t1=$(date +%s%N)
    echo $((_t1 - _t0))
}

rate() { awk -v n="$1" -v ns="$2" 'BEGIN { printf "%.1f", n / (ns / 1e9) }'; }

echo "# plugin: $PLUGIN, N=$N, P=$P, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
[ -f "$PLUGIN" ] || { echo "Bail out! $PLUGIN not built"; exit 1; }
cd "$work" || exit 1

# Interleaved rounds (ROUNDS, default 1) so that drift on a shared machine hits
# both sides alike; the outcome checks run on every round.
ROUNDS=${ROUNDS:-1}
ns_none=0; ns_plain=0; ns_mix=0; ns_acc=0
round=1
while [ $round -le "$ROUNDS" ]; do
# ---- 1. reference: plugin not loaded, plain sbatch ----------------------------
start none
plan plain
sh "$work/one.sh" plain warmup >/dev/null 2>&1
ns_none=$((ns_none + $(fire)))
bad_rc=$(cat "$work"/r/*.rc | grep -cvx 0)
expect "round $round, no plugin: $N plain submissions all succeed" test "$bad_rc" -eq 0

# ---- 2. plugin loaded: plain sbatch, then the mixed --mm-model workload --------
rm -f "$LOG"
start "$PLUGIN" "action=reject" "margin=5%" "on_error=reject" "log=$LOG"
sh "$work/one.sh" plain warmup >/dev/null 2>&1
ns_plain=$((ns_plain + $(fire)))
bad_rc=$(cat "$work"/r/*.rc | grep -cvx 0)
expect "round $round, plugin loaded: $N plain submissions all succeed, nothing logged" \
    sh -c "[ $bad_rc -eq 0 ] && [ ! -s '$LOG' ]"
timeout 30 scancel --quiet --user="$(id -un)" || true

plan small big bad plain ft7 small ft13x4 big small bad
cp "$work/plan" "$work/plan.mix"
ns_mix=$((ns_mix + $(fire)))

# every submission: exit status, message, job id; every log line: JSON, matched
python3 - "$work/plan" "$work/r" "$LOG" >"$work/why" 2>&1 <<'PY'
import collections, json, os, re, sys
plan = [l.split() for l in open(sys.argv[1])]
rdir, log = sys.argv[2], sys.argv[3]
want = {"plain": (0, None), "small": (0, "accept"), "ft7": (0, "accept"),
        "big": (1, "reject"), "ft13x4": (1, "reject"), "bad": (1, "error")}
msg = {"accept": r"^sbatch: mmguard: --mm-model=\S+: predicted peak [0-9.]+ \S+ per GPU fits h100",
       "reject": r"^sbatch: error: mmguard: --mm-model=\S+: job rejected: predicted peak",
       "error": r"^sbatch: error: mmguard: --mm-model=\S+invalid.yaml: invalid spec: "}
bad = 0
expect_count = collections.Counter()
for kind, i in plan:
    rc = int(open(os.path.join(rdir, i + ".rc")).read() or -1)
    out = open(os.path.join(rdir, i + ".out")).read()
    err = open(os.path.join(rdir, i + ".err")).read()
    wrc, dec = want[kind]
    problems = []
    if rc != wrc:
        problems.append("rc %d, want %d" % (rc, wrc))
    if (wrc == 0) != bool(re.match(r"^Submitted batch job \d+$", out.strip())):
        problems.append("stdout %r" % out.strip())
    if dec and len(re.findall(msg[dec], err, re.M)) != 1:
        problems.append("no single %s message" % dec)
    if dec == "reject" and not re.search(r"^sbatch: error: mmguard: to fit: ", err, re.M):
        problems.append("no suggestion")
    if dec is None and "mmguard" in err:
        problems.append("plain sbatch got an mmguard message")
    if "cannot append" in err:
        problems.append("log write failed")
    if problems:
        bad += 1
        if bad <= 10:
            print("# submission %s %s: %s; stderr: %s" % (kind, i, "; ".join(problems), err[:300]))
    if dec:
        expect_count[(dec, "load-%s-%s" % (kind, i))] += 1
print("SUBMISSIONS_BAD", bad)

raw = open(log, "rb").read()
lines = raw.split(b"\n")
broken = 0
seen = collections.Counter()
per_decision = collections.Counter()
if lines and lines[-1] == b"":
    lines.pop()
else:
    broken += 1
    print("# log does not end with a newline")
for n, l in enumerate(lines, 1):
    try:
        r = json.loads(l)
        assert isinstance(r, dict) and r["source"] == "sbatch"
        seen[(r["decision"], r["job_name"])] += 1
        per_decision[r["decision"]] += 1
    except Exception as e:
        broken += 1
        if broken <= 5:
            print("# log line %d not an intact record (%s): %r" % (n, e, l[:120]))
dup = [k for k, c in seen.items() if c > 1]
missing = [k for k in expect_count if k not in seen]
extra = [k for k in seen if k not in expect_count]
for what, ks in (("duplicated", dup), ("missing", missing), ("unexpected", extra)):
    for k in ks[:5]:
        print("# log record %s: %s" % (what, k))
want_dec = collections.Counter(d for d, _ in expect_count.elements())
print("LOG_LINES", len(lines), "BROKEN", broken, "DUP", len(dup), "MISSING", len(missing),
      "EXTRA", len(extra))
print("PER_DECISION", " ".join("%s=%d/%d" % (d, per_decision[d], want_dec[d])
                               for d in ("accept", "reject", "error")))
sys.exit(0 if bad == 0 and broken == 0 and not dup and not missing and not extra
         and per_decision == want_dec else 1)
PY
py_rc=$?
summary=$(grep -E '^(SUBMISSIONS_BAD|LOG_LINES|PER_DECISION)' "$work/why" | tr '\n' ' ')
expect "round $round, mixed load: every submission got its outcome, one intact JSON line per decision ($summary)" \
    test "$py_rc" -eq 0
n_acc=$(grep -Ec '^(small|ft7)' "$work/plan")
n_plain=$(grep -c '^plain' "$work/plan")
held=$(timeout 30 squeue -h -t PD -o %j | grep -Ec '^load-(small|ft7|plain)-[0-9]+$')
: >"$work/why"
expect "round $round, mixed load: slurmctld holds exactly the accepted and plain jobs ($held = $n_acc + $n_plain)" \
    test "$held" -eq $((n_acc + n_plain))
timeout 30 scancel --quiet --user="$(id -un)" || true

# every submission accepted: the same slurmctld work as plain sbatch, plus the check
plan small ft7
n0=$(wc -l <"$LOG")
ns_acc=$((ns_acc + $(fire)))
bad_rc=$(cat "$work"/r/*.rc | grep -cvx 0)
expect "round $round, plugin loaded: $N accepted --mm-model submissions all succeed, $N more log lines" \
    sh -c "[ $bad_rc -eq 0 ] && [ \$(wc -l <'$LOG') -eq $((n0 + N)) ]"
timeout 30 scancel --quiet --user="$(id -un)" || true
round=$((round + 1))
done
total=$((N * ROUNDS))
rate_none=$(rate "$total" "$ns_none")
rate_plain=$(rate "$total" "$ns_plain")
rate_mix=$(rate "$total" "$ns_mix")
rate_acc=$(rate "$total" "$ns_acc")

# ---- numbers ----------------------------------------------------------------
echo "# submissions per second ($ROUNDS x $N sbatch per row, $P concurrent, held jobs, single-node loopback Slurm, $(nproc) CPUs shared):"
echo "#   plugin not loaded, plain sbatch:           $rate_none/s"
echo "#   plugin loaded, plain sbatch:               $rate_plain/s"
echo "#   plugin loaded, --mm-model, all accepted: $rate_acc/s"
echo "#   plugin loaded, mixed --mm-model workload:  $rate_mix/s ($(grep -Ec '^(small|ft7) ' "$work/plan.mix") accept, $(grep -Ec '^(big|ft13x4) ' "$work/plan.mix") reject, $(grep -c '^bad ' "$work/plan.mix") invalid, $n_plain plain)"
finish
