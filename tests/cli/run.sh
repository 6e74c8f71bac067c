#!/bin/sh
# tests/cli/run.sh - the mmguard CLI as a user runs it: exit codes (0 fits,
# 1 does not fit, 2 bad input), error lines naming file:line:col and the key,
# JSON output keys, --set, --help/--version.  MMGUARD=path/to/mmguard.
set -u
M=${MMGUARD:-build/mmguard}
D=contrib/models
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
# expect CODE CMD...: run, compare exit status, keep output in $T/out
expect() {
    want=$1; shift
    "$@" >"$T/out" 2>&1
    got=$?
    if [ "$got" -eq "$want" ]; then ok; else bad "exit $got (want $want): $*"; sed 's/^/    /' "$T/out"; fi
}
has() { if grep -q -- "$1" "$T/out"; then ok; else bad "output lacks '$1'"; sed 's/^/    /' "$T/out"; fi; }
hasnt() { if grep -q -- "$1" "$T/out"; then bad "output has '$1'"; else ok; fi; }

expect 0 "$M" --version;                      has "mmguard 0.1.0"
expect 0 "$M" --help;                         has "predict SPEC"
expect 0 "$M" predict --help;                 has "--set KEY=VALUE"
expect 2 "$M";                                has "usage"
expect 2 "$M" frobnicate;                     has "unknown command 'frobnicate'"
expect 2 "$M" predict;                        has "missing SPEC"
expect 2 "$M" predict $D/llava-1.5-7b-finetune.yaml --bogus; has "unknown option '--bogus'"

