/* import_ds.c - a DeepSpeed ds_config.json -> training.zero_stage, the
 * deepspeed: section and the batch / precision / clipping it decides.
 * "auto" is resolved as transformers' HfTrainerDeepSpeedConfig does
 * (integrations/deepspeed.py trainer_config_process / _finalize): from the
 * trainer arguments, and the three bucket sizes from the model's hidden size
 * (the language model's for every VLM: see docs/import.md).  An explicit value
 * that contradicts the trainer arguments is refused, as transformers does. */
#include "import_rd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define ULL(x) ((unsigned long long)(x))

static const imp_rule top_rules[] = {
    {"train_batch_size", 'i', "the global batch (micro batch x accumulation x GPUs): memory "
                              "follows the micro batch; the GPU count comes from the job"},
    {"steps_per_print", 'i', "logging"}, {"wall_clock_breakdown", 'i', "logging"},
    {"dump_state", 'i', "logging"}, {"memory_breakdown", 'i', "logging"},
    {"flops_profiler", 'i', "a profiler, off unless enabled"}, {"tensorboard", 'i', "logging"},
    {"wandb", 'i', "logging"}, {"csv_monitor", 'i', "logging"}, {"comet", 'i', "logging"},
    {"comms_logger", 'i', "logging"}, {"checkpoint", 'i', "checkpoint files, after the step"},
    {"scheduler", 'i', "the learning-rate schedule: scalars"},
    {"zero_allow_untested_optimizer", 'i', "a check, no tensors"},
    {"zero_force_ds_cpu_optimizer", 'i', "a check of the offload optimizer's type"},
    {"prescale_gradients", 'i', "scales gradients in place"},
    {"gradient_predivide_factor", 'i', "scales gradients in place"},
    {"activation_checkpointing", 'i', "deepspeed.checkpointing settings: Hugging Face models "
                                      "checkpoint with torch.utils.checkpoint "
                                      "(gradient_checkpointing of the trainer)"},
    {"aio", 'i', "NVMe I/O settings (NVMe offload is refused)"},
    {"amp", 'd', "{}|apex AMP is not modelled"},
    {"sparse_gradients", 'd', "false|sparse embedding gradients are not modelled"},
    {"communication_data_type", 'd', "null|gradients are reduced in their training dtype"},
    {"seq_parallel_communication_data_type", 'i', "sequence parallelism only"},
    {"sequence_parallel_size", 'd', "1|sequence parallelism is not modelled"},
    {"pipeline", 'r', "pipeline parallelism is not modelled"},
    {"tensor_parallel", 'r', "tensor parallelism (AutoTP) is not modelled"},
    {"compile", 'r', "DeepSpeed's engine.compile (deepcompile) runs under ZeRO, where no truth "
                     "row shows the eager prediction to bound a compiled step"},
    {"data_types", 'r', "data_types.grad_accum_dtype changes the gradient buffers: not modelled"},
    {"elasticity", 'r', "elastic batch sizes are not modelled: give the batch"},
    {"autotuning", 'r', "autotuning picks the batch and ZeRO settings at run time"},
    {"curriculum_learning", 'r', "curriculum learning changes the sequence length per step"},
    {"data_efficiency", 'r', "data efficiency (random-LTD) is not modelled"},
    {"quantize_training", 'r', "quantized training is not modelled"},
    {"progressive_layer_drop", 'r', "progressive layer drop is not modelled"},
    {"hybrid_engine", 'r', "the RLHF hybrid engine is not modelled"},
    {"fp8", 'r', "FP8 training is not modelled"}, {"torch_autocast", 'r', "DeepSpeed's torch "
                                                                          "autocast is not modelled"},
};

static const imp_rule fp16_rules[] = {
    {"loss_scale", 'i', "dynamic loss scaling keeps scalars"},
    {"initial_scale_power", 'i', "dynamic loss scaling keeps scalars"},
    {"loss_scale_window", 'i', "dynamic loss scaling keeps scalars"},
    {"hysteresis", 'i', "dynamic loss scaling keeps scalars"},
    {"consecutive_hysteresis", 'i', "dynamic loss scaling keeps scalars"},
    {"min_loss_scale", 'i', "dynamic loss scaling keeps scalars"},
    {"auto_cast", 'd', "false|DeepSpeed casts no inputs"},
    {"fp16_master_weights_and_grads", 'd', "false|fp32 master weights are modelled"},
    {"immediate_grad_update", 'i', "when bf16 gradients are applied, not their size"},
    {"check_grad_overflow", 'i', "an overflow check"},
};

