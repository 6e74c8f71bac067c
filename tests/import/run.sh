#!/bin/sh
# tests/import/run.sh - `mmguard import` on the published files of real jobs
# (tests/fixtures/import, see its SOURCES.md): the spec keys each reader writes,
# the assumptions and ignored keys it lists, errors with file:line:col, and
# round trips: an imported job predicts what the same job written by hand
# predicts, within 0.1 %.  MMGUARD=path/to/mmguard, IMPORT_DATA=the data.
set -u
M=${MMGUARD:-build/mmguard}
S=${IMPORT_DATA:-tests/fixtures/import}
H=tests/import/specs
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
[ -f "$S/SOURCES.md" ] || { echo "import: $S/SOURCES.md missing (the published files)"; exit 1; }
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
expect() {
    want=$1; shift
    "$@" >"$T/out" 2>&1
    got=$?
    if [ "$got" -eq "$want" ]; then ok; else bad "exit $got (want $want): $*"; sed 's/^/    /' "$T/out"; fi
}
# has TEXT: a line of the output contains TEXT (fixed string)
has() { if grep -qF -- "$1" "$T/out"; then ok; else bad "output lacks '$1'"; sed 's/^/    /' "$T/out" | head -80; fi; }
hasnt() { if grep -qF -- "$1" "$T/out"; then bad "output has '$1'"; else ok; fi; }
# key VALUE: a spec line "  key: VALUE" (before its comment)
key() { if grep -qE "^ +$1: $2( +#|$)" "$T/out"; then ok; else bad "no '$1: $2'"; grep -E "^ +$1:" "$T/out" | sed 's/^/    /'; fi; }
# same A B [SET...]: mmguard predict A and B (with the same --set) within 0.1 %
same() {
    a=$1; b=$2; shift 2
    "$M" predict "$a" --json "$@" > "$T/a.json" 2>&1 && "$M" predict "$b" --json "$@" > "$T/b.json" 2>&1 ||
        { bad "predict failed: $a / $b"; cat "$T/a.json" "$T/b.json" | head; return; }
    if python3 -c 'import json,sys
a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2]))
for k in ("peak_bytes", "allocated_peak_bytes"):
    if abs(a[k] - b[k]) > 0.001 * b[k]:
        sys.exit("%s: %d vs %d (%.3f %%)" % (k, a[k], b[k], 100.0 * (a[k] - b[k]) / b[k]))' "$T/a.json" "$T/b.json"
    then ok; else bad "round trip: $a vs $b"; fi
}
CAT="$T/cat"
mkdir -p "$CAT"
SA=$(cd "$S" && pwd)
printf '# a test catalog\nQwen/Qwen2.5-VL-7B-Instruct %s\nQwen/Qwen2-VL-7B-Instruct %s\nliuhaotian/llava-v1.5-7b %s\n' \
    "$SA/qwen2.5-vl-7b-instruct" "$SA/qwen2-vl-7b-instruct" \
    "$PWD/contrib/models/llava-1.5-7b-finetune.yaml" > "$CAT/catalog.txt"
L=$S/llava-scripts
F=$S/llamafactory
LLAVA="--hf $S/llava-1.5-7b-hf --args @$L/finetune_v1_5_flags.txt"

# ---- DeepSpeed: LLaVA's zero3.json with finetune.sh's flags ----------------------------
expect 0 "$M" import $LLAVA --deepspeed "$L/zero3.json"
key zero_stage 3;  key micro_batch_size 16;  key gradient_accumulation_steps 1
key precision bf16;  key seq_len 2048;  key gradient_checkpointing true
key reduce_bucket_size 16777216;  key stage3_prefetch_bucket_size 15099494
key stage3_param_persistence_threshold 40960;  key stage3_max_live_parameters 1000000000
key sub_group_size 1000000000;  key overlap_comm true;  key contiguous_gradients true
key max_grad_norm 0;  key select_layer -2;  key num_layers 2;  key attention flash
key optimizer adamw;  key transformers_version '"4.37.2"'
has 'the language model'"'"'s hidden_size 4096'
has "ignored train_batch_size: the global batch"
has "ignored fp16.loss_scale: dynamic loss scaling"
key stage3_max_reuse_distance 1000000000
has "ignored learning_rate: the learning rate"
has "finetune_v1_5_flags.txt:1:1: deepspeed: --deepspeed"
hasnt "data_parallel"
hasnt "allgather_bucket_size"
expect 0 "$M" import $LLAVA --deepspeed "$L/zero3.json" -o "$T/llava-z3.yaml"
same "$T/llava-z3.yaml" contrib/models/llava-1.5-7b-finetune.yaml --set training.data_parallel=8 \
    --set language_model.vocab_size=32064
same "$T/llava-z3.yaml" contrib/models/llava-1.5-7b-finetune.yaml --set training.data_parallel=1 \
    --set language_model.vocab_size=32064

# zero2.json: stage-1/2 buckets, stage-3 keys left out
expect 0 "$M" import $LLAVA --deepspeed "$L/zero2.json" -o "$T/llava-z2.yaml"
expect 0 cat "$T/llava-z2.yaml"
key zero_stage 2;  key reduce_bucket_size 16777216;  key allgather_bucket_size 500000000
key overlap_comm true
has "ignored zero_optimization.sub_group_size: not used by ZeRO stage 2"
hasnt "stage3_prefetch_bucket_size"
same "$T/llava-z2.yaml" "$H/llava-1.5-7b-zero2.yaml" --set training.data_parallel=8

# zero3_offload.json: CPU offload, its own AdamW, gradient_clipping "auto" = max_grad_norm
expect 0 "$M" import $LLAVA --deepspeed "$L/zero3_offload.json" -o "$T/llava-off.yaml"
expect 0 cat "$T/llava-off.yaml"
key offload_optimizer cpu;  key offload_param cpu;  key pin_memory true;  key max_grad_norm 1
has "ignored optimizer.params: learning rate"
has "ignored scheduler: the learning-rate schedule"
has "ignored steps_per_print: logging"
same "$T/llava-off.yaml" "$H/llava-1.5-7b-zero3-offload.yaml" --set training.data_parallel=8

# LLaMA-Factory's ds_z2_config.json: explicit buckets, overlap_comm false
expect 0 "$M" import $LLAVA --deepspeed "$F/ds_z2_config.json"
key reduce_bucket_size 500000000;  key allgather_bucket_size 500000000;  key overlap_comm false
key round_robin_gradients true
has "ignored zero_optimization.allgather_partitions"
has "ignored zero_allow_untested_optimizer"

# no trainer arguments: "auto" takes TrainingArguments' defaults, said so
expect 0 "$M" import --hf "$S/llava-1.5-7b-hf" --deepspeed "$L/zero3.json"
key micro_batch_size 8;  key precision fp32
has 'assumed train_micro_batch_size_per_gpu "auto" = 8'
has 'assumed bf16.enabled "auto" = false'

