#!/bin/sh
# test_docs.sh MMGUARD_CLI - statements of the plugin's documentation that the
# review found wrong, held against what the code does:
#   - docs/plugin.md's sbatch costs: no wall-time figure from an older plugin
#     (8-12 ms, +2-4 ms, 1.2 ms per prediction, 30 ms mm_fit) survives, and the
#     instruction counts it quotes are the ones bench/sbatch_instructions.sh prints
#   - job_submit.lua says one thing about its Lua version (5.1, doubles)
#   - the README's module count: a spec has at most 3 modules (the CLI refuses
#     a fourth), not "at most 64"
# (mmguard.conf.example's resize_types is checked in tests/unit/test_config.c.)
# Prints "N passed, N failed".
cli=${1:-build/mmguard}
here=$(cd "$(dirname "$0")/../.." && pwd)
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok - $1"; }
no() { fail=$((fail + 1)); echo "not ok - $1"; }
t() { _n=$1; shift; if "$@"; then ok "$_n"; else no "$_n"; fi; }

t "docs/plugin.md: no stale wall-time figures of an older plugin" \
    sh -c "! grep -Eq '8–12 ms|\\+2–4 ms|1\\.2 ms|30 ms' '$here/docs/plugin.md'"
t "docs/plugin.md: the cost is given in counted instructions" \
    grep -q 'make bench-sbatch-instructions' "$here/docs/plugin.md"
t "job_submit.lua: written for Lua 5.1, no claim that 64-bit integers are needed" \
    sh -c "grep -q 'Lua 5.1' '$here/contrib/job_submit.lua' && ! grep -qi '64-bit integers are needed' '$here/contrib/job_submit.lua'"
t "README: no 'at most 64 modules'" sh -c "! grep -q 'at most 64 modules' '$here/README.md'"
if [ -x "$cli" ]; then
    spec=$(mktemp /tmp/mmguard-4mod.XXXXXX.yaml)
    awk '/^  - name: language_model/ { dup = 1 } { print } END { }' \
        "$here/contrib/models/llava-1.5-7b-finetune.yaml" >"$spec"
    # a fourth module: a second llama
    python3 - "$spec" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"(  - name: language_model.*?)(?=\n[a-z])", t, re.S)
t = t.replace(m.group(1), m.group(1) + "\n" + m.group(1).replace("language_model", "second_llm"))
open(sys.argv[1], "w").write(t)
PY
    "$cli" predict "$spec" >/dev/null 2>"$spec.err"
    t "a spec with 4 modules is refused (rc 2: $(head -c 120 "$spec.err"))" test $? -eq 2
    rm -f "$spec" "$spec.err"
else
    no "mmguard CLI $cli not built"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
