/* import_lf.c - a LLaMA-Factory train.yaml -> the spec.  LLaMA-Factory's own
 * keys (hparams/model_args.py, data_args.py, finetuning_args.py) are read
 * here with its defaults: LoRA unless finetuning_type says otherwise
 * (lora_alpha = 2 x rank, lora_target all = every Linear but lm_head, the
 * projector and a frozen vision tower), gradient checkpointing ON with
 * use_reentrant (use_reentrant_gc, True), the vision tower and projector
 * frozen; its TrainingArguments keys go to the trainer reader. */
#include "import_rd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ULL(x) ((unsigned long long)(x))

static int lf_attention(imp_job *j, hfc *h)
{
    char a[64], w[160];
    if (hf_str(h, "flash_attn", "auto", a, sizeof a))
        return -1;
    const char *v = !strcmp(a, "auto") || !strcmp(a, "sdpa") ? "sdpa" : !strcmp(a, "disabled")
                    ? "eager" : !strcmp(a, "fa2") || !strcmp(a, "fa3") ? "flash" : NULL;
    if (!v)
        return hf_fail(h, "flash_attn", "expected auto, disabled, sdpa, fa2 or fa3");
    imp_set(&j->s->training, "attention", mm_node_get(h->map, "flash_attn")
            ? hf_where(h, "flash_attn", w, sizeof w)
            : "LLaMA-Factory flash_attn auto: transformers' default (sdpa)", "%s", v);
    return 0;
}

/* checkpointing: on unless disable_gradient_checkpointing; use_reentrant_gc
 * (FSDP2 forces it off) */
static int lf_ckpt(imp_job *j, hfc *h)
{
    int off, re;
    char w[160];
    if (imp_bool(h, "disable_gradient_checkpointing", 0, &off) ||
        imp_bool(h, "use_reentrant_gc", 1, &re))
        return -1;
    const char *from = mm_node_get(h->map, "disable_gradient_checkpointing")
                           ? hf_where(h, "disable_gradient_checkpointing", w, sizeof w)
                           : "LLaMA-Factory enables gradient checkpointing by default";
    if (off)
        imp_set(&j->s->training, "gradient_checkpointing", from, "false");
    else
        imp_set(&j->s->training, "gradient_checkpointing", from,
                "{enabled: true, use_reentrant: %s}", re ? "true" : "false");
    return 0;
}

static int lf_seq(imp_job *j, hfc *h)
{
    uint64_t n;
    int pack, neat;
    char w[160];
    if (imp_u64(h, "cutoff_len", 2048, 1, 1u << 22, &n) || imp_bool(h, "packing", 0, &pack) ||
        imp_bool(h, "neat_packing", 0, &neat))
        return -1;
    imp_set(&j->s->training, "seq_len", mm_node_get(h->map, "cutoff_len")
            ? hf_where(h, "cutoff_len", w, sizeof w)
            : "LLaMA-Factory default cutoff_len (image tokens included)", "%llu", ULL(n));
    if (pack || neat)
        imp_set(&j->s->training, "packing", hf_where(h, neat ? "neat_packing" : "packing", w,
                                                     sizeof w), "true");
    return 0;
}

/* image_max_pixels / image_min_pixels: LLaMA-Factory shrinks images to them
 * before the processor: the dynamic processor's bounds */
static int lf_pixels(imp_job *j, hfc *h)
{
    uint64_t hi, lo;
    char w[160];
    if (imp_u64(h, "image_max_pixels", 768 * 768, 1, 1ull << 40, &hi) ||
        imp_u64(h, "image_min_pixels", 32 * 32, 1, 1ull << 40, &lo))
        return -1;
    imp_section *v = imp_find_module(j->s, "vision");
    const char *ip = v ? imp_get(v, "image_processor") : NULL;
    if (!v)
        return 0;
    if (!ip || !strstr(ip, "dynamic")) {
        if (mm_node_get(h->map, "image_max_pixels"))
            imp_note(j->s, "ignored image_max_pixels: this processor resizes every image to "
                           "the tower's fixed size");
        return 0;
    }
    if (lo > hi)
        return hf_fail(h, "image_min_pixels", "exceeds image_max_pixels");
    imp_set(v, "image_processor", mm_node_get(h->map, "image_max_pixels")
            ? hf_where(h, "image_max_pixels", w, sizeof w)
            : "LLaMA-Factory default image_max_pixels / image_min_pixels",
            "{kind: dynamic, min_pixels: %llu, max_pixels: %llu}", ULL(lo), ULL(hi));
    imp_unset(&j->s->training, "image_size"); /* the worst image is max_pixels */
    return 0;
}