# ---- DeepSpeed errors: one line, file:line:col and the key --------------------------------
printf '{\n  "train_micro_batch_size_per_gpu": 4,\n  "zero_optimization": {"stage": 2}\n}\n' > "$T/mm.json"
expect 2 "$M" import $LLAVA --deepspeed "$T/mm.json"
has "mm.json:2:3: train_micro_batch_size_per_gpu: 4, but the trainer arguments"
has "per_device_train_batch_size = 16: transformers refuses the mismatch"
printf '{"zero_optimization": {"stage": 3,\n  "offload_param": {"device": "nvme", "nvme_path": "/x"}}}\n' > "$T/nvme.json"
expect 2 "$M" import $LLAVA --deepspeed "$T/nvme.json"
has "nvme.json:2:21: zero_optimization.offload_param.device: NVMe offload is not modelled"
printf '{"zero_optimization": {"stage": 0}}\n' > "$T/z0.json"
expect 2 "$M" import $LLAVA --deepspeed "$T/z0.json"
has "z0.json:1:24: zero_optimization.stage: DeepSpeed without ZeRO (stage 0) is not modelled"
printf '{"bf16": {"enabled": true},\n "zero_optimization": {"stage": 2, "stage3_prefetch_bucket_size": "auto"}}\n' > "$T/s2auto.json"
expect 2 "$M" import $LLAVA --deepspeed "$T/s2auto.json"
has "s2auto.json:2:36: zero_optimization.stage3_prefetch_bucket_size: \"auto\" is filled by transformers only at ZeRO stage 3"
printf '{"zero_optimization": {"stage": 2, "allgather_bucket_size": "auto"}}\n' > "$T/agauto.json"
expect 2 "$M" import $LLAVA --deepspeed "$T/agauto.json"
has 'zero_optimization.allgather_bucket_size: transformers fills "auto" only in'
printf '{"zero_optimization": {"stage": 2},\n "zero_optimisation": {}}\n' > "$T/typo.json"
expect 2 "$M" import $LLAVA --deepspeed "$T/typo.json"
has "typo.json:2:2: zero_optimisation: unknown DeepSpeed key"
expect 0 "$M" import $LLAVA --deepspeed "$T/typo.json" --allow-unknown
has "ignored zero_optimisation: unknown to mmguard (--allow-unknown)"
printf '{"zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 0}}\n' > "$T/reuse.json"
expect 0 "$M" import $LLAVA --deepspeed "$T/reuse.json"
key stage3_max_reuse_distance 0
printf '{"pipeline": {"stages": 2}, "zero_optimization": {"stage": 1}}\n' > "$T/pp.json"
expect 2 "$M" import $LLAVA --deepspeed "$T/pp.json"
has "pp.json:1:2: pipeline: pipeline parallelism is not modelled"
printf '{"optimizer": {"type": "Lamb"}, "zero_optimization": {"stage": 1}}\n' > "$T/lamb.json"
expect 2 "$M" import $LLAVA --deepspeed "$T/lamb.json"
has "optimizer.type: DeepSpeed optimizer 'Lamb' is not modelled"
printf '{"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8, "sub_group_size": -1}}\n' > "$T/neg.json"
expect 2 "$M" import $LLAVA --deepspeed "$T/neg.json"
has "neg.json:1:63: zero_optimization.sub_group_size: expected a non-negative integer"
printf '{"zero_optimization": {"stage": 2}' > "$T/broken.json"
expect 2 "$M" import $LLAVA --deepspeed "$T/broken.json"
has "broken.json:1:"

# ---- --args: flags as LLaVA's scripts pass them ----------------------------------------------
expect 0 "$M" import --hf "$S/llava-1.5-7b-hf" --args "deepspeed llava/train/train_mem.py \\
    --per_device_train_batch_size 4 --bf16 --optim adamw_bnb_8bit --tune_mm_mlp_adapter True \\
    --mm_projector_type mlp2x_gelu --model_max_length=1024 --lora_enable True --lora_r 128 --lora_alpha 256"
key micro_batch_size 4;  key precision bf16;  key optimizer adamw_8bit;  key seq_len 1024
key trainable false;  key num_layers 2
has "lora: {r: 128, alpha: 256, dropout: 0.05, target_modules: all-linear}"
has "ignored the words before the first --flag in --args: the launcher command"
expect 2 "$M" import --hf "$S/llava-1.5-7b-hf" --args "--per_device_train_batch_size 4 --frobnicate 3"
has "--args:1:33: frobnicate: unknown trainer key"
# DDP's keys map to ddp:, and are dropped when DeepSpeed wraps the model instead
expect 0 "$M" import --hf "$S/llava-1.5-7b-hf" --args "--ddp_bucket_cap_mb 50 --ddp_find_unused_parameters false"
key bucket_cap_mb 50;  key find_unused_parameters false
printf -- '--ddp_bucket_cap_mb 50\n' > "$T/ddp.txt"
expect 0 "$M" import --hf "$S/llava-1.5-7b-hf" --deepspeed "$L/zero2.json" --args @"$T/ddp.txt"
has "ignored ddp_bucket_cap_mb: DeepSpeed wraps the model, not DDP"
hasnt "bucket_cap_mb: 50"
# torch.compile: a text decoder is judged by the eager bound; a model with a vision tower is refused
printf '{"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 2816, "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": false}\n' > "$T/config.json"
expect 0 "$M" import --hf "$T/config.json" --args "--torch_compile True --per_device_train_batch_size 2"
key torch_compile true
expect 0 "$M" import --hf "$T/config.json" --args "--torch_compile_backend inductor --per_device_train_batch_size 2"
key torch_compile true
expect 2 "$M" import --hf "$S/llava-1.5-7b-hf" --args "--torch_compile True"
has "torch.compile of a model with a vision tower is refused"
expect 2 "$M" import --hf "$S/llava-1.5-7b-hf" --args "--torch_compile_mode reduce-overhead"
has "--args:1:1: torch_compile_mode: 'reduce-overhead' is not measured"
expect 2 "$M" import --hf "$S/llava-1.5-7b-hf" --args "--torch_compile True --torch_compile_backend aot_eager"
has "torch_compile_backend: 'aot_eager' is not measured"
# a pre-quantized checkpoint (config.json's quantization_config, issue 23): bitsandbytes
# is the decoder's modules[].quantization, as LLaMA-Factory's quantization_bit says it;
# the other methods, a quantized VLM and what bitsandbytes cannot be told are refused
BNB='"quantization_config": {"_load_in_4bit": true, "_load_in_8bit": false, "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true, "llm_int8_enable_fp32_cpu_offload": false, "llm_int8_has_fp16_weight": false, "llm_int8_skip_modules": null, "llm_int8_threshold": 6.0, "load_in_4bit": true, "load_in_8bit": false, "quant_method": "bitsandbytes"}'
mkdir -p "$T/bnb" "$T/plain"
cp "$T/config.json" "$T/plain/config.json"
sed "s/}\$/, $BNB}/" "$T/config.json" > "$T/bnb/config.json"
printf 'test/tiny-bnb-4bit %s\ntest/tiny %s\n' "$T/bnb" "$T/plain" >> "$CAT/catalog.txt"
printf 'model_name_or_path: test/tiny-bnb-4bit\nstage: sft\nfinetuning_type: lora\nlora_target: all\ncutoff_len: 1024\nper_device_train_batch_size: 2\nbf16: true\n' > "$T/lf-bnb.yaml"
expect 0 "$M" import --catalog "$CAT" --llamafactory "$T/lf-bnb.yaml" -o "$T/bnb.yaml"
expect 0 cat "$T/bnb.yaml"
has "quantization: {bits: 4, quant_type: nf4, double_quant: true} # quantization_config (bitsandbytes"
has "assumed training.precision is quantization_config.bnb_4bit_compute_dtype (bfloat16)"
has "ignored quantization_config.bnb_4bit_quant_storage: the packed weights' storage dtype"
sed 's/test\/tiny-bnb-4bit/test\/tiny/' "$T/lf-bnb.yaml" > "$T/lf-plain.yaml"
printf 'quantization_bit: 4\n' >> "$T/lf-plain.yaml"
expect 0 "$M" import --catalog "$CAT" --llamafactory "$T/lf-plain.yaml" -o "$T/plain.yaml"
same "$T/bnb.yaml" "$T/plain.yaml"
expect 2 "$M" import --hf "$T/bnb/config.json" --args "--per_device_train_batch_size 2 --bf16 True"
has "quantized base weights cannot be trained: set trainable: false (QLoRA)"
q() { sed "s/}\$/, \"quantization_config\": $1}/" "$T/config.json" > "$T/q/config.json"; }
# qr CONFIG TEXT: that quantization_config is refused with TEXT
qr() { q "$1"; expect 2 "$M" import --hf "$T/q/config.json"; has "$2"; }
mkdir -p "$T/q"
q '{"quant_method": "bitsandbytes", "load_in_8bit": true, "bnb_4bit_compute_dtype": "float32"}'
expect 2 "$M" import --hf "$T/q/config.json" # (written, then refused: nothing trains it)
has "quantization: {bits: 8}"
qr '{"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false}' \
    "quantization_config.quant_method: 'gptq'-quantized bases are not modelled"
