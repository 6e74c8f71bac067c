/* import_swift_rules.c (layer import) - ms-swift's `swift sft` flags -> the
 * spec, from its argument dataclasses (modelscope/ms-swift @ 3602360a:
 * swift/arguments/base_args/{base_args,model_args,template_args}.py,
 * swift/arguments/tuner_args.py, swift/trainers/arguments.py) with their
 * defaults; the HF TrainingArguments flags it inherits go to the trainer
 * reader (import_trainer*.c) after ms-swift's own defaults for them
 * (per_device_train_batch_size 1, gradient_checkpointing true).  Flags that
 * change memory in a way not modelled are refused with the reason, flags that
 * do not are listed with why, unknown ones are errors naming the flag. */
#include "import_rd.h"
#include "import_swift.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ULL(x) ((unsigned long long)(x))

static const char *const DATA = "data loading and templating, on the host";
static const char *const LR = "a learning rate: a value, no tensor";
static const char *const HUB = "downloads and the model hub";

/* mapped here (read by the functions below) */
static const char *const mapped[] = {
    "model", "tuner_type", "train_type", "lora_rank", "lora_alpha", "lora_dropout",
    "target_modules", "freeze_llm", "freeze_vit", "freeze_aligner", "torch_dtype", "attn_impl",
    "max_length", "max_pixels", "packing", "padding_free", "use_liger_kernel",
    "gradient_checkpointing", "vit_gradient_checkpointing", "deepspeed", NULL};

static const imp_rule swift_rules[] = {
    {"dataset", 'i', DATA}, {"val_dataset", 'i', DATA}, {"load_from_cache_file", 'i', DATA},
    {"split_dataset_ratio", 'i', DATA}, {"dataset_num_proc", 'i', DATA}, {"streaming", 'i', DATA},
    {"system", 'i', DATA}, {"template", 'i', DATA}, {"columns", 'i', DATA},
    {"dataset_shuffle", 'i', DATA}, {"data_seed", 'i', DATA},
    {"truncation_strategy", 'i', "which samples are cut or dropped: max_length bounds them"},
    {"vit_lr", 'i', LR}, {"aligner_lr", 'i', LR}, {"model_revision", 'i', HUB},
    {"use_hf", 'i', HUB}, {"hub_token", 'i', HUB}, {"model_name", 'i', "the saved model's name"},
    {"model_author", 'i', "the saved model's author"}, {"add_version", 'i', "output folders"},
    {"create_checkpoint_symlink", 'i', "output folders"},
    {"model_type", 'i', "the architecture comes from the model's config"},
    {"lora_bias", 'd', "none|LoRA biases are not modelled"},
    {"use_dora", 'd', "false|DoRA's magnitude vectors and norms are not modelled"},
    {"lora_dtype", 'd', "null|adapters in another dtype than the model are not mapped"},
    {"target_regex", 'd', "null|a regex of LoRA targets is not mapped (use target_modules)"},
    {"modules_to_save", 'd', "[]|fully trained extra modules are not mapped"},
    {"init_weights", 'i', "the adapters' starting values"},
    {"gradient_checkpointing_kwargs", 'd', "null|ms-swift's own use_reentrant choice is what "
                                            "is modelled"},
    {"task_type", 'd', "causal_lm|classification and embedding heads are not modelled"},
    {"rope_scaling", 'i', "rotary frequencies are values"},
    {"max_model_len", 'i', "inference only"}, {"device_map", 'd', "null|naive model parallelism "
                                                                   "is not modelled"},
    {"quant_method", 'd', "null|quantized bases are not mapped for ms-swift"},
    {"quant_bits", 'd', "null|quantized bases are not mapped for ms-swift"},
    {"loss_scale", 'i', "which tokens count in the loss: the same tensors"},
};

static int swift_owns(const char *key)
{
    for (size_t i = 0; mapped[i]; i++)
        if (!strcmp(mapped[i], key))
            return 1;
    for (size_t i = 0; i < sizeof swift_rules / sizeof swift_rules[0]; i++)
        if (!strcmp(swift_rules[i].key, key))
            return 1;
    return 0;
}