static const imp_rule optim_rules[] = {
    {"params", 'i', "learning rate, betas, eps, weight decay: scalars"},
};

/* the job's trainer value for an "auto", or an explicit value that must agree */
typedef struct dsv {
    const char *key;      /* in the ds config */
    const char *hf_key;   /* the TrainingArguments name */
    double trainer;       /* what the trainer arguments (or their defaults) say */
} dsv;

static int ds_value(imp_job *j, hfc *h, const dsv *d, double *out, int *given)
{
    const mm_node *v = hf_node(h, d->key);
    char w[160];
    hf_where(h, d->key, w, sizeof w);
    *given = v != NULL;
    *out = d->trainer;
    if (!v)
        return 0;
    if (imp_is_auto(v)) {
        if (!j->trainer)
            imp_note(j->s, "assumed %s \"auto\" = %g: TrainingArguments.%s's default (no trainer "
                           "arguments given: --trainer/--args/--llamafactory)", w, d->trainer,
                     d->hf_key);
        return 0;
    }
    if (imp_num(h, d->key, 0, out))
        return -1;
    if (j->trainer && *out != d->trainer)
        return hf_fail(h, d->key, "%g, but the trainer arguments (%s) say %s = %g: transformers "
                                  "refuses the mismatch (set it to \"auto\")", *out,
                       j->trainer_file, d->hf_key, d->trainer);
    return 0;
}

static int ds_batch(imp_job *j, hfc *h)
{
    imp_section *t = &j->s->training;
    double v;
    int given;
    char w[160];
    dsv mb = {"train_micro_batch_size_per_gpu", "per_device_train_batch_size", (double)j->micro_batch};
    if (ds_value(j, h, &mb, &v, &given))
        return -1;
    if (given && (v < 1 || v > 65536 || v != floor(v)))
        return hf_fail(h, mb.key, "expected 1..65536");
    if (given)
        imp_set(t, "micro_batch_size", hf_where(h, mb.key, w, sizeof w), "%llu", ULL(v));
    dsv ga = {"gradient_accumulation_steps", "gradient_accumulation_steps", (double)j->grad_accum};
    if (ds_value(j, h, &ga, &v, &given))
        return -1;
    if (given && (v < 1 || v > 1048576 || v != floor(v)))
        return hf_fail(h, ga.key, "expected 1..1048576");
    if (given)
        imp_set(t, "gradient_accumulation_steps", hf_where(h, ga.key, w, sizeof w), "%llu", ULL(v));
    dsv gc = {"gradient_clipping", "max_grad_norm", j->max_grad_norm};
    if (ds_value(j, h, &gc, &v, &given))
        return -1;
    if (given && v < 0)
        return hf_fail(h, gc.key, "expected >= 0");
    /* under DeepSpeed the engine clips (the Trainer leaves it to it): only when
     * gradient_clipping > 0, and an absent key stays absent (DeepSpeed's 0) */
    if (given)
        imp_set(t, "max_grad_norm", hf_where(h, gc.key, w, sizeof w), "%g", v);
    else
        imp_set(t, "max_grad_norm", "ds_config has no gradient_clipping: DeepSpeed does not clip",
                "0");
    if (!mm_node_get(h->map, mb.key) && !j->trainer && mm_node_get(h->map, "train_batch_size"))
        return hf_fail(h, "train_batch_size", "the micro batch would depend on the GPU count: "
                                              "give train_micro_batch_size_per_gpu");
    return 0;
}

/* fp16 / bf16 sections: enabled (auto = the trainer's fp16 / bf16) */
static int ds_half(imp_job *j, hfc *top, const char *name, int trainer, int *on)
{
    const mm_node *sec = hf_node(top, name);
    *on = 0;
    if (!sec)
        return 0;
    hfc h;
    hfc_init(&h, j->s, sec, name, top->file, top->err);
    if (sec->type != MM_NODE_MAP)
        return hf_fail(top, name, "expected a mapping");
    const mm_node *en = mm_node_get(sec, "enabled");
    char w[160];
    if (imp_is_auto(en)) {
        hf_node(&h, "enabled");
        *on = trainer;
        if (!j->trainer)
            imp_note(j->s, "assumed %s \"auto\" = %s: TrainingArguments.%s's default (no trainer "
                           "arguments given)", hf_where(&h, "enabled", w, sizeof w),
                     trainer ? "true" : "false", strcmp(name, "fp16") ? "bf16" : "fp16");
    } else {
        if (imp_bool(&h, "enabled", 0, on))
            return -1;
        if (en && j->trainer && *on != trainer)
            return hf_fail(&h, "enabled", "%s, but the trainer arguments (%s) say %s = %s: "
                                          "transformers refuses the mismatch", *on ? "true" : "false",
                           j->trainer_file, strcmp(name, "fp16") ? "bf16" : "fp16",
                           trainer ? "true" : "false");
    }
    return imp_rules_finish(&h, fp16_rules, sizeof fp16_rules / sizeof fp16_rules[0], "DeepSpeed");
}