qr '{"quant_method": "awq", "bits": 4}' "'awq'-quantized bases are not modelled"
qr '{"quant_method": "bitsandbytes", "load_in_4bit": true}' \
    "bnb_4bit_compute_dtype: 'float32': the quantized Linears would compute in it"
qr '{"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_compute_dtype": "bfloat16", "llm_int8_skip_modules": ["lm_head", "mlp"]}' \
    "llm_int8_skip_modules: only [lm_head] is modelled"
qr '{"quant_method": "bitsandbytes", "load_in_4bit": true, "load_in_8bit": true}' \
    "expected exactly one of load_in_4bit and load_in_8bit"
qr '{"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_typo": 1}' \
    "quantization_config.bnb_4bit_typo: unknown quantization_config key"
sed "s/}\$/, $BNB}/" "$S/llava-1.5-7b-hf/config.json" > "$T/q/config.json"
expect 2 "$M" import --hf "$T/q/config.json"
has "a quantized vision-language checkpoint"
# VLMs whose connector no family describes: refused with what is missing
sed 's/"model_type": "llama"/"model_type": "minicpmv"/' "$T/config.json" > "$T/q/config.json"
expect 2 "$M" import --hf "$T/q/config.json"
has "model_type: 'minicpmv' is refused: MiniCPM-V's connector is a perceiver resampler"
expect 2 "$M" import --hf "$S/llava-1.5-7b-hf" --args "--optim lion_32bit"
has "optim: optimizer 'lion_32bit' is not modelled"
expect 2 "$M" import --hf "$S/llava-1.5-7b-hf" --args "--bf16 True --bf16 False"
has "--args:1:13: --bf16: given twice"
expect 2 "$M" import --hf "$S/llava-1.5-7b-hf" --args "--bf16 'True"
has "unterminated quote"
expect 2 "$M" import --hf "$S/llava-1.5-7b-hf" --args "--image_aspect_ratio anyres --mm_projector_type mlp2x_gelu"
has "image_aspect_ratio: 'anyres' is not modelled"

# ---- --trainer: TRL SFTConfig and HF TrainingArguments files ----------------------------------
cat > "$T/sft.yaml" <<'YAML'
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
max_length: 4096
packing: true
use_liger_kernel: true
attn_implementation: flash_attention_2
gradient_checkpointing_kwargs:
  use_reentrant: false