/* MAX_PIXELS and the launcher's variables (swift/cli/main.py, torchrun) */
static const imp_rule env_rules[] = {
    {"NPROC_PER_NODE", 'i', "the GPU count is the job's (training.data_parallel)"},
    {"CUDA_VISIBLE_DEVICES", 'i', "the GPU count is the job's (training.data_parallel)"},
    {"NNODES", 'i', "the GPU count is the job's"}, {"NODE_RANK", 'i', "the launcher"},
    {"MASTER_ADDR", 'i', "the launcher"}, {"MASTER_PORT", 'i', "the launcher"},
    {"OMP_NUM_THREADS", 'i', "host threads"},
    {"NFRAMES", 'r', "Ovis2's frame count: the Qwen-VL templates sample by FPS and "
                     "FPS_MAX_FRAMES, and Ovis is not modelled"},
};

static const mm_node *flag_or_env(hfc *h, hfc *env, const char *flag, const char *var,
                                  hfc **which, const char **key)
{
    const mm_node *f = mm_node_get(h->map, flag), *e = mm_node_get(env->map, var);
    *which = f ? h : env;
    *key = f ? flag : var;
    return f ? f : e;
}

/* --max_pixels or MAX_PIXELS (compat_qwen_vl_utils, swift/model/models/qwen.py):
 * the dynamic processor's bound; default qwen_vl_utils' 16384 x 28 x 28 */
static int swift_pixels(imp_job *j, hfc *h, hfc *env)
{
    hfc *hi_h, *lo_h;
    const char *hi_k, *lo_k;
    char w[160];
    uint64_t hi, lo;
    if (mm_node_get(h->map, "max_pixels") && mm_node_get(env->map, "MAX_PIXELS"))
        return hf_fail(h, "max_pixels", "also set by MAX_PIXELS");
    const mm_node *hv = flag_or_env(h, env, "max_pixels", "MAX_PIXELS", &hi_h, &hi_k);
    flag_or_env(h, env, "min_pixels", "MIN_PIXELS", &lo_h, &lo_k);
    if (imp_u64(hi_h, hi_k, 12845056, 1, 1ull << 40, &hi) ||
        imp_u64(lo_h, lo_k, 3136, 1, 1ull << 40, &lo))
        return -1;
    imp_section *v = imp_find_module(j->s, "vision");
    const char *ip = v ? imp_get(v, "image_processor") : NULL;
    if (!ip || !strstr(ip, "dynamic")) {
        if (hv)
            return hf_fail(hi_h, hi_k, "this model's processor resizes every image to the "
                                       "tower's size: MAX_PIXELS does not apply");
        return 0;
    }
    if (lo > hi)
        return hf_fail(lo_h, lo_k, "exceeds the maximum pixels (%llu)", ULL(hi));
    imp_set(v, "image_processor", hv ? hf_where(hi_h, hi_k, w, sizeof w)
            : "qwen_vl_utils' default MAX_PIXELS 16384 x 28 x 28 (ms-swift sets none)",
            "{kind: dynamic, min_pixels: %llu, max_pixels: %llu}", ULL(lo), ULL(hi));
    imp_unset(&j->s->training, "image_size"); /* the worst image is max_pixels */
    return 0;
}

/* model_args.py torch_dtype (default: the config's; Qwen-VL's bfloat16) and
 * the bf16/fp16 TrainingArguments ms-swift derives from it */
static int swift_dtype(imp_job *j, hfc *h)
{
    char t[64], w[160];
    if (hf_str(h, "torch_dtype", "bfloat16", t, sizeof t))
        return -1;
    const char *p = !strcmp(t, "bfloat16") ? "bf16" : !strcmp(t, "float16") ? "fp16"
                    : !strcmp(t, "float32") ? "fp32" : NULL;
    if (!p)
        return hf_fail(h, "torch_dtype", "expected bfloat16, float16 or float32");
    j->bf16 = !strcmp(p, "bf16");
    j->fp16 = !strcmp(p, "fp16");
    imp_set(&j->s->training, "precision", mm_node_get(h->map, "torch_dtype")
            ? hf_where(h, "torch_dtype", w, sizeof w)
            : "assumed: the model config's torch_dtype (bfloat16 for Qwen-VL)", "%s", p);
    if (!strcmp(p, "fp16"))
        imp_set(&j->s->training, "master_weights", "ms-swift trains float16 models with fp32 "
                                                   "trainable weights under AMP", "fp32");
    return 0;
}

static int swift_attention(imp_job *j, hfc *h)
{
    char a[64], w[160];
    if (hf_str(h, "attn_impl", "sdpa", a, sizeof a))
        return -1;
    const char *v = !strcmp(a, "flash_attn") || !strcmp(a, "flash_attention_2") ? "flash"
                    : !strcmp(a, "sdpa") ? "sdpa" : !strcmp(a, "eager") ? "eager" : NULL;
    if (!v)
        return hf_fail(h, "attn_impl", "'%s': flash_attn, sdpa and eager are modelled", a);
    imp_set(&j->s->training, "attention", mm_node_get(h->map, "attn_impl")
            ? hf_where(h, "attn_impl", w, sizeof w)
            : "attn_impl unset: transformers' default (sdpa)", "%s", v);
    return 0;
}

