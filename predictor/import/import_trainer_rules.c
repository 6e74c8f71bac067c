/* import_trainer_rules.c - the trainer reader: reading a trainer file (JSON or
 * YAML), running the readers of its keys (import_llava.c, import_trainer.c,
 * import_trainer_opt.c), and every other TrainingArguments / SFTConfig / LLaVA
 * key, with the reason it does not change the GPU memory of a training step
 * (or why it is refused).  Above the key readers, which never call it. */
#include "import_rd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const LOG = "logging";
static const char *const SAVE = "checkpoint saving, after the step";
static const char *const EVAL = "evaluation, not the training step";
static const char *const LR = "the learning rate and its schedule: scalars";
static const char *const DATA = "data loading, on the host";
static const char *const HUB = "the Hugging Face Hub";
static const char *const META = "run metadata";

static const imp_rule trainer_rules[] = {
    {"output_dir", 'i', SAVE}, {"overwrite_output_dir", 'i', SAVE}, {"do_train", 'i', META},
    {"do_eval", 'i', EVAL}, {"do_predict", 'i', EVAL}, {"eval_strategy", 'i', EVAL},
    {"evaluation_strategy", 'i', EVAL}, {"prediction_loss_only", 'i', EVAL},
    {"per_device_eval_batch_size", 'i', EVAL}, {"per_gpu_eval_batch_size", 'i', EVAL},
    {"eval_accumulation_steps", 'i', EVAL}, {"eval_delay", 'i', EVAL}, {"eval_steps", 'i', EVAL},
    {"learning_rate", 'i', LR}, {"weight_decay", 'i', LR}, {"adam_beta1", 'i', LR},
    {"adam_beta2", 'i', LR}, {"adam_epsilon", 'i', LR}, {"num_train_epochs", 'i', META},
    {"max_steps", 'i', META}, {"lr_scheduler_type", 'i', LR}, {"lr_scheduler_kwargs", 'i', LR},
    {"warmup_ratio", 'i', LR}, {"warmup_steps", 'i', LR}, {"log_level", 'i', LOG},
    {"log_level_replica", 'i', LOG}, {"log_on_each_node", 'i', LOG}, {"logging_dir", 'i', LOG},
    {"logging_strategy", 'i', LOG}, {"logging_first_step", 'i', LOG}, {"logging_steps", 'i', LOG},
    {"logging_nan_inf_filter", 'i', LOG}, {"save_strategy", 'i', SAVE}, {"save_steps", 'i', SAVE},
    {"save_total_limit", 'i', SAVE}, {"save_safetensors", 'i', SAVE},
    {"save_on_each_node", 'i', SAVE}, {"save_only_model", 'i', SAVE},
    {"restore_callback_states_from_checkpoint", 'i', SAVE}, {"seed", 'i', META},
    {"data_seed", 'i', META}, {"jit_mode_eval", 'i', EVAL}, {"fp16_opt_level", 'i', "apex only"},
    {"half_precision_backend", 'd', "auto|torch autocast is modelled"},
    {"fp16_backend", 'd', "auto|torch autocast is modelled"},
    {"bf16_full_eval", 'i', EVAL}, {"fp16_full_eval", 'i', EVAL},
    {"tf32", 'i', "TF32 matmul precision: the same tensors"}, {"local_rank", 'i', "set by the launcher"},
    {"ddp_backend", 'i', "the communication backend"}, {"tpu_num_cores", 'i', "TPU only"},
    {"tpu_metrics_debug", 'i', "TPU only"}, {"debug", 'i', LOG},
    {"dataloader_drop_last", 'i', DATA}, {"dataloader_num_workers", 'i', DATA},
    {"dataloader_prefetch_factor", 'i', DATA}, {"dataloader_pin_memory", 'i', DATA},
    {"dataloader_persistent_workers", 'i', DATA}, {"past_index", 'i', "unused by these models"},
    {"run_name", 'i', META}, {"disable_tqdm", 'i', LOG}, {"remove_unused_columns", 'i', DATA},
    {"label_names", 'i', DATA}, {"load_best_model_at_end", 'i', SAVE},
    {"metric_for_best_model", 'i', EVAL}, {"greater_is_better", 'i', EVAL},
    {"ignore_data_skip", 'i', DATA}, {"fsdp_min_num_params", 'd',
     "0|deprecated: write it as fsdp_config.min_num_params, which is read"},
    {"fsdp_transformer_layer_cls_to_wrap", 'i', "the spec wraps each transformer layer"},
    {"accelerator_config", 'i', "dataloader dispatching on the host (with FSDP its "
                                    "sync_each_batch is read)"},
    {"parallelism_config", 'r', "tensor / context parallelism is not modelled"},
    {"report_to", 'i', LOG}, {"project", 'i', LOG}, {"trackio_space_id", 'i', LOG},
    {"ddp_broadcast_buffers", 'i', "buffers are broadcast in place"}, {"ddp_timeout", 'i', META},
    {"skip_memory_metrics", 'i', LOG}, {"use_legacy_prediction_loop", 'i', EVAL},
    {"push_to_hub", 'i', HUB}, {"resume_from_checkpoint", 'i', "the starting weights"},
    {"hub_model_id", 'i', HUB}, {"hub_strategy", 'i', HUB}, {"hub_token", 'i', HUB},
    {"hub_private_repo", 'i', HUB}, {"hub_always_push", 'i', HUB}, {"hub_revision", 'i', HUB},
    {"include_inputs_for_metrics", 'i', EVAL}, {"include_for_metrics", 'i', EVAL},
    {"eval_do_concat_batches", 'i', EVAL}, {"push_to_hub_model_id", 'i', HUB},
    {"push_to_hub_organization", 'i', HUB}, {"push_to_hub_token", 'i', HUB},
    {"mp_parameters", 'i', "SageMaker only"}, {"full_determinism", 'i', "deterministic kernels"},
    {"ray_scope", 'i', "hyper-parameter search"}, {"include_tokens_per_second", 'i', LOG},
    {"include_num_input_tokens_seen", 'i', LOG}, {"batch_eval_metrics", 'i', EVAL},
    {"eval_on_start", 'i', EVAL}, {"eval_use_gather_object", 'i', EVAL},
    {"average_tokens_across_devices", 'i', "one scalar all-reduce"},
    {"liger_kernel_config", 'i', "which Liger kernels: read only with use_liger_kernel"},
    {"group_by_length", 'i', "the order of samples; seq_len is the longest"},
    {"length_column_name", 'i', DATA}, {"no_cuda", 'r', "training on the CPU"},
    {"use_cpu", 'r', "training on the CPU"}, {"use_mps_device", 'r', "Apple GPUs"},
    {"label_smoothing_factor", 'd', "0|label smoothing's fp32 log-softmax is not modelled"},
    {"neftune_noise_alpha", 'd', "null|NEFTune's noise on the embeddings is not modelled"},
    {"torch_empty_cache_steps", 'd', "null|emptying the allocator cache is not modelled"},
    {"auto_find_batch_size", 'r', "the batch is found at run time: give per_device_train_batch_size"},
    {"optim_args", 'd', "null|optimizer arguments beyond the defaults are not modelled"},
    {"optim_target_modules", 'r', "GaLore / APOLLO projections are not modelled"},
    {"gradient_checkpointing_kwargs", 'i', "read with gradient_checkpointing"},
    /* TRL SFTConfig */
    {"model_init_kwargs", 'd', "null|give attn_implementation and the dtype as trainer keys"},
    {"chat_template_path", 'i', DATA}, {"dataset_text_field", 'i', DATA},
    {"dataset_kwargs", 'i', DATA}, {"dataset_num_proc", 'i', DATA}, {"eos_token", 'i', DATA},
    {"pad_token", 'i', DATA}, {"packing_strategy", 'i', "how samples are packed into max_length"},
    {"pad_to_multiple_of", 'i', "seq_len is the padded worst case"}, {"eval_packing", 'i', EVAL},
    {"completion_only_loss", 'i', "masks labels: the same tensors"},
    {"assistant_only_loss", 'i', "masks labels: the same tensors"},
    {"loss_type", 'd', "nll|DFT's loss weighting is not modelled"},
    {"dataset_batch_size", 'i', DATA}, {"num_of_sequences", 'i', DATA},
    {"chars_per_token", 'i', DATA},
    /* LLaVA's train.py */
    {"model_name_or_path", 'i', "read for the model"}, {"version", 'i', "the conversation template"},
    {"vision_tower", 'i', "the vision tower comes from the model (--hf)"},
    {"pretrain_mm_mlp_adapter", 'i', "the projector's starting weights"},
    {"mm_use_im_start_end", 'i', "two special tokens, inside model_max_length"},
    {"mm_use_im_patch_token", 'i', "a special token, inside model_max_length"},
    {"mm_patch_merge_type", 'd', "flat|LLaVA-1.5 features are flat"},
    {"data_path", 'i', DATA}, {"lazy_preprocess", 'i', DATA}, {"is_multimodal", 'i', DATA},
    {"image_folder", 'i', DATA}, {"group_by_modality_length", 'i', "the order of samples"},
    {"cache_dir", 'i', "the download cache"}, {"mpt_attn_impl", 'i', "MPT models only"},
    {"mm_projector_lr", 'i', LR}, {"lora_weight_path", 'i', "the adapters' starting weights"},
    {"freeze_mm_mlp_adapter", 'i', "read with tune_mm_mlp_adapter"},
};