optim: paged_adamw_8bit
learning_rate: 2.0e-5
report_to: none
deepspeed: ds.json
YAML
printf '{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",\n "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}\n' > "$T/ds.json"
expect 0 "$M" import --hf "$S/qwen2-vl-7b-instruct" --trainer "$T/sft.yaml" -o "$T/sft-spec.yaml"
expect 0 cat "$T/sft-spec.yaml"
key micro_batch_size 2;  key gradient_accumulation_steps 4;  key seq_len 4096;  key packing true
# use_liger_kernel on Qwen2-VL: the Trainer's instance patch (text norms, MLPs, the vision
# blocks' LayerNorms, the loss) is modelled: training.liger_kernel, predicted
key liger_kernel true;  hasnt "not modelled yet";  key attention flash;  key optimizer paged_adamw_8bit;  key zero_stage 2
key precision bf16;  key reduce_bucket_size 12845056
expect 0 "$M" predict "$T/sft-spec.yaml"
expect 0 cat "$T/sft-spec.yaml"
has "gradient_checkpointing: {enabled: true, use_reentrant: false}"
has "assumed TRL SFTConfig's defaults"
printf '{"per_device_train_batch_size": 4, "bf16": true, "fsdp": "full_shard auto_wrap offload",\n "fsdp_config": {"backward_prefetch": "backward_pre", "fsdp_transformer_layer_cls_to_wrap": ["Qwen2VLDecoderLayer"]}}\n' > "$T/fsdp.json"
expect 0 "$M" import --hf "$S/qwen2-vl-7b-instruct" --trainer "$T/fsdp.json"
key version 1;  key sharding_strategy FULL_SHARD;  key cpu_offload true;  key backward_prefetch BACKWARD_PRE
key gradient_checkpointing false;  key optimizer adamw
has "assumed transformers TrainingArguments's defaults"
printf '{"per_device_train_batch_size": 4, "fsdp": "hybrid_shard"}\n' > "$T/hybrid.json"
expect 2 "$M" import --hf "$S/qwen2-vl-7b-instruct" --trainer "$T/hybrid.json"
has "hybrid.json:1:36: fsdp: 'hybrid_shard' is not modelled"
# size-based auto-wrap (fsdp.wrap_policy size): accelerate's key names, transformers 4's
# min_num_params alone, min_num_params 0 (no policy) and NO_WRAP refused, FSDP2 refused
printf '{"per_device_train_batch_size": 4, "fsdp": "full_shard auto_wrap",\n "fsdp_config": {"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP"}}\n' > "$T/sizewrap.json"
expect 2 "$M" import --hf "$S/qwen2-vl-7b-instruct" --trainer "$T/sizewrap.json"
has "SIZE_BASED_WRAP with min_num_params 0"
printf '{"model_name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "per_device_train_batch_size": 1, "bf16": true, "fsdp": "full_shard auto_wrap",\n "fsdp_config": {"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP", "fsdp_min_num_params": 100000000}}\n' > "$T/sizewrap2.json"
expect 0 "$M" import --catalog contrib/models --trainer "$T/sizewrap2.json" -o "$T/sizewrap2.yaml"
expect 0 cat "$T/sizewrap2.yaml"
key wrap_policy size;  key min_num_params 100000000
expect 0 "$M" predict "$T/sizewrap2.yaml" --set training.data_parallel=8
has "peak per GPU"
printf '{"model_name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "per_device_train_batch_size": 1, "bf16": true, "fsdp": "full_shard auto_wrap",\n "fsdp_config": {"min_num_params": 20000000}}\n' > "$T/sizewrap3.json"
expect 0 "$M" import --catalog contrib/models --trainer "$T/sizewrap3.json"
key wrap_policy size;  key min_num_params 20000000
has "transformers 4: min_num_params > 0 selects SIZE_BASED_WRAP"
printf '{"per_device_train_batch_size": 4, "fsdp": "full_shard auto_wrap",\n "fsdp_config": {"auto_wrap_policy": "NO_WRAP"}}\n' > "$T/nowrap.json"
expect 2 "$M" import --hf "$S/qwen2-vl-7b-instruct" --trainer "$T/nowrap.json"
has "NO_WRAP is not modelled"
printf '{"per_device_train_batch_size": 4, "fsdp": "full_shard auto_wrap",\n "fsdp_config": {"version": 2, "auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 1000}}\n' > "$T/sizewrap4.json"
expect 2 "$M" import --hf "$S/qwen2-vl-7b-instruct" --trainer "$T/sizewrap4.json"
has "SIZE_BASED_WRAP is modelled for FSDP1 only"
printf '{"per_device_train_batch_size": 4, "fsdp": "full_shard auto_wrap",\n "fsdp_config": {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}}\n' > "$T/tfwrap.json"
expect 0 "$M" import --hf "$S/qwen2-vl-7b-instruct" --trainer "$T/tfwrap.json"
key sharding_strategy FULL_SHARD
printf 'per_device_train_batch_size: 2\nauto_find_batch_size: true\n' > "$T/afb.yaml"
expect 2 "$M" import --hf "$S/qwen2-vl-7b-instruct" --trainer "$T/afb.yaml"
has "afb.yaml:2:1: auto_find_batch_size: the batch is found at run time"

# ---- LLaMA-Factory: the published Qwen2-VL family examples -------------------------------------
expect 0 "$M" import --catalog "$CAT" --llamafactory "$F/qwen2_5vl_full_sft.yaml" --deepspeed "$F/ds_z3_config.json"
key micro_batch_size 1;  key gradient_accumulation_steps 2;  key seq_len 2048;  key zero_stage 3
key precision bf16;  key attention sdpa;  key overlap_comm false;  key reduce_bucket_size 12845056
key stage3_prefetch_bucket_size 11560550;  key stage3_param_persistence_threshold 35840
has "image_processor: {kind: dynamic, min_pixels: 1024, max_pixels: 262144}"
has "gradient_checkpointing: {enabled: true, use_reentrant: true}"
has "trainable: false                             # freeze_vision_tower"
has "trainable: false                             # freeze_multi_modal_projector"
has "trainable: true                              # freeze_language_model"
has "assumed Qwen/Qwen2.5-VL-7B-Instruct is the catalog's"
has "qwen2_5vl_full_sft.yaml:14:1: deepspeed: --deepspeed"
has "ignored template: data loading"
has "ignored ddp_timeout: run metadata"
hasnt "image_size: [768, 768]"
hasnt "data_parallel"
expect 0 "$M" import --catalog "$CAT" --llamafactory "$F/qwen2_5vl_full_sft.yaml" --deepspeed "$F/ds_z3_config.json" -o "$T/q25full.yaml"
same "$T/q25full.yaml" "$H/qwen2_5vl_full_sft.yaml"
same "$T/q25full.yaml" "$H/qwen2_5vl_full_sft.yaml" --set training.data_parallel=8

expect 0 "$M" import --catalog "$CAT" --llamafactory "$F/qwen2_5vl_lora_sft.yaml" -o "$T/q25lora.yaml"
expect 0 cat "$T/q25lora.yaml"
has "lora: {r: 8, alpha: 16, dropout: 0, target_modules: all-linear}"
key gradient_accumulation_steps 8;  key optimizer adamw;  key optimizer_impl fused
has "assumed 16-bit LoRA adapters"
hasnt "zero_stage"
same "$T/q25lora.yaml" "$H/qwen2_5vl_lora_sft.yaml"
# LoRA on lm_head / embed_tokens (issue 23): a named lora_target passes them to the spec
sed 's/^lora_target: all/lora_target: q_proj,v_proj,lm_head,embed_tokens/' "$F/qwen2_5vl_lora_sft.yaml" > "$T/lf-head.yaml"
expect 0 "$M" import --catalog "$CAT" --llamafactory "$T/lf-head.yaml" -o "$T/lf-head-spec.yaml"
expect 0 cat "$T/lf-head-spec.yaml"
has "target_modules: [q_proj, v_proj, lm_head, embed_tokens]}"
expect 0 "$M" predict "$T/lf-head-spec.yaml"
# qwen2vl_lora_sft.yaml as published names Qwen2.5-VL-7B too: the same job
expect 0 "$M" import --catalog "$CAT" --llamafactory "$F/qwen2vl_lora_sft.yaml" -o "$T/q2lora.yaml"
same "$T/q2lora.yaml" "$H/qwen2_5vl_lora_sft.yaml"

