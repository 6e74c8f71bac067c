/* import_lf_rules.c - every other LLaMA-Factory key (its ModelArguments,
 * DataArguments, FinetuningArguments, GeneratingArguments and training
 * extras), with why it does not change the GPU memory of a step or why it is
 * refused; and reading the YAML. */
#include "import_rd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const DATA = "data loading and templating, on the host";
static const char *const HUB = "downloads and the model hub";
static const char *const INFER = "inference and export only";
static const char *const RLHF = "preference / RL stages only (refused)";
static const char *const MEGATRON = "Megatron (mcore_adapter) training is not modelled";

static const imp_rule lf_rules[] = {
    {"adapter_name_or_path", 'i', "starting adapter weights: the same shapes"},
    {"adapter_folder", 'i', HUB}, {"cache_dir", 'i', HUB}, {"use_fast_tokenizer", 'i', DATA},
    {"resize_vocab", 'd', "false|a resized vocabulary changes the embeddings"},
    {"split_special_tokens", 'i', DATA}, {"add_tokens", 'd', "null|new tokens resize the vocabulary"},
    {"add_special_tokens", 'd', "null|new tokens resize the vocabulary"},
    {"new_special_tokens_config", 'd', "null|new tokens resize the vocabulary"},
    {"init_special_tokens", 'i', "initial values of new tokens"}, {"model_revision", 'i', HUB},
    {"low_cpu_mem_usage", 'i', "host memory at load time"},
    {"rope_scaling", 'i', "rotary frequencies are values, computed per batch"},
    {"shift_attn", 'd', "false|S^2-Attn is not modelled"},
    {"mixture_of_depths", 'd', "null|mixture of depths is not modelled"},
    {"use_unsloth", 'd', "false|Unsloth's kernels are not modelled"},
    {"use_unsloth_gc", 'd', "false|Unsloth's offloaded checkpointing is not modelled"},
    {"moe_aux_loss_coef", 'd', "null|the router logits it keeps are not modelled here"},
    {"upcast_layernorm", 'd', "false|fp32 norm weights are not modelled"},
    {"upcast_lmhead_output", 'd', "false|an fp32 copy of the logits is not modelled"},
    {"train_from_scratch", 'i', "initial values"}, {"infer_backend", 'i', INFER},
    {"offload_folder", 'i', INFER}, {"use_kv_cache", 'i', INFER},
    {"use_v1_kernels", 'd', "false|LLaMA-Factory v1 kernels are not modelled"},
    {"infer_dtype", 'i', INFER}, {"hf_hub_token", 'i', HUB}, {"ms_hub_token", 'i', HUB},
    {"om_hub_token", 'i', HUB}, {"print_param_status", 'i', "logging"},
    {"trust_remote_code", 'i', "permission to run the model's code"},
    {"quantization_method", 'd', "bnb|bitsandbytes is the quantization modelled"},
    {"quantization_device_map", 'i', "where weights load"},
    {"image_do_pan_and_scan", 'd', "false|pan-and-scan crops are not modelled"},
    {"crop_to_patches", 'd', "false|InternVL-style crops are set by the model's processor"},
    {"video_max_pixels", 'i', "the spec has no video (training.video_frames is 0)"},
    {"video_min_pixels", 'i', "the spec has no video (training.video_frames is 0)"},
    {"video_fps", 'i', "the spec has no video (training.video_frames is 0)"},
    {"video_maxlen", 'i', "the spec has no video (training.video_frames is 0)"},
    {"use_audio_in_video", 'd', "false|audio is not modelled"},
    {"audio_sampling_rate", 'i', "audio is not modelled"},
    {"compute_dtype", 'i', "derived from bf16 / fp16"}, {"device_map", 'i', "where weights load"},
    {"model_max_length", 'i', "derived from cutoff_len"},
    {"block_diag_attn", 'i', "derived from neat_packing"},
    {"use_kt", 'd', "false|KTransformers CPU experts are not modelled"},
    {"template", 'i', DATA}, {"dataset", 'i', DATA}, {"eval_dataset", 'i', DATA},
    {"dataset_dir", 'i', DATA}, {"media_dir", 'i', DATA}, {"train_on_prompt", 'i', "which labels "
                                                                              "count: the same tensors"},
    {"mask_history", 'i', "which labels count: the same tensors"}, {"streaming", 'i', DATA},
    {"buffer_size", 'i', DATA}, {"mix_strategy", 'i', DATA}, {"interleave_probs", 'i', DATA},
    {"overwrite_cache", 'i', DATA}, {"preprocessing_batch_size", 'i', DATA},
    {"preprocessing_num_workers", 'i', DATA}, {"max_samples", 'i', DATA},
    {"eval_num_beams", 'i', "evaluation"}, {"ignore_pad_token_for_loss", 'i', DATA},
    {"val_size", 'i', "evaluation"}, {"eval_on_each_dataset", 'i', "evaluation"},
    {"tool_format", 'i', DATA}, {"default_system", 'i', DATA}, {"enable_thinking", 'i', DATA},
    {"preserve_thinking", 'i', DATA}, {"tokenized_path", 'i', DATA},
    {"data_shared_file_system", 'i', DATA},
    {"use_llama_pro", 'd', "false|LLaMA Pro's added blocks are not modelled"},
    {"use_adam_mini", 'd', "false|Adam-mini is not modelled"},
    {"use_mca", 'd', "false|Megatron (mcore_adapter) training is not modelled"},
    {"use_megatron_bridge", 'd', "false|Megatron training is not modelled"},
    {"megatron_bridge_args", 'i', "Megatron only (refused)"},
    {"use_hyper_parallel", 'd', "false|HyperParallel is not modelled"},
    {"hyper_parallel_args", 'i', "HyperParallel only (refused)"},
    {"hyper_parallel_cp_size", 'd', "1|context parallelism is not modelled"},
    {"use_muon", 'd', "false|Muon is not modelled"},
    {"use_dft_loss", 'd', "false|DFT's loss is not modelled"},
    {"use_asft_loss", 'd', "false|ASFT's loss is not modelled"}, {"asft_alpha", 'i', "ASFT only"},
    {"use_eaft_loss", 'd', "false|EAFT's loss is not modelled"}, {"eaft_alpha", 'i', "EAFT only"},
    {"compute_accuracy", 'd', "false|accuracy keeps the logits (Liger's fused loss is off)"},
    {"disable_shuffling", 'i', DATA}, {"early_stopping_steps", 'i', "when training stops"},
    {"plot_loss", 'i', "logging"}, {"include_effective_tokens_per_second", 'i', "logging"},
    {"freeze_trainable_layers", 'i', "finetuning_type freeze only (refused)"},
    {"freeze_trainable_modules", 'i', "finetuning_type freeze only (refused)"},
    {"freeze_extra_modules", 'i', "finetuning_type freeze only (refused)"},
    {"additional_target", 'd', "null|extra fully trained modules are not modelled"},
    {"loraplus_lr_ratio", 'i', "learning rates"}, {"loraplus_lr_embedding", 'i', "learning rates"},
    {"use_rslora", 'i', "rank-stabilised scaling: a scalar"},
    {"use_dora", 'd', "false|DoRA's magnitude vectors and norms are not modelled"},
    {"pissa_init", 'i', "initial values: the same shapes"}, {"pissa_iter", 'i', "PiSSA init only"},
    {"pissa_convert", 'i', "at save time"}, {"create_new_adapter", 'i', "the same shapes"},
    {"use_galore", 'd', "false|GaLore is not modelled"},
    {"use_apollo", 'd', "false|APOLLO is not modelled"},
    {"use_badam", 'd', "false|BAdam is not modelled"},
    {"use_swanlab", 'i', "logging"}, {"enable_torch_profiler", 'd', "false|the profiler's buffers "
                                                                    "are not modelled"},
    {"fp8", 'd', "false|FP8 training is not modelled"}, {"fp8_backend", 'i', "FP8 only"},
    {"fp8_enable_fsdp_float8_all_gather", 'i', "FP8 only"}, {"ray_num_workers", 'd', "1|Ray"},
    {"tensor_model_parallel_size", 'r', MEGATRON}, {"pipeline_model_parallel_size", 'r', MEGATRON},
    {"sequence_parallel", 'r', MEGATRON}, {"use_distributed_optimizer", 'r', MEGATRON},
    {"bias_activation_fusion", 'r', MEGATRON}, {"apply_rope_fusion", 'r', MEGATRON},
    {"max_new_tokens", 'i', INFER}, {"skip_special_tokens", 'i', INFER},
};