/* target_modules: all-linear (tuner_args.py default) or named Linears */
static int swift_targets(hfc *h, char *tm, size_t n)
{
    const mm_node *v = hf_node(h, "target_modules");
    if (!v || (v->type == MM_NODE_SCALAR && v->str && !strcmp(v->str, "all-linear"))) {
        snprintf(tm, n, "all-linear");
        return 0;
    }
    size_t o = (size_t)snprintf(tm, n, "[");
    size_t cnt = v->type == MM_NODE_SEQ ? v->n : 1;
    for (size_t i = 0; i < cnt && o < n; i++) {
        const mm_node *e = v->type == MM_NODE_SEQ ? v->vals[i] : v;
        if (e->type != MM_NODE_SCALAR || !e->str || !strcmp(e->str, "all-linear"))
            return hf_fail(h, "target_modules", "expected all-linear or Linear names");
        o += (size_t)snprintf(tm + o, n - o, "%s%s", i ? ", " : "", e->str);
    }
    if (o < n)
        snprintf(tm + o, n - o, "]");
    return o + 1 < n ? 0 : hf_fail(h, "target_modules", "too long");
}

static int swift_lora(imp_job *j, hfc *h, int fv, int fa, int llm_only)
{
    uint64_t r;
    double alpha, drop;
    char tm[600];
    if (imp_u64(h, "lora_rank", 8, 1, 65536, &r) || imp_num(h, "lora_alpha", 32, &alpha) ||
        imp_num(h, "lora_dropout", 0.05, &drop) || swift_targets(h, tm, sizeof tm))
        return -1;
    imp_section *v = imp_find_module(j->s, "vision"), *d = imp_find_module(j->s, "decoder");
    if (!llm_only && !fa && imp_find_module(j->s, "connector"))
        return hf_fail(h, "freeze_aligner", "false with LoRA: adapters on the aligner are not "
                                            "mapped (tuner_type full or lora_llm trains it)");
    if (!llm_only && !fv && v && strcmp(tm, "all-linear"))
        return hf_fail(h, "target_modules", "named targets with an unfrozen ViT are not mapped "
                                            "(all-linear reaches the ViT's Linears)");
    if (d)
        imp_set(d, "lora", "lora_rank (8) / lora_alpha (32) / lora_dropout (0.05) / "
                "target_modules (all-linear): ms-swift's defaults where not given",
                "{r: %llu, alpha: %g, dropout: %g, target_modules: %s}", ULL(r), alpha, drop, tm);
    if (v && !fv && !llm_only) /* get_multimodal_target_regex includes an unfrozen ViT */
        imp_set(v, "lora", "freeze_vit false: all-linear reaches the ViT",
                "{r: %llu, alpha: %g, dropout: %g, target_modules: all-linear}", ULL(r), alpha,
                drop);
    return 0;
}

/* tuner_type (train_type before ms-swift 4): lora (default), full, lora_llm
 * (swift/tuner_plugin/lora_llm.py: LoRA on the LLM, the ViT and aligner
 * trained in full) */
static int swift_tuning(imp_job *j, hfc *h)
{
    char t[64], w[160];
    int fl, fv, fa;
    const char *tk = mm_node_get(h->map, "train_type") ? "train_type" : "tuner_type";
    if (mm_node_get(h->map, "train_type") && mm_node_get(h->map, "tuner_type"))
        return hf_fail(h, "train_type", "given with tuner_type (its newer name)");
    if (hf_str(h, tk, "lora", t, sizeof t) || imp_bool(h, "freeze_llm", 0, &fl) ||
        imp_bool(h, "freeze_vit", 1, &fv) || imp_bool(h, "freeze_aligner", 1, &fa))
        return -1;
    int full = !strcmp(t, "full"), lora = !strcmp(t, "lora"), llm = !strcmp(t, "lora_llm");
    if (!full && !lora && !llm)
        return hf_fail(h, tk, "'%s': lora, full and lora_llm are modelled", t);
    if (fl && !full)
        return hf_fail(h, "freeze_llm", "true with LoRA: adapters only on the towers are not "
                                        "mapped");
    imp_section *v = imp_find_module(j->s, "vision"), *p = imp_find_module(j->s, "connector");
    imp_section *d = imp_find_module(j->s, "decoder");
    const char *from = mm_node_get(h->map, tk) ? hf_where(h, tk, w, sizeof w)
                                               : "ms-swift default tuner_type lora";
    if (v)
        imp_set(v, "trainable", llm ? from : "freeze_vit (ms-swift default true)", "%s",
                llm || (full && !fv) ? "true" : "false");
    if (p)
        imp_set(p, "trainable", llm ? from : "freeze_aligner (ms-swift default true)", "%s",
                llm || (full && !fa) ? "true" : "false");
    if (d)
        imp_set(d, "trainable", full ? "freeze_llm (ms-swift default false)" : from, "%s",
                full && !fl ? "true" : "false");
    if (!full)
        return swift_lora(j, h, fv, fa, llm);
    static const char *const lk[] = {"lora_rank", "lora_alpha", "lora_dropout", "target_modules"};
    for (size_t i = 0; i < 4; i++)
        if (hf_node(h, lk[i]))
            imp_note(j->s, "ignored %s: LoRA only (tuner_type full)", hf_where(h, lk[i], w,
                                                                                sizeof w));
    return 0;
}