expect 0 "$M" import --catalog "$CAT" --llamafactory "$F/qwen2vl_full_sft.yaml" --deepspeed "$F/ds_z3_config.json" -o "$T/q2full.yaml"
expect 0 cat "$T/q2full.yaml"
key family patch_merger;  key hidden_act quick_gelu
same "$T/q2full.yaml" "$H/qwen2vl_full_sft.yaml"
# the offload variant: parameters and optimizer states on the host
expect 0 "$M" import --catalog "$CAT" --llamafactory "$F/qwen2vl_full_sft.yaml" --deepspeed "$F/ds_z3_offload_config.json"
key offload_optimizer cpu;  key offload_param cpu;  key pin_memory true

# the model and DeepSpeed paths as published (relative to LLaMA-Factory's checkout): errors
expect 2 "$M" import --catalog "$CAT" --llamafactory "$F/qwen2_5vl_full_sft.yaml"
has "qwen2_5vl_full_sft.yaml:14:1: deepspeed: "
has "ds_z3_config.json: cannot open"
expect 2 "$M" import --catalog "$CAT" --llamafactory "$F/qwen3vl_full_sft.yaml" --deepspeed "$F/ds_z3_config.json"
has "qwen3vl_full_sft.yaml:2:1: model_name_or_path: Qwen/Qwen3-VL-4B-Instruct: no directory"
has "the id is not in the catalog"
expect 2 "$M" import --catalog "$CAT" --llamafactory "$F/qwen2_vl_full.megatron.yaml"
has "qwen2_vl_full.megatron.yaml:24:1: tensor_model_parallel_size: Megatron (mcore_adapter) training is not modelled"
printf 'model_name_or_path: Qwen/Qwen2-VL-7B-Instruct\nfinetuning_type: freeze\n' > "$T/freeze.yaml"
expect 2 "$M" import --catalog "$CAT" --llamafactory "$T/freeze.yaml"
has "freeze.yaml:2:1: finetuning_type: 'freeze' is not modelled"
# use_liger_kernel on LLaVA over Llama: the Trainer patches the built model, its text model
# too: training.liger_kernel (predicted); liger_kernel_config's rope does not reach it
printf 'use_liger_kernel: true\nliger_kernel_config: {rope: false, fused_linear_cross_entropy: true}\n' > "$T/lg.yaml"
expect 0 "$M" import --hf "$S/llava-1.5-7b-hf" --trainer "$T/lg.yaml" -o "$T/lg-spec.yaml"
expect 0 cat "$T/lg-spec.yaml"
key liger_kernel '\{fused_linear_cross_entropy: true\}'
has "ignored liger_kernel_config.rope: _apply_liger_kernel_to_instance"
hasnt "loss: fused_linear"
expect 0 "$M" predict "$T/lg-spec.yaml"
printf 'use_liger_kernel: true\n' > "$T/lg.yaml"
expect 0 "$M" import --hf "$S/llava-1.5-7b-hf" --trainer "$T/lg.yaml"
key liger_kernel true
# Qwen2.5-VL: liger_kernel_config's layer_norm is no parameter of its function (dropped)
printf 'use_liger_kernel: true\nliger_kernel_config: {layer_norm: false, swiglu: false}\n' > "$T/lg.yaml"
expect 0 "$M" import --hf "$S/qwen2.5-vl-7b-instruct" --trainer "$T/lg.yaml" -o "$T/lg-spec.yaml"
expect 0 cat "$T/lg-spec.yaml"
key liger_kernel '\{swiglu: false\}';  has "ignored liger_kernel_config.layer_norm"
expect 0 "$M" predict "$T/lg-spec.yaml"
printf 'model_name_or_path: Qwen/Qwen2-VL-7B-Instruct\nstage: dpo\n' > "$T/dpo.yaml"
expect 2 "$M" import --catalog "$CAT" --llamafactory "$T/dpo.yaml"
has "dpo.yaml:2:1: stage: stage dpo is not modelled"
cat > "$T/lf.yaml" <<'YAML'
model_name_or_path: Qwen/Qwen2-VL-7B-Instruct
finetuning_type: lora
lora_rank: 16
lora_alpha: 64
lora_target: q_proj,v_proj
quantization_bit: 4
enable_liger_kernel: true
neat_packing: true
flash_attn: fa2
disable_gradient_checkpointing: true
image_max_pixels: 589824
per_device_train_batch_size: 2
bf16: true
YAML
expect 0 "$M" import --catalog "$CAT" --llamafactory "$T/lf.yaml"
has "lora: {r: 16, alpha: 64, dropout: 0, target_modules: [q_proj, v_proj]}"
has "quantization: {bits: 4, quant_type: nf4, double_quant: true}"
# enable_liger_kernel: the class patch before the model is built; on transformers 5.17 its
# RMSNorm / RoPE swaps name nothing the module uses: the MLP, LayerNorm and loss are Liger's
key liger_kernel '\{rms_norm: false\}';  has "names transformers 5.17 no longer uses"
key packing true;  key attention flash;  key gradient_checkpointing false
key micro_batch_size 2
has "max_pixels: 589824"
printf 'model_name_or_path: Qwen/Qwen2-VL-7B-Instruct\nlora_rank: eight\n' > "$T/rank.yaml"
expect 2 "$M" import --catalog "$CAT" --llamafactory "$T/rank.yaml"
has "rank.yaml:2:1: lora_rank: expected a non-negative integer"
printf 'model_name_or_path: Qwen/Qwen2-VL-7B-Instruct\nuse_dora: true\n' > "$T/dora.yaml"
expect 2 "$M" import --catalog "$CAT" --llamafactory "$T/dora.yaml"
has "dora.yaml:2:1: use_dora: only false (LLaMA-Factory's default) is modelled"

# ---- the catalog -------------------------------------------------------------------------------
expect 0 "$M" import --catalog "$CAT" --hf Qwen/Qwen2-VL-7B-Instruct
key family qwen2_vl;  key num_hidden_layers 28
# an entry that is a preset spec: its modules, the job's training
expect 0 "$M" import --catalog "$CAT" --hf liuhaotian/llava-v1.5-7b --args "@$L/finetune_v1_5_flags.txt" --deepspeed "$L/zero3.json" -o "$T/preset.yaml"
expect 0 cat "$T/preset.yaml"
has "ignored the preset's training sections"
key vocab_size 32000
same "$T/preset.yaml" contrib/models/llava-1.5-7b-finetune.yaml --set training.data_parallel=8
expect 2 "$M" import --catalog "$CAT" --hf nobody/no-such-model
has "nobody/no-such-model: no directory 'nobody/no-such-model', and the id is not in the catalog"
printf 'one-field-only\n' > "$T/catalog.txt"
expect 2 "$M" import --catalog "$T" --hf a/b
has "catalog.txt:1:1: expected 'HF-ID FILE'"
# the shipped catalog, when its presets are there
expect 0 "$M" import --catalog contrib/models --hf liuhaotian/llava-v1.5-7b
key num_hidden_layers 32