int imp_trainer_finish(imp_job *j, hfc *h)
{
    (void)j;
    return imp_rules_finish(h, trainer_rules, sizeof trainer_rules / sizeof trainer_rules[0],
                            "trainer");
}

/* TRL's SFTConfig when a key only it has is present */
static int is_sft(const mm_node *m)
{
    static const char *const only[] = {"max_length", "max_seq_length", "packing", "padding_free",
                                       "dataset_text_field", "completion_only_loss",
                                       "assistant_only_loss", "activation_offloading",
                                       "packing_strategy", "loss_type", NULL};
    for (size_t i = 0; only[i]; i++)
        if (mm_node_get(m, only[i]))
            return 1;
    return 0;
}

int imp_trainer_map(imp_job *j, hfc *h)
{
    if (!j->lf && !j->llava)
        j->sft = is_sft(h->map);
    if (!j->lf)
        imp_note(j->s, "assumed %s's defaults for keys the trainer arguments leave out",
                 j->sft ? "TRL SFTConfig" : "transformers TrainingArguments");
    if (imp_llava(j, h))
        return -1;
    return imp_trainer_core(j, h) || imp_trainer_opt(j, h) ? -1 : 0;
}

int imp_trainer_buffer(imp_job *j, const char *buf, size_t len, const char *name, int json,
                       mm_error *err)
{
    mm_node *root = imp_parse_map(j, buf, len, name, json, "trainer arguments are a mapping of "
                                  "TrainingArguments keys", err);
    if (!root)
        return -1;
    hfc h;
    hfc_init(&h, j->s, root, "", name, err);
    int rc = -1;
    j->trainer = 1;
    snprintf(j->trainer_file, sizeof j->trainer_file, "%s", name);
    if (imp_trainer_model(j, &h) || imp_trainer_map(j, &h) || imp_trainer_finish(j, &h))
        goto out;
    rc = 0;
out:
    mm_node_free(root);
    return rc;
}

static int trainer_json(imp_job *j, const char *buf, size_t len, const char *name, mm_error *err)
{
    return imp_trainer_buffer(j, buf, len, name, 1, err);
}

static int trainer_yaml(imp_job *j, const char *buf, size_t len, const char *name, mm_error *err)
{
    return imp_trainer_buffer(j, buf, len, name, 0, err);
}

int imp_trainer(imp_job *j, const char *path, mm_error *err)
{
    size_t n = strlen(path);
    int json = n > 5 && !strcmp(path + n - 5, ".json");
    return imp_read_with(j, path, json ? trainer_json : trainer_yaml, err);
}