static int lf_lora_target(imp_job *j, hfc *h, int freeze_vision, char *tm, size_t n)
{
    char t[256];
    const mm_node *v = hf_node(h, "lora_target");
    snprintf(t, sizeof t, "%s", v && v->type == MM_NODE_SCALAR && v->str ? v->str : "all");
    if (v && v->type != MM_NODE_SCALAR)
        return hf_fail(h, "lora_target", "expected all or comma-separated module names");
    if (!strcmp(t, "all")) {
        snprintf(tm, n, "all-linear");
        return 0;
    }
    if (!freeze_vision && imp_find_module(j->s, "vision"))
        return hf_fail(h, "lora_target", "named targets with an unfrozen vision tower are not "
                                         "modelled (use all)");
    size_t o = (size_t)snprintf(tm, n, "[");
    for (char *save = NULL, *p = strtok_r(t, ", ", &save); p && o < n;
         p = strtok_r(NULL, ", ", &save))
        o += (size_t)snprintf(tm + o, n - o, "%s%s", o > 1 ? ", " : "", p);
    if (o < n)
        snprintf(tm + o, n - o, "]");
    return 0;
}

static int lf_tuning(imp_job *j, hfc *h)
{
    int fv, fp, fl;
    uint64_t r;
    double alpha, drop;
    char w[160], tm[300];
    if (hf_str(h, "finetuning_type", "lora", j->finetuning, sizeof j->finetuning) ||
        imp_bool(h, "freeze_vision_tower", 1, &fv) ||
        imp_bool(h, "freeze_multi_modal_projector", 1, &fp) ||
        imp_bool(h, "freeze_language_model", 0, &fl) || imp_u64(h, "lora_rank", 8, 1, 65536, &r) ||
        imp_num(h, "lora_dropout", 0, &drop))
        return -1;
    if (imp_num(h, "lora_alpha", 2.0 * (double)r, &alpha))
        return -1;
    const char *ft = j->finetuning;
    if (strcmp(ft, "lora") && strcmp(ft, "full"))
        return hf_fail(h, "finetuning_type", "'%s' is not modelled (lora, full are; freeze trains "
                                             "only some layers, which the spec cannot say)", ft);
    imp_section *v = imp_find_module(j->s, "vision"), *p = imp_find_module(j->s, "connector");
    imp_section *d = imp_find_module(j->s, "decoder");
    const char *from = mm_node_get(h->map, "finetuning_type") ? hf_where(h, "finetuning_type", w,
                                                                         sizeof w)
                                                              : "LLaMA-Factory default lora";
    int lora = !strcmp(ft, "lora");
    if (v)
        imp_set(v, "trainable", "freeze_vision_tower (LLaMA-Factory default true)", "%s",
                !fv && !lora ? "true" : "false");
    if (p)
        imp_set(p, "trainable", "freeze_multi_modal_projector (LLaMA-Factory default true)", "%s",
                fp ? "false" : "true");
    if (d)
        imp_set(d, "trainable", lora ? from : "freeze_language_model", "%s",
                !fl && !lora ? "true" : "false");
    if (!lora)
        return 0;
    if (lf_lora_target(j, h, fv, tm, sizeof tm))
        return -1;
    if (d)
        imp_set(d, "lora", "lora_rank / lora_alpha (default 2 x rank) / lora_dropout / lora_target",
                "{r: %llu, alpha: %g, dropout: %g, target_modules: %s}", ULL(r), alpha, drop, tm);
    if (v && !fv)
        imp_set(v, "lora", "freeze_vision_tower false: lora_target all reaches the tower",
                "{r: %llu, alpha: %g, dropout: %g, target_modules: all-linear}", ULL(r), alpha, drop);
    return 0;
}