/* whole families of keys: read only by features refused or off the GPU */
static const char *const prefixes[][2] = {
    {"galore_", "GaLore only (use_galore)"}, {"apollo_", "APOLLO only (use_apollo)"},
    {"badam_", "BAdam only (use_badam)"}, {"swanlab_", "logging"}, {"pref_", NULL},
    {"dpo_", NULL}, {"kto_", NULL}, {"simpo_", NULL}, {"ppo_", NULL}, {"ref_model", NULL},
    {"reward_model", NULL}, {"ld_alpha", NULL}, {"oft_", "OFT only (refused)"},
    {"module_dropout", "OFT only (refused)"}, {"vllm_", "inference only"},
    {"sglang_", "inference only"}, {"export_", "export only"}, {"kt_", "KTransformers only"},
    {"ray_", "Ray launching"}, {"profiler_", "the profiler (off)"}, {"profile_", "the profiler"},
};

static void prefix_rules(imp_job *j, hfc *h)
{
    char w[160];
    for (size_t i = 0; i < h->map->n && i < sizeof h->used; i++)
        for (size_t k = 0; !h->used[i] && k < sizeof prefixes / sizeof prefixes[0]; k++)
            if (!strncmp(h->map->keys[i], prefixes[k][0], strlen(prefixes[k][0]))) {
                h->used[i] = 1;
                imp_note(j->s, "ignored %s: %s", hf_where(h, h->map->keys[i], w, sizeof w),
                         prefixes[k][1] ? prefixes[k][1] : RLHF);
            }
}

int imp_lf_finish(imp_job *j, hfc *h)
{
    prefix_rules(j, h);
    if (imp_rules_apply(h, lf_rules, sizeof lf_rules / sizeof lf_rules[0], "LLaMA-Factory"))
        return -1;
    /* GeneratingArguments: generation in evaluation / chat, not training */
    static const imp_rule gen[] = {
        {"do_sample", 'i', INFER}, {"temperature", 'i', INFER}, {"top_p", 'i', INFER},
        {"top_k", 'i', INFER}, {"num_beams", 'i', INFER}, {"max_length", 'i', INFER},
        {"repetition_penalty", 'i', INFER}, {"length_penalty", 'i', INFER},
    };
    if (imp_rules_apply(h, gen, sizeof gen / sizeof gen[0], "LLaMA-Factory"))
        return -1;
    return imp_trainer_finish(j, h);
}