# the uninstalled binary finds its own tree's catalog from any directory (no --catalog, no
# MMGUARD_CATALOG): a LLaMA-Factory YAML that names its model by HF id, run from elsewhere
MA=$(cd "$(dirname "$M")" && pwd)/$(basename "$M")
FA=$(cd "$F" && pwd)
expect 0 sh -c 'cd "$1" && env -u MMGUARD_CATALOG "$2" import --llamafactory "$3"' - "$T" "$MA" \
    "$FA/qwen2_5vl_lora_sft.yaml"
has "lora: {r: 8, alpha: 16, dropout: 0, target_modules: all-linear}"
has "/contrib/models/qwen2.5-vl-7b-full.yaml"
expect 0 sh -c 'cd / && env -u MMGUARD_CATALOG "$1" import --hf Qwen/Qwen2-VL-7B-Instruct' - "$MA"
key num_hidden_layers 28

# FSDP with gradient accumulation: HF Trainer's no_sync, unless accelerator_config says
# sync_each_batch (fsdp.sync_each_micro_batch, docs/parallel.md)
printf '{"model_name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "bf16": true, "fsdp": "full_shard auto_wrap"}' >"$T/fsdp-ga.json"
expect 0 "$M" import --catalog contrib/models --trainer "$T/fsdp-ga.json"
key sync_each_micro_batch false
printf '{"model_name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "bf16": true, "fsdp": "full_shard auto_wrap", "accelerator_config": {"gradient_accumulation_kwargs": {"sync_each_batch": true}}}' >"$T/fsdp-ga2.json"
expect 0 "$M" import --catalog contrib/models --trainer "$T/fsdp-ga2.json"
key sync_each_micro_batch true

# ---- torchtitan: its published Llama 3 train_configs (TOML) ----------------------------------
TT=$S/torchtitan
expect 0 "$M" import --catalog contrib/models --torchtitan "$TT/llama3_8b.toml" -o "$T/tt8b.yaml"
expect 0 cat "$T/tt8b.yaml"
key micro_batch_size 1;  key seq_len 8192;  key precision bf16;  key optimizer adamw
key optimizer_impl fused;  key version 2;  key reshard_after_forward true
key model_dtype fp32;  key param_dtype bf16;  key reduce_dtype fp32;  key hidden_size 4096
key intermediate_size 14336;  key vocab_size 128256;  key trainable true;  key attention sdpa
key gradient_checkpointing '\{enabled: true, use_reentrant: false, granularity: selective_op\}'
has "llama-3.1-8b-full.yaml"
has "ignored optimizer.lr: the learning rate"
has "ignored compile.enable: false is torchtitan's default"
hasnt "  data_parallel:"
# the 8B's prediction runs, and equals the same job written with the catalog's modules
expect 0 "$M" predict "$T/tt8b.yaml" --set training.data_parallel=8
has "peak per GPU"
# debugmodel: the flavor table (dim 256, 6 layers, 16 heads, FFN 8*256/3 -> 682 -> 768)
expect 0 "$M" import --torchtitan "$TT/debug_model.toml"
key hidden_size 256;  key num_hidden_layers 6;  key num_attention_heads 16
key num_key_value_heads 16;  key intermediate_size 768;  key vocab_size 2048
key micro_batch_size 8;  key seq_len 2048
key gradient_checkpointing '\{enabled: true, use_reentrant: false, every_n_layers: 2\}'
has "ignored parallelism.pipeline_parallel_schedule: pipeline parallelism only"
# 70B: 8-way tensor parallelism beside FSDP2 (2-D) is refused with its line; with it switched off (an edited
# copy, labelled in SOURCES.md) it imports: FFN 1.3 x 8*8192/3 rounded up to 4096 = 28672
expect 2 "$M" import --torchtitan "$TT/llama3_70b.toml"
has "llama3_70b.toml:41:1: parallelism.tensor_parallel_degree: 8: not mapped: mmguard models one tensor-parallel group without FSDP"
expect 0 "$M" import --torchtitan "$TT/llama3_70b.edited-tp1.toml" -o "$T/tt70.yaml"
expect 0 cat "$T/tt70.yaml"
key hidden_size 8192;  key num_hidden_layers 80;  key intermediate_size 28672
key gradient_checkpointing '\{enabled: true, use_reentrant: false\}'
expect 0 "$M" predict "$T/tt70.yaml" --set training.data_parallel=64
# errors name file:line:col and the key; each reason
tt() { printf "$1" > "$T/t.toml"; expect 2 "$M" import --torchtitan "$T/t.toml"; has "$2"; }
tt '[model]\nflavor = "8B"\n[parallelism]\npipeline_parallel_degree = 2\n' \
    "t.toml:4:1: parallelism.pipeline_parallel_degree: 2: pipeline parallelism is not modelled"
tt '[model]\nflavor = "debugmodel"\n[parallelism]\ndata_parallel_replicate_degree = 2\n' \
    "t.toml:4:1: parallelism.data_parallel_replicate_degree: 2: HSDP"
tt '[model]\nflavor = "debugmodel"\n[parallelism]\ncontext_parallel_degree = 4\n' \
    "t.toml:4:1: parallelism.context_parallel_degree: 4: context parallelism is not modelled"
# compile.enable = true (components ["model", "loss"]): each block compiled before fully_shard
# (apply_compile) maps to training.torch_compile, judged under FSDP2 by the eager prediction as
# a bound (every measured compiled FSDP2 row is at or under it, docs/oracle.md)
sed 's/^enable=false$/enable=true/' "$TT/debug_model.toml" > "$T/tt-compile.toml"
expect 0 grep -c '^enable=true' "$T/tt-compile.toml"
expect 0 "$M" import --torchtitan "$T/tt-compile.toml" -o "$T/tt-compile.yaml"
expect 0 cat "$T/tt-compile.yaml"
key torch_compile true
hasnt "compile.enable: false is torchtitan's default"
expect 0 "$M" predict "$T/tt-compile.yaml" --json
has '"bound":"torch.compile: eager prediction, an upper bound on the measured rows'
expect 0 "$M" import --torchtitan "$TT/debug_model.toml"
has "ignored compile.enable: false is torchtitan's default"
# the 8B recipe (op-level selective checkpointing) compiled: refused, that policy compiled is not
# measured
sed 's/^enable=false$/enable=true/' "$TT/llama3_8b.toml" > "$T/tt8c.toml"
expect 2 "$M" import --catalog contrib/models --torchtitan "$T/tt8c.toml"
has "training.torch_compile: torch.compile with granularity selective_op is not measured"
# components = []: nothing compiled (parallelize.py: "model" not in components), the eager job
printf '[model]\nflavor = "debugmodel"\n[compile]\nenable = true\ncomponents = []\n' > "$T/t0.toml"
expect 0 "$M" import --torchtitan "$T/t0.toml"
hasnt "torch_compile"
tt '[model]\nflavor = "debugmodel"\n[compile]\nenable = true\ncomponents = ["loss"]\n' \
    "t.toml:5:1: compile.components: the loss compiled alone, the blocks eager, is not measured"