/* max_length, packing, padding_free, use_liger_kernel.  --padding_free (ms-swift
 * swift/llm/argument/train_args.py; its collator concatenates the batch into one row and
 * passes position_ids for flash-attention's varlen kernels) is the spec's packing, as for a
 * trainer file's padding_free (import_trainer_opt.c) */
static int swift_seq(imp_job *j, hfc *h)
{
    uint64_t n;
    int pack, pf, liger;
    char w[160];
    if (imp_u64(h, "max_length", 0, 0, 1u << 22, &n) || imp_bool(h, "packing", 0, &pack) ||
        imp_bool(h, "padding_free", 0, &pf) || imp_bool(h, "use_liger_kernel", 0, &liger))
        return -1;
    /* ms-swift's TrainArguments are transformers' TrainingArguments: its Trainer applies
     * Liger to the built model (import_liger.c) */
    if (liger && imp_liger(j, h, "use_liger_kernel", 1))
        return -1;
    if (n)
        imp_set(&j->s->training, "seq_len", hf_where(h, "max_length", w, sizeof w), "%llu",
                ULL(n));
    if (pack || pf)
        imp_set(&j->s->training, "packing", hf_where(h, pack ? "packing" : "padding_free", w,
                                                     sizeof w), "true");
    return 0;
}

/* gradient_checkpointing (ms-swift default true), vit_gradient_checkpointing
 * (None = the same; when it differs, the tower's modules[].gradient_checkpointing); use_reentrant: swift/trainers/mixin.py
 * _fix_gradient_checkpointing: false only under DDP over several GPUs */
static int swift_ckpt(imp_job *j, hfc *h)
{
    int gc, vgc;
    char w[160];
    if (imp_bool(h, "gradient_checkpointing", 1, &gc) ||
        imp_bool(h, "vit_gradient_checkpointing", gc, &vgc))
        return -1;
    imp_section *vis = imp_find_module(j->s, "vision");
    if (vgc != gc && vis)       /* mixin.py _prepare_gradient_checkpointing: the ViT's own switch */
        imp_set(vis, "gradient_checkpointing", hf_where(h, "vit_gradient_checkpointing", w, sizeof w),
                vgc ? "true" : "false");
    const char *from = mm_node_get(h->map, "gradient_checkpointing")
                           ? hf_where(h, "gradient_checkpointing", w, sizeof w)
                           : "ms-swift default gradient_checkpointing true";
    if (!gc) {
        imp_set(&j->s->training, "gradient_checkpointing", from, "false");
        return 0;
    }
    int ds = mm_node_get(h->map, "deepspeed") != NULL;
    imp_set(&j->s->training, "gradient_checkpointing", from,
            "{enabled: true, use_reentrant: true}");
    if (!ds)
        imp_note(j->s, "assumed use_reentrant true (ms-swift on one GPU); over several GPUs "
                       "without DeepSpeed ms-swift uses false (trainers/mixin.py)");
    return 0;
}

/* --deepspeed zero2 / zero3 / zero2_offload / ...: ms-swift's built-in
 * swift/config/<name>.json, or a file */