static int ds_precision(imp_job *j, hfc *top)
{
    int fp16, bf16, bf16b;
    if (ds_half(j, top, "fp16", j->fp16, &fp16) || ds_half(j, top, "bf16", j->bf16, &bf16) ||
        ds_half(j, top, "bfloat16", j->bf16, &bf16b))
        return -1;
    bf16 |= bf16b;
    if (fp16 && bf16)
        return hf_fail(top, "bf16", "fp16 and bf16 are both enabled");
    /* the engine trains in bf16 when bf16.enabled, else fp16 when fp16.enabled, else fp32 */
    imp_set(&j->s->training, "precision", bf16 ? "ds_config bf16.enabled" : fp16 ? "ds_config "
            "fp16.enabled" : "ds_config: neither fp16 nor bf16 enabled", "%s",
            bf16 ? "bf16" : fp16 ? "fp16" : "fp32");
    return 0;
}

static int ds_optimizer(imp_job *j, hfc *top)
{
    const mm_node *o = hf_node(top, "optimizer");
    if (!o)
        return 0;
    hfc h;
    hfc_init(&h, j->s, o, "optimizer", top->file, top->err);
    char type[64], w[160];
    if (o->type != MM_NODE_MAP)
        return hf_fail(top, "optimizer", "expected a mapping");
    if (hf_str(&h, "type", "", type, sizeof type))
        return -1;
    /* DeepSpeed builds Adam/AdamW itself (FusedAdam, DeepSpeedCPUAdam when offloading) */
    if (strcasecmp(type, "adam") && strcasecmp(type, "adamw"))
        return hf_fail(&h, "type", "DeepSpeed optimizer '%s' is not modelled (Adam, AdamW are)",
                       type);
    imp_set(&j->s->training, "optimizer", hf_where(&h, "type", w, sizeof w), "adamw");
    return imp_rules_finish(&h, optim_rules, sizeof optim_rules / sizeof optim_rules[0],
                            "DeepSpeed");
}

/* the language model's width: what transformers reads as model.config.hidden_size */
static uint64_t model_hidden(const imp_spec *s)
{
    for (size_t i = 0; i < s->nmod; i++)
        if (!strcmp(s->mod[i].type, "decoder")) {
            uint64_t hs = 0;
            const char *v = imp_get(&s->mod[i], "hidden_size");
            if (v && !key_parse_u64(v, &hs))
                return hs;
        }
    return 0;
}

int imp_deepspeed_buffer(imp_job *j, const char *buf, size_t len, const char *name, mm_error *err)
{
    mm_node *root = imp_parse_map(j, buf, len, name, 1, "a DeepSpeed config is a JSON object", err);
    if (!root)
        return -1;
    hfc top;
    hfc_init(&top, j->s, root, "", name, err);
    int rc = -1;
    if (ds_batch(j, &top) || ds_precision(j, &top) || ds_optimizer(j, &top))
        goto out;
    const mm_node *zo = hf_node(&top, "zero_optimization");
    if (!zo || zo->type != MM_NODE_MAP) {
        hf_fail(&top, zo ? "zero_optimization" : "", "DeepSpeed without ZeRO (stage 0) is not "
                "modelled: its BF16/FP16 optimizer wrappers keep fp32 copies; use a ZeRO stage");
        goto out;
    }
    hfc z;
    hfc_init(&z, j->s, zo, "zero_optimization", name, err);
    if (imp_ds_zero(j, &z, model_hidden(j->s)))
        goto out;
    rc = imp_rules_finish(&top, top_rules, sizeof top_rules / sizeof top_rules[0], "DeepSpeed");
out:
    mm_node_free(root);
    return rc;
}

int imp_deepspeed(imp_job *j, const char *path, mm_error *err)
{
    return imp_read_with(j, path, imp_deepspeed_buffer, err);
}