tt '[model]\nflavor = "debugmodel"\n[compile]\nenable = true\nbackend = "aot_eager"\n' \
    "t.toml:5:1: compile.backend: 'aot_eager' is not measured"
tt '[model]\nflavor = "debugmodel"\n[compile]\nenable = true\ncomponents = ["model", 3]\n' \
    "t.toml:5:1: compile.components: expected \"model\" and / or \"loss\""
tt '[model]\nflavor = "debugmodel"\nconverters = ["float8"]\n' \
    "t.toml:3:1: model.converters: model converters (float8, MX) are not modelled"
tt '[model]\nflavor = "8B_flex"\n' "t.toml:2:1: model.flavor: '8B_flex' is not mapped"
tt '[model]\nname = "qwen3"\n' "t.toml:2:1: model.name: 'qwen3': only torchtitan's llama3"
tt '[activation_checkpoint]\nmode = "memory_budget"\n' "t.toml:2:1: activation_checkpoint.mode: 'memory_budget'"
tt '[activation_checkpoint]\nselective_ac_option = "x"\n' "t.toml:2:1: activation_checkpoint.selective_ac_option: 'x'"
tt '[optimizer]\nname = "Lion"\n' "t.toml:2:1: optimizer.name: 'Lion'"
tt '[training]\nlocal_batch_size = 2\nno_such_key = 1\n' "t.toml:3:1: training.no_such_key: unknown torchtitan key"
tt '[nonsense]\nx = 1\n' "t.toml:1:2: nonsense: unknown torchtitan key"
tt '[training]\nseq_len = 1\nseq_len = 2\n' "t.toml:3:1: seq_len: defined twice"
tt '[training]\n[training]\n' "t.toml:2:1: table [training] defined twice"
tt '[training]\nseq_len = "x\n' "t.toml:2:13: unterminated string"
tt '[training]\nseq_len = 0x10\n' "t.toml:2:11: hexadecimal, octal and binary integers are not read"
tt '[training]\nseq_len = {a = 1}\n' "t.toml:2:11: inline tables are not read"
tt '[training]\nseq_len = 2048 x\n' "t.toml:2:16: expected the end of the line"
tt 'seq_len = 2048\n' "t.toml:1:1: seq_len: a value outside any table"
tt '[training]\nlocal_batch_size = 0\n' "t.toml:2:1: training.local_batch_size: 0 is out of range"
tt '[training]\nmixed_precision_param = "float16"\n' "t.toml:2:1: training.mixed_precision_param: expected bfloat16 or float32"
# dotted keys, arrays over lines, comments and literal strings: TOML the configs may use
printf '[model]\nflavor = '"'"'debugmodel'"'"'  # c\nconverters = [\n  # none\n]\n[training]\nlocal_batch_size = 1_6\n[parallelism]\ndata_parallel_shard_degree = 4\n[activation_checkpoint]\nmode = "none"\n[optimizer]\nimplementation = "foreach"\n' > "$T/ok.toml"
expect 0 "$M" import --torchtitan "$T/ok.toml"
key micro_batch_size 16;  key data_parallel 4;  key gradient_checkpointing false
key optimizer_impl foreach

# ---- ms-swift: its published Qwen-VL example scripts (`swift sft` flags) ---------------------
SW=$S/ms-swift
expect 0 "$M" import --catalog "$CAT" --swift "$SW/ocr.sh" -o "$T/sw-ocr.yaml"
expect 0 cat "$T/sw-ocr.yaml"
key micro_batch_size 1;  key gradient_accumulation_steps 16;  key seq_len 4096;  key precision bf16
key attention sdpa;  key num_hidden_layers 28
key image_processor '\{kind: dynamic, min_pixels: 3136, max_pixels: 1003520\}'
key gradient_checkpointing '\{enabled: true, use_reentrant: true\}'
key lora '\{r: 8, alpha: 32, dropout: 0.05, target_modules: all-linear\}'
has "trainable: false                             # freeze_vit (ms-swift default true)"
has "ignored dataset: data loading and templating, on the host"
has "ignored learning_rate: "
has "ignored CUDA_VISIBLE_DEVICES: the GPU count is the job's"
hasnt "image_size:"
expect 0 "$M" predict "$T/sw-ocr.yaml"
has "peak per GPU"
# LoRA on lm_head / embed_tokens (issue 23): named targets reach the spec, which models them
sed 's/--target_modules all-linear/--target_modules q_proj v_proj lm_head embed_tokens/' "$SW/ocr.sh" > "$T/sw-head.sh"
expect 0 "$M" import --catalog "$CAT" --swift "$T/sw-head.sh" -o "$T/sw-head.yaml"
expect 0 cat "$T/sw-head.yaml"
key lora '\{r: 8, alpha: 32, dropout: 0.05, target_modules: \[q_proj, v_proj, lm_head, embed_tokens\]\}'
expect 0 "$M" predict "$T/sw-head.yaml"
has "peak per GPU"
# Qwen2-VL grounding: the other catalog entry, max_length 2048
expect 0 "$M" import --catalog "$CAT" --swift "$SW/grounding.sh"
key seq_len 2048;  key num_hidden_layers 28
# lora_llm: LoRA on the LLM, ViT and aligner in full; --deepspeed zero2 is ms-swift's built-in
# file, which must be given (the published swift/config/zero2.json)
expect 2 "$M" import --catalog "$CAT" --swift "$SW/lora_llm_full_vit_sft.sh"
has "lora_llm_full_vit_sft.sh:31:5: deepspeed zero2 (ms-swift's built-in swift/config/zero2.json): zero2: cannot open"
expect 0 "$M" import --catalog "$CAT" --swift "$SW/lora_llm_full_vit_sft.sh" --deepspeed "$SW/zero2.json" -o "$T/sw-llm.yaml"
expect 0 cat "$T/sw-llm.yaml"
key zero_stage 2;  key micro_batch_size 1;  key gradient_accumulation_steps 4;  key seq_len 8192
key lora '\{r: 16, alpha: 32, dropout: 0.05, target_modules: all-linear\}'
key trainable true
has "ignored vit_lr: a learning rate"
expect 0 "$M" predict "$T/sw-llm.yaml" --set training.data_parallel=4
# video (vit_gradient_checkpointing.sh trains on VideoChatGPT): qwen_vl_utils' frames at worst,
# FPS_MAX_FRAMES 12, each frame at most max(min(50176, 90316800 / 12 x 2), int(100352 x 1.05))
expect 0 "$M" import --catalog "$CAT" --swift "$SW/vit_gradient_checkpointing.sh" --deepspeed "$SW/zero3.json" -o "$T/sw-video.yaml"
expect 0 cat "$T/sw-video.yaml"
key video_frames 12;  key video_min_pixels 100352;  key video_max_pixels 105369
has "assumed every sample is one video long enough for FPS_MAX_FRAMES (12 frames at FPS 2"
expect 0 "$M" predict "$T/sw-video.yaml" --set training.data_parallel=4
# --padding_free: the batch in one row, the spec's packing (as a trainer file's padding_free)
printf 'swift sft --model Qwen/Qwen2.5-VL-7B-Instruct --max_pixels 1003520 \\\n  --attn_impl flash_attn --padding_free true\n' > "$T/s.sh"
expect 0 "$M" import --catalog "$CAT" --swift "$T/s.sh" -o "$T/sw-pf.yaml"
expect 0 cat "$T/sw-pf.yaml"
key packing true
expect 0 "$M" predict "$T/sw-pf.yaml"
sw() { printf "$1" > "$T/s.sh"; expect 2 "$M" import --catalog "$CAT" --swift "$T/s.sh"; has "$2"; }
Q='swift sft --model Qwen/Qwen2.5-VL-7B-Instruct'
# --use_liger_kernel: transformers' Trainer patches Qwen2.5-VL (text norms and MLPs, the
# vision blocks' RMSNorms, the loss): training.liger_kernel, predicted
printf "$Q --max_pixels 1003520 \\\\\n  --use_liger_kernel true\n" > "$T/s.sh"
expect 0 "$M" import --catalog "$CAT" --swift "$T/s.sh" -o "$T/sw-lg.yaml"
expect 0 cat "$T/sw-lg.yaml"
key liger_kernel true;  hasnt "not modelled yet"
expect 0 "$M" predict "$T/sw-lg.yaml"
# vit_gradient_checkpointing apart from gradient_checkpointing: the tower's own switch
# (ms-swift trainers/mixin.py), which makes a trained ViT's step heavier without checkpointing
for v in true false; do
    printf "$Q --max_pixels 1003520 --freeze_vit false --vit_gradient_checkpointing $v\n" > "$T/s.sh"
    expect 0 "$M" import --catalog "$CAT" --swift "$T/s.sh" -o "$T/sw-vit-$v.yaml"