for s in $D/*.yaml; do
    expect 0 "$M" predict "$s";               has "peak per GPU"
    expect 0 "$M" predict "$s" --json
    if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); k=["name","peak_bytes","allocated_peak_bytes","peak_phase","factors","modules"]; assert all(x in d for x in k), k; assert d["peak_phase"] in ("forward","backward","optimizer"); assert set(d["factors"])=={"parameters","gradients","optimizer_states","activations","temporaries","overhead"}; assert all("layers" in m and "parameters_count" in m for m in d["modules"]); assert d["peak_bytes"] > d["allocated_peak_bytes"] > 0' "$T/out"; then ok; else bad "JSON of $s"; fi
done

# --set changes the prediction; a bad --set is exit 2 naming the key
"$M" predict $D/llava-1.5-7b-finetune.yaml --json > "$T/a.json"
"$M" predict $D/llava-1.5-7b-finetune.yaml --json --set training.micro_batch_size=4 --set language_model.num_hidden_layers=16 > "$T/b.json"
if python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); assert b["allocated_peak_bytes"] < a["allocated_peak_bytes"]; assert b["micro_batch_size"] == 4' "$T/a.json" "$T/b.json"; then ok; else bad "--set did not change the prediction"; fi
expect 2 "$M" predict $D/llava-1.5-7b-finetune.yaml --set training.micro_batch_size=0; has "training.micro_batch_size"
expect 2 "$M" predict $D/llava-1.5-7b-finetune.yaml --set languagemodel.hidden_size=8; has "did you mean 'language_model'"

# check: fits (0), does not fit (1), bad input (2)
expect 0 "$M" check $D/llava-1.5-7b-lora.yaml --gpu-mem 80GiB --margin 10%;  has "fits: predicted peak"
expect 1 "$M" check $D/llava-1.5-7b-finetune.yaml --gpu-mem 16GiB;           has "does not fit"
expect 1 "$M" check $D/llava-1.5-7b-finetune.yaml --gpu-mem 80GiB --set training.data_parallel=1; has "does not fit"
expect 2 "$M" check $D/llava-1.5-7b-finetune.yaml;                           has "--gpu-mem SIZE is required"
expect 2 "$M" check $D/llava-1.5-7b-finetune.yaml --gpu-mem 80XB;            has "unknown unit"
expect 2 "$M" check $D/llava-1.5-7b-finetune.yaml --gpu-mem 80GiB --margin 120%; has "margin"

# fit: answers the three questions
expect 1 "$M" fit $D/llava-1.5-7b-finetune.yaml --gpu-mem 48GiB --set training.data_parallel=1
has "no micro-batch runs"; has "smallest number of GPUs with ZeRO-3: "
expect 0 "$M" fit $D/llava-1.5-7b-lora.yaml --gpu-mem 80GiB --json;           has '"max_micro_batch"'
# a tensor-parallel spec: its GPUs are tp x dp, and no ZeRO / FSDP / GPU-count remedy is offered
expect 0 "$M" fit tests/slurm/specs/llama-8b-tp2.yaml --gpu-mem 40GiB
has "2 GPUs (tensor parallel 2 x data parallel 1)"; has "beside tensor parallelism are not modelled"
hasnt "no ZeRO stage runs"

# bad specs: one line naming file:line:col and the key, exit 2
printf 'name: x\nmodules:\n  - name: llm\n    type: llama\n    hidden_size: 64\n    num_hidden_layers: 1\n    num_attention_heads: 4\n    intermediate_size: 64\n    vocab_size: 100\ntraining:\n  micro_batch_size: 1\n  seq_len: 8\n  optimiser: adamw\n' > "$T/typo.yaml"
expect 2 "$M" predict "$T/typo.yaml";         has "typo.yaml:13:3: training.optimiser: unknown key (did you mean 'optimizer'?)"
if [ "$(wc -l < "$T/out")" -eq 1 ]; then ok; else bad "error is not one line"; fi
printf '{"name": "x", "modules": [}' > "$T/bad.json"
expect 2 "$M" predict "$T/bad.json";          has "bad.json:1:"
expect 2 "$M" predict "$T";                   has "not a regular file"
expect 2 "$M" predict "$T/missing.yaml";      has "cannot open"
mkfifo "$T/fifo" && { expect 2 timeout 10 "$M" predict "$T/fifo"; has "not a regular file"; }
head -c 2000000 /dev/zero | tr '\0' 'a' > "$T/big.yaml"
expect 2 "$M" predict "$T/big.yaml";          has "limit"

# LoRA targets are the module's own Linears: on a fused-qkv decoder (Phi-3, InternLM2, GLM)
# q_proj/v_proj match nothing, an error naming its Linears, not a job training nothing
cat >"$T/fused.yaml" <<'EOF'
name: fused-qkv-lora
modules:
  - name: language_model
    type: decoder
    family: llama
    hidden_size: 3072
    num_hidden_layers: 4
    num_attention_heads: 32
    num_key_value_heads: 32
    intermediate_size: 8192
    vocab_size: 32064
    qkv: fused
    trainable: false
    lora: {r: 8, target_modules: [q_proj, v_proj]}
training: {micro_batch_size: 1, seq_len: 512, precision: bf16}
EOF
expect 2 "$M" predict "$T/fused.yaml"
has "fused.yaml:14:35: language_model.lora.target_modules: 'q_proj' is not a linear layer of this decoder module"
has "its Linears: o_proj, qkv, gate_proj, up_proj, down_proj, qkv_proj, W_pack, query_key_value"
# the fused Linear by its name trains r x (in + out) per layer: 8 x (3072 + 9216) x 4 layers
sed 's/\[q_proj, v_proj\]/[qkv_proj]/' "$T/fused.yaml" >"$T/fused2.yaml"
expect 0 "$M" predict "$T/fused2.yaml" --json
has '"trainable_count":393216,'
# all-linear adapts the fused qkv too (it used to skip attention on such a decoder)
sed 's/\[q_proj, v_proj\]/all-linear/' "$T/fused.yaml" >"$T/fused3.yaml"
expect 0 "$M" predict "$T/fused3.yaml" --json
has '"trainable_count":1671168,'

# checkpointing only the attention (or the MLP) keeps the rest of the layer's activations:
# not modelled, so refused rather than predicted as whole-layer checkpointing (too low)
sed 's/training: {micro_batch_size: 1, seq_len: 512, precision: bf16}/training: {micro_batch_size: 1, seq_len: 512, gradient_checkpointing: {enabled: true, granularity: attention}}/; s/\[q_proj, v_proj\]/all-linear/' "$T/fused.yaml" >"$T/gran.yaml"
expect 2 "$M" predict "$T/gran.yaml"
has "training.gradient_checkpointing.granularity: 'attention' is not modelled yet"

# FSDP + gradient accumulation: the HF Trainer / Accelerate way (no_sync between micro-batches)
# keeps every unsharded gradient alive, torchtune's (sync_each_micro_batch) a sharded one:
# the forward peaks differ by exactly trainable x 2 B (bf16) x (1 - 1/4) at 4 GPUs
for v in true false; do
    "$M" predict $D/llama-3.1-8b-full.yaml --set training.gradient_accumulation_steps=4 \
        --set fsdp.sync_each_micro_batch=$v --json >"$T/ga-$v.json" 2>&1 || bad "predict ga $v"
done
if python3 -c 'import json,sys
a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2]))
d=b["phase_peak_bytes"]["forward"]-a["phase_peak_bytes"]["forward"]
want=a["trainable_count"]*2*3//4
sys.exit(0 if d==want else "no_sync adds %d, want %d" % (d, want))' "$T/ga-true.json" "$T/ga-false.json"
then ok; else bad "FSDP no_sync accumulation"; fi

# training.torch_compile: judged by the eager prediction as a bound; predict and check say so
cat >"$T/compile.yaml" <<'YAML'
name: tiny-compiled
modules:
  - {name: language_model, type: decoder, family: llama, hidden_size: 1024, num_hidden_layers: 4,
     num_attention_heads: 8, num_key_value_heads: 4, intermediate_size: 2816, vocab_size: 32000}
training: {micro_batch_size: 2, seq_len: 1024, precision: bf16, torch_compile: true}
YAML
expect 0 "$M" predict "$T/compile.yaml";             has "a bound        torch.compile: eager prediction, an upper bound"
expect 0 "$M" check "$T/compile.yaml" --gpu-mem 80GiB; has "judged by a bound: torch.compile"
expect 0 "$M" check "$T/compile.yaml" --gpu-mem 80GiB --json
if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["bound"].startswith("torch.compile: eager prediction")' "$T/out"; then ok; else bad "check --json bound"; fi
expect 2 "$M" predict "$T/compile.yaml" --set training.data_parallel=2; has "training.torch_compile: torch.compile with DDP is refused"

# Pixtral (issue 23): images at their own size, [IMG_BREAK] / [IMG_END] counted in the tokens
expect 0 "$M" predict $D/pixtral-12b-lora.yaml --set 'training.image_size=[600, 1000]' --json
if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert (d["image"]["patches"], d["image"]["tokens"]) == (2394, 2432), d' "$T/out"; then ok; else bad "pixtral tokens of a 600x1000 image"; fi
expect 2 "$M" predict $D/pixtral-12b-lora.yaml --set 'vision_tower.image_processor={kind: pixtral, longest_edge: 8}'; has "patch_size 16 exceeds the longest image side"
expect 2 "$M" predict $D/pixtral-12b-lora.yaml --set training.seq_len=4096; has "4160 image tokens"
echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