static int lf_quant(imp_job *j, hfc *h)
{
    uint64_t bits;
    int dq;
    char qt[64], w[160];
    if (imp_u64(h, "quantization_bit", 0, 0, 8, &bits) ||
        hf_str(h, "quantization_type", "nf4", qt, sizeof qt) ||
        imp_bool(h, "double_quantization", 1, &dq))
        return -1;
    if (!bits)
        return 0;
    if (bits != 4 && bits != 8)
        return hf_fail(h, "quantization_bit", "expected 4 or 8 (bitsandbytes)");
    imp_section *d = imp_find_module(j->s, "decoder");
    j->quantized = 1;
    if (d)
        imp_set(d, "quantization", hf_where(h, "quantization_bit", w, sizeof w),
                "{bits: %llu%s%s%s}", ULL(bits), bits == 4 ? ", quant_type: " : "",
                bits == 4 ? qt : "", bits == 4 ? (dq ? ", double_quant: true" : "") : "");
    return 0;
}

/* Liger's kernels, for the model types LLaMA-Factory patches
 * (model/model_utils/liger_kernel.py; import_liger.c maps them) */
static int lf_liger(imp_job *j, hfc *h)
{
    static const char *const types[] = {"gemma", "gemma2", "gemma3", "gemma3_text", "glm", "glm4",
                                        "glm4v", "granite", "llama", "llava", "mistral", "mixtral",
                                        "mllama", "olmo2", "paligemma", "phi3", "qwen2", "qwen2_vl",
                                        "qwen2_5_vl", "qwen3", "qwen3_moe", "qwen3_next", NULL};
    int on;
    if (imp_bool(h, "enable_liger_kernel", 0, &on) || !on)
        return on ? -1 : 0;
    for (size_t i = 0; types[i]; i++)
        if (!strcmp(types[i], j->model_type))
            return imp_liger(j, h, "enable_liger_kernel", 0);
    imp_note(j->s, "ignored enable_liger_kernel: LLaMA-Factory applies no Liger kernel to "
                   "model_type '%s'", j->model_type[0] ? j->model_type : "(a preset)");
    return 0;
}

static int lf_stage(imp_job *j, hfc *h)
{
    char st[64];
    if (hf_str(h, "stage", "sft", st, sizeof st) || imp_bool(h, "pure_bf16", 0, &j->pure_bf16))
        return -1;
    if (strcmp(st, "sft") && strcmp(st, "pt"))
        return hf_fail(h, "stage", "stage %s is not modelled (sft, pt are: %s)", st,
                       "reward, DPO, KTO and PPO training run more than one model");
    if (j->pure_bf16) {
        j->bf16 = 1;
        imp_set(&j->s->training, "precision", "pure_bf16", "bf16");
    }
    return 0;
}

int imp_llamafactory_buffer(imp_job *j, const char *buf, size_t len, const char *name,
                            mm_error *err)
{
    mm_node *root = imp_parse_map(j, buf, len, name, 0, "a LLaMA-Factory config is a mapping", err);
    if (!root)
        return -1;
    hfc h;
    hfc_init(&h, j->s, root, "", name, err);
    int rc = -1;
    j->lf = j->trainer = 1;
    snprintf(j->trainer_file, sizeof j->trainer_file, "%s", name);
    if (!mm_node_get(root, "model_name_or_path") && !j->have_model) {
        mm_err_at(err, name, root->line, root->col, "model_name_or_path: required (LLaMA-Factory "
                                                    "refuses a config without it)");
        goto out;
    }
    if (imp_trainer_model(j, &h) || imp_trainer_map(j, &h) || lf_stage(j, &h) ||
        lf_tuning(j, &h) || lf_quant(j, &h) || lf_attention(j, &h) || lf_ckpt(j, &h) ||
        lf_seq(j, &h) || lf_pixels(j, &h) || lf_liger(j, &h) || imp_lf_finish(j, &h))
        goto out;
    rc = 0;
out:
    mm_node_free(root);
    return rc;
}

int imp_llamafactory(imp_job *j, const char *path, mm_error *err)
{
    return imp_read_with(j, path, imp_llamafactory_buffer, err);
}