done
expect 0 cat "$T/sw-vit-false.yaml"
has "    gradient_checkpointing: false                # vit_gradient_checkpointing"
expect 0 cat "$T/sw-vit-true.yaml"
hasnt "vit_gradient_checkpointing"
"$M" predict "$T/sw-vit-true.yaml" --json > "$T/a.json" 2>&1 && "$M" predict "$T/sw-vit-false.yaml" --json > "$T/b.json" 2>&1 &&
    python3 -c 'import json,sys; a,b=(json.load(open(f))["allocated_peak_bytes"] for f in sys.argv[1:]); sys.exit(0 if b > a else 1)' \
        "$T/a.json" "$T/b.json" && ok || bad "vit_gradient_checkpointing false: no heavier step than true"
# the per-frame cap follows the frame count and the total (qwen_vl_utils fetch_video)
printf "VIDEO_TOTAL_PIXELS=19267584 FPS_MAX_FRAMES=128 $Q --max_length 32768\n" > "$T/s.sh"
expect 0 "$M" import --catalog "$CAT" --swift "$T/s.sh"
key video_frames 128;  key video_max_pixels 301056
printf "FPS_MAX_FRAMES=13 $Q --max_length 8192\n" > "$T/s.sh"
expect 0 "$M" import --catalog "$CAT" --swift "$T/s.sh"
key video_frames 12;  key video_max_pixels 602112
# a video longer than max_length cannot be a sample (ms-swift deletes it): the spec says so
printf "FPS_MAX_FRAMES=13 $Q\n" > "$T/s.sh"
expect 2 "$M" import --catalog "$CAT" --swift "$T/s.sh"
has "training.seq_len: 4096 is shorter than the 4374 image tokens"
sw "FPS_MAX_FRAMES=8 FPS_MIN_FRAMES=10 $Q\n" "FPS_MIN_FRAMES: 10 is above FPS_MAX_FRAMES (8 frames)"
sw "NFRAMES=8 $Q\n" "s.sh:1:1: NFRAMES: Ovis2's frame count"
printf 'FPS=1 swift sft --model liuhaotian/llava-v1.5-7b\n' > "$T/s.sh"
expect 2 "$M" import --catalog "$CAT" --swift "$T/s.sh"
has "video samples are mapped for the Qwen2-VL and Qwen2.5-VL templates"
sw "$Q --no_such_flag 1\n" "s.sh:1:47: no_such_flag: unknown trainer key"
sw "$Q --tuner_type adalora\n" "s.sh:1:47: tuner_type: 'adalora': lora, full and lora_llm are modelled"
sw "$Q --use_dora true\n" "s.sh:1:47: use_dora: only false"
sw "$Q --freeze_aligner false\n" "s.sh:1:47: freeze_aligner: false with LoRA"
sw "$Q --max_length 1 --max_length 2\n" "s.sh:1:62: max_length: given twice"
sw "swift rlhf --model x\n" "s.sh:1:7: swift rlhf: only \`swift sft\` is read"
sw "python train.py\n" "s.sh:1:1: 'python': expected NAME=VALUE or \`swift sft\`"
sw "swift sft --dataset 'a\n" "unterminated quote"
sw "swift sft --lora_rank 8\n" "s.sh:1:1: --model: required"
sw "MAX_PIXELS=10 $Q --max_pixels 20\n" "max_pixels: also set by MAX_PIXELS"
# full: the towers per the freeze flags, named LoRA flags listed as ignored; flags given as
# --key=value and lists of values
printf 'MAX_PIXELS=50176 swift sft --model Qwen/Qwen2.5-VL-7B-Instruct --tuner_type=full --freeze_vit false --lora_rank 4 --attn_impl flash_attn --packing true --max_length 4096\n' > "$T/full.sh"
expect 0 "$M" import --catalog "$CAT" --swift "$T/full.sh"
key attention flash;  key packing true
has "ignored lora_rank: LoRA only (tuner_type full)"
has "trainable: true                              # freeze_vit (ms-swift default true)"
printf 'MAX_PIXELS=1003520 swift sft --model Qwen/Qwen2.5-VL-7B-Instruct --target_modules q_proj v_proj\n' > "$T/tm.sh"
expect 0 "$M" import --catalog "$CAT" --swift "$T/tm.sh"
key lora '\{r: 8, alpha: 32, dropout: 0.05, target_modules: \[q_proj, v_proj\]\}'

# ---- usage -----------------------------------------------------------------------------------
expect 2 "$M" import --trainer a.json --args "--bf16"
has "give one of --trainer, --args, --llamafactory, --torchtitan, --swift"
expect 2 "$M" import
has "give a model"
expect 2 "$M" import --args "--bf16 True"
has "no model: give --hf, or model_name_or_path in --args"

echo "import: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