static int swift_deepspeed(imp_job *j, hfc *h)
{
    const mm_node *d = hf_node(h, "deepspeed");
    char w[600];
    if (!d)
        return 0;
    if (d->type != MM_NODE_SCALAR || !d->str || !d->str[0])
        return hf_fail(h, "deepspeed", "expected a name (zero2, zero3, ...) or a file");
    imp_where_key(h, "deepspeed", w, sizeof w);
    static const char *const names[] = {"zero0", "zero1", "zero2", "zero3", "zero2_offload",
                                        "zero3_offload"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(d->str, names[i])) {
            snprintf(j->ds_path, sizeof j->ds_path, "%s", d->str);
            int k = snprintf(j->ds_where, sizeof j->ds_where, "%.400s %s (ms-swift's built-in "
                             "swift/config/%s.json)", w, names[i], names[i]);
            (void)k;
            return 0;
        }
    imp_resolve_path(h->file, d->str, j->ds_path, sizeof j->ds_path);
    snprintf(j->ds_where, sizeof j->ds_where, "%s", w);
    return 0;
}

static int swift_model(imp_job *j, hfc *h, const swift_cmd *c)
{
    const mm_node *m = hf_node(h, "model");
    char where[600];
    if (!m && !j->have_model) {
        mm_err_at(h->err, h->file, c->line, c->col, "--model: required (the model id or path)");
        return -1;
    }
    if (!m)
        return 0;
    if (m->type != MM_NODE_SCALAR || !m->str || !m->str[0])
        return hf_fail(h, "model", "expected a model id or a directory");
    if (j->have_model) {
        imp_note(j->s, "ignored --model %s: the model is the one given (--hf)", m->str);
        return 0;
    }
    imp_where_key(h, "model", where, sizeof where);
    char path[1024];
    imp_resolve_path(h->file, m->str, path, sizeof path);
    FILE *f = fopen(path, "r");
    if (f)
        fclose(f);
    return imp_model(j, f ? path : m->str, where, h->err);
}

/* ms-swift's defaults for TrainingArguments flags it overrides
 * (swift/trainers/arguments.py): each stated */
static int swift_trainer_defaults(imp_job *j, const swift_cmd *c, const char *name,
                                  mm_error *err)
{
    static const char *const def[][3] = {
        {"per_device_train_batch_size", "1", "ms-swift's default per_device_train_batch_size 1"},
        {"gradient_accumulation_steps", "1", "assumed gradient_accumulation_steps 1: ms-swift's "
         "default is ceil(16 / batch / GPUs), which depends on the job's GPU count"},
    };
    for (size_t i = 0; i < 2; i++) {
        if (mm_node_get(c->trainer, def[i][0]))
            continue;
        mm_node *v = mm_node_new(MM_NODE_SCALAR, c->line, c->col);
        if (!v || !(v->str = strdup(def[i][1])) ||
            mm_node_map_put(c->trainer, def[i][0], v, c->line, c->col)) {
            mm_node_free(v);
            mm_err(err, "%s: out of memory", name);
            return -1;
        }
        imp_note(j->s, "%s", def[i][2]);
    }
    return 0;
}

int imp_swift_buffer(imp_job *j, const char *buf, size_t len, const char *name, mm_error *err)
{
    swift_cmd c;
    if (imp_swift_split(&c, buf, len, name, swift_owns, err))
        return -1;
    imp_source(j->s, name, buf, len);
    hfc hs, ht, he;
    hfc_init(&hs, j->s, c.swift, "", name, err);
    hfc_init(&ht, j->s, c.trainer, "", name, err);
    hfc_init(&he, j->s, c.env, "", name, err);
    j->trainer = j->swift = 1;
    snprintf(j->trainer_file, sizeof j->trainer_file, "%s", name);
    int rc = -1;
    if (swift_model(j, &hs, &c) || swift_trainer_defaults(j, &c, name, err) ||
        imp_trainer_map(j, &ht) || swift_dtype(j, &hs) || swift_attention(j, &hs) ||
        swift_tuning(j, &hs) || swift_seq(j, &hs) || swift_pixels(j, &hs, &he) ||
        imp_swift_video(j, &he) ||
        swift_ckpt(j, &hs) || swift_deepspeed(j, &hs) ||
        imp_rules_finish(&hs, swift_rules, sizeof swift_rules / sizeof swift_rules[0],
                         "ms-swift") ||
        imp_rules_finish(&he, env_rules, sizeof env_rules / sizeof env_rules[0],
                         "ms-swift environment") ||
        imp_trainer_finish(j, &ht))
        goto out;
    rc = 0;
out:
    imp_swift_cmd_free(&c);
    return rc;
}

int imp_swift(imp_job *j, const char *path, mm_error *err)
{
    return imp_read_with(j, path, imp_swift_buffer, err);
}
