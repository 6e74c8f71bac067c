/* import_trainer.c - Hugging Face TrainingArguments / TRL SFTConfig keys ->
 * training (batch, accumulation, precision, checkpointing, optimizer,
 * sequence length), model_name_or_path, and the helpers the other trainer
 * readers share (import_trainer_opt.c: attention, loss, packing, the DeepSpeed
 * and FSDP configs; import_llava.c: LLaVA's own train.py arguments).  The
 * reader that runs them all is import_trainer_rules.c.  Defaults are
 * transformers 4.57's and TRL 0.24's (SFTConfig checkpoints by default). */
#include "import_rd.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ULL(x) ((unsigned long long)(x))

imp_section *imp_find_module(imp_spec *s, const char *type)
{
    for (size_t i = 0; i < s->nmod; i++)
        if (!strcmp(s->mod[i].type, type) && s->mod[i].n)
            return &s->mod[i];
    return NULL;
}

void imp_resolve_path(const char *file, const char *path, char *out, size_t n)
{
    struct stat st;
    if (path[0] == '/' || stat(path, &st) == 0) {
        snprintf(out, n, "%s", path);
        return;
    }
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", file);
    snprintf(out, n, "%s/%s", dirname(dir), path);
}

static int tr_batch(imp_job *j, hfc *h)
{
    char w[160];
    imp_section *t = &j->s->training;
    const char *mb = mm_node_get(h->map, "per_gpu_train_batch_size") ? "per_gpu_train_batch_size"
                                                                      : "per_device_train_batch_size";
    if (imp_u64(h, mb, 8, 1, 65536, &j->micro_batch) ||
        imp_u64(h, "gradient_accumulation_steps", 1, 1, 1u << 20, &j->grad_accum) ||
        imp_num(h, "max_grad_norm", 1.0, &j->max_grad_norm))
        return -1;
    if (j->max_grad_norm < 0)
        return hf_fail(h, "max_grad_norm", "expected >= 0");
    imp_set(t, "micro_batch_size", mm_node_get(h->map, mb) ? hf_where(h, mb, w, sizeof w)
            : "TrainingArguments default per_device_train_batch_size", "%llu", ULL(j->micro_batch));
    if (j->grad_accum > 1 || mm_node_get(h->map, "gradient_accumulation_steps"))
        imp_set(t, "gradient_accumulation_steps", hf_where(h, "gradient_accumulation_steps", w,
                sizeof w), "%llu", ULL(j->grad_accum));
    imp_set(t, "max_grad_norm", mm_node_get(h->map, "max_grad_norm") ? hf_where(h, "max_grad_norm",
            w, sizeof w) : "TrainingArguments default max_grad_norm", "%g", j->max_grad_norm);
    return 0;
}

static int tr_precision(imp_job *j, hfc *h)
{
    if (imp_bool(h, "fp16", 0, &j->fp16) || imp_bool(h, "bf16", j->sft && !j->fp16, &j->bf16))
        return -1;
    if (j->fp16 && j->bf16)
        return hf_fail(h, "bf16", "bf16 and fp16 are both set");
    char w[160];
    const char *k = j->bf16 ? "bf16" : "fp16";
    imp_set(&j->s->training, "precision", mm_node_get(h->map, k) ? hf_where(h, k, w, sizeof w)
            : j->sft ? "SFTConfig default bf16" : "TrainingArguments: neither bf16 nor fp16",
            "%s", j->bf16 ? "bf16" : j->fp16 ? "fp16" : "fp32");
    return 0;
}

static int ckpt_kwargs(imp_job *j, hfc *h, int *reentrant)
{
    static const imp_rule kw_rules[] = {
        {"preserve_rng_state", 'i', "the RNG state is a few bytes per checkpoint"},
        {"determinism_check", 'i', "a check on recomputed shapes"},
        {"debug", 'i', "logging"},
    };
    const mm_node *kw = hf_node(h, "gradient_checkpointing_kwargs");
    *reentrant = -1;
    if (!kw)
        return 0;
    if (kw->type != MM_NODE_MAP)
        return hf_fail(h, "gradient_checkpointing_kwargs", "expected a mapping {use_reentrant: ...}");
    hfc k;
    hfc_init(&k, j->s, kw, "gradient_checkpointing_kwargs", h->file, h->err);
    if (mm_node_get(kw, "use_reentrant") && imp_bool(&k, "use_reentrant", 0, reentrant))
        return -1;
    return imp_rules_finish(&k, kw_rules, sizeof kw_rules / sizeof kw_rules[0], "checkpoint");
}

static int tr_ckpt(imp_job *j, hfc *h)
{
    int on, re;
    char w[160];
    if (imp_bool(h, "gradient_checkpointing", j->sft, &on) || ckpt_kwargs(j, h, &re))
        return -1;
    const char *from = mm_node_get(h->map, "gradient_checkpointing")
                           ? hf_where(h, "gradient_checkpointing", w, sizeof w)
                           : j->sft ? "SFTConfig default gradient_checkpointing"
                                    : "TrainingArguments default gradient_checkpointing";
    if (on && re >= 0)
        imp_set(&j->s->training, "gradient_checkpointing", from, "{enabled: true, use_reentrant: %s}",
                re ? "true" : "false");
    else
        imp_set(&j->s->training, "gradient_checkpointing", from, "%s", on ? "true" : "false");
    return 0;
}

/* optim names of transformers OptimizerNames -> optimizer (and implementation) */
static int tr_optim(imp_job *j, hfc *h)
{
    static const char *const map[][3] = {
        {"adamw_torch", "adamw", "foreach"}, {"adamw_torch_fused", "adamw", "fused"},
        {"adamw_hf", "adamw", "for_loop"}, {"adamw_bnb_8bit", "adamw_8bit", NULL},
        {"adamw_8bit", "adamw_8bit", NULL}, {"paged_adamw_8bit", "paged_adamw_8bit", NULL},
        {"paged_adamw_32bit", "paged_adamw", NULL}, {"paged_adamw", "paged_adamw", NULL},
        {"adafactor", "adafactor", NULL}, {"sgd", "sgd", "foreach"},
        {"adamw_torch_npu_fused", NULL, NULL}};
    char o[64], w[160];
    int ada;
    if (hf_str(h, "optim", j->llava ? "adamw_torch" : "adamw_torch_fused", o, sizeof o) ||
        imp_bool(h, "adafactor", 0, &ada))
        return -1;
    if (ada)
        snprintf(o, sizeof o, "adafactor");
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (strcmp(map[i][0], o) || !map[i][1])
            continue;
        const char *from = ada ? hf_where(h, "adafactor", w, sizeof w)
                           : mm_node_get(h->map, "optim") ? hf_where(h, "optim", w, sizeof w)
                           : j->llava ? "LLaVA's TrainingArguments default optim adamw_torch"
                                      : "TrainingArguments default optim (torch >= 2.8)";
        imp_set(&j->s->training, "optimizer", from, "%s", map[i][1]);
        if (map[i][2])
            imp_set(&j->s->training, "optimizer_impl", from, "%s", map[i][2]);
        return 0;
    }
    return hf_fail(h, "optim", "optimizer '%s' is not modelled (adamw_torch, adamw_torch_fused, "
                               "adamw_hf, adamw_bnb_8bit, paged_adamw_8bit, paged_adamw_32bit, "
                               "adafactor, sgd are)", o);
}

/* the longest sample: SFTConfig max_length (max_seq_length before TRL 0.20),
 * LLaVA model_max_length */
static int tr_seq(imp_job *j, hfc *h)
{
    static const char *const keys[] = {"max_length", "max_seq_length", "model_max_length"};
    const char *key = NULL;
    char w[160];
    for (size_t i = j->lf ? 1 : 0; i < 3; i++) /* LLaMA-Factory's max_length is generation's */
        if (mm_node_get(h->map, keys[i])) {
            if (key)
                return hf_fail(h, keys[i], "the sequence length is also given as %s", key);
            key = keys[i];
        }
    uint64_t n;
    if (!key && j->sft) {
        imp_set(&j->s->training, "seq_len", "SFTConfig default max_length (truncation)", "1024");
        return 0;
    }
    if (!key)
        return 0;
    if (imp_u64(h, key, 0, 1, 1u << 22, &n))
        return -1;
    imp_set(&j->s->training, "seq_len", hf_where(h, key, w, sizeof w), "%llu", ULL(n));
    return 0;
}

int imp_trainer_core(imp_job *j, hfc *h)
{
    return tr_batch(j, h) || tr_precision(j, h) || tr_ckpt(j, h) || tr_optim(j, h) ||
                   tr_seq(j, h)
               ? -1
               : 0;
}

/* model_name_or_path: the model when none was given (--hf wins) */
int imp_trainer_model(imp_job *j, hfc *h)
{
    const mm_node *m = hf_node(h, "model_name_or_path");
    char where[600];
    if (!m)
        return 0;
    if (m->type != MM_NODE_SCALAR || !m->str || !m->str[0])
        return hf_fail(h, "model_name_or_path", "expected a model id or a directory");
    if (j->have_model) {
        imp_note(j->s, "ignored model_name_or_path %s: the model is the one given (--hf)", m->str);
        return 0;
    }
    imp_where_key(h, "model_name_or_path", where, sizeof where);
    char path[1024];
    imp_resolve_path(h->file, m->str, path, sizeof path);
    struct stat st;
    return imp_model(j, stat(path, &st) == 0 ? path : m->str, where, h->err);
}
