/* import_llava.c - the arguments of LLaVA's llava/train/train.py (haotian-liu/
 * LLaVA, the v1.5 scripts) that change the model or what trains:
 * mm_projector_type, mm_vision_select_layer / _feature, tune_mm_mlp_adapter,
 * freeze_backbone, freeze_mm_mlp_adapter, lora_enable (PEFT on every Linear
 * of the language model: find_all_linear_names), bits (QLoRA). */
#include "import_rd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ULL(x) ((unsigned long long)(x))

static imp_section *need(imp_job *j, hfc *h, const char *type, const char *key)
{
    imp_section *m = imp_find_module(j->s, type);
    if (!m)
        hf_fail(h, key, "the model has no %s module", type);
    return m;
}

/* mlp2x_gelu -> 2 layers with GELU; linear -> 1 layer */
static int projector(imp_job *j, hfc *h)
{
    char t[64], w[160];
    if (hf_str(h, "mm_projector_type", "linear", t, sizeof t))
        return -1;
    if (!mm_node_get(h->map, "mm_projector_type"))
        return 0;
    imp_section *p = need(j, h, "connector", "mm_projector_type");
    if (!p)
        return -1;
    unsigned n = 0;
    char tail[16] = "";
    if (!strcmp(t, "linear"))
        n = 1;
    else if (sscanf(t, "mlp%ux_gel%15s", &n, tail) != 2 || strcmp(tail, "u") || n < 1 || n > 64)
        return hf_fail(h, "mm_projector_type", "'%s' is not modelled (linear, mlpNx_gelu are)", t);
    hf_where(h, "mm_projector_type", w, sizeof w);
    imp_set(p, "num_layers", w, "%u", n);
    if (n > 1)
        imp_set(p, "hidden_act", w, "gelu");
    return 0;
}

static int vision(imp_job *j, hfc *h)
{
    int64_t layer;
    char feat[64], w[160];
    if (hf_i64(h, "mm_vision_select_layer", -1, &layer) ||
        hf_str(h, "mm_vision_select_feature", "patch", feat, sizeof feat))
        return -1;
    if (mm_node_get(h->map, "mm_vision_select_layer")) {
        imp_section *v = need(j, h, "vision", "mm_vision_select_layer");
        if (!v)
            return -1;
        imp_set(v, "select_layer", hf_where(h, "mm_vision_select_layer", w, sizeof w), "%lld",
                (long long)layer);
    }
    if (strcmp(feat, "patch") && strcmp(feat, "cls_patch"))
        return hf_fail(h, "mm_vision_select_feature", "expected patch or cls_patch");
    if (!strcmp(feat, "cls_patch")) {
        imp_section *v = need(j, h, "vision", "mm_vision_select_feature");
        if (!v)
            return -1;
        imp_set(v, "feature_select", hf_where(h, "mm_vision_select_feature", w, sizeof w), "full");
    }
    return 0;
}

/* who trains: tune_mm_mlp_adapter (only the projector), freeze_backbone (the
 * language model frozen), freeze_mm_mlp_adapter (the projector frozen) */
static int trainable(imp_job *j, hfc *h)
{
    int tune, freeze, freeze_mlp;
    char w[160];
    if (imp_bool(h, "tune_mm_mlp_adapter", 0, &tune) || imp_bool(h, "freeze_backbone", 0, &freeze) ||
        imp_bool(h, "freeze_mm_mlp_adapter", 0, &freeze_mlp))
        return -1;
    imp_section *d = imp_find_module(j->s, "decoder"), *p = imp_find_module(j->s, "connector");
    if (d && (tune || freeze))
        imp_set(d, "trainable", hf_where(h, tune ? "tune_mm_mlp_adapter" : "freeze_backbone", w,
                                         sizeof w), "false");
    if (p && (tune || freeze_mlp))
        imp_set(p, "trainable", hf_where(h, tune ? "tune_mm_mlp_adapter" : "freeze_mm_mlp_adapter",
                                         w, sizeof w), "%s", tune && !freeze_mlp ? "true" : "false");
    if (freeze && !tune)
        imp_note(j->s, "assumed freeze_backbone freezes lm_head too: LLaVA's "
                       "model.model.requires_grad_(False) leaves lm_head trainable, which the "
                       "spec cannot say (its gradient and states are not counted)");
    return 0;
}

static int lora(imp_job *j, hfc *h)
{
    int on;
    uint64_t r, bits;
    double alpha, drop;
    char bias[64], qt[64], w[160];
    int dq;
    if (imp_bool(h, "lora_enable", 0, &on) || imp_u64(h, "lora_r", 64, 1, 65536, &r) ||
        imp_num(h, "lora_alpha", 16, &alpha) || imp_num(h, "lora_dropout", 0.05, &drop) ||
        hf_str(h, "lora_bias", "none", bias, sizeof bias) || imp_u64(h, "bits", 16, 4, 16, &bits) ||
        imp_bool(h, "double_quant", 1, &dq) || hf_str(h, "quant_type", "nf4", qt, sizeof qt))
        return -1;
    hf_mark(h, "lora_weight_path");
    if (strcmp(bias, "none"))
        return hf_fail(h, "lora_bias", "LoRA biases are not modelled (none is)");
    imp_section *d = imp_find_module(j->s, "decoder");
    if (on && d) {
        imp_set(d, "trainable", hf_where(h, "lora_enable", w, sizeof w), "false");
        imp_set(d, "lora", "lora_r / lora_alpha / lora_dropout; LLaVA find_all_linear_names",
                "{r: %llu, alpha: %g, dropout: %g, target_modules: all-linear}", ULL(r), alpha, drop);
    }
    if (bits != 16 && bits != 4 && bits != 8)
        return hf_fail(h, "bits", "expected 4, 8 or 16");
    if (bits != 16 && d) {
        j->quantized = 1;
        imp_set(d, "quantization", hf_where(h, "bits", w, sizeof w), "{bits: %llu%s%s%s}", ULL(bits),
                bits == 4 ? ", quant_type: " : "", bits == 4 ? qt : "",
                bits == 4 ? (dq ? ", double_quant: true" : ", double_quant: false") : "");
    }
    return 0;
}

static int aspect(imp_job *j, hfc *h)
{
    char a[64];
    (void)j;
    if (hf_str(h, "image_aspect_ratio", "square", a, sizeof a))
        return -1;
    if (strcmp(a, "pad") && strcmp(a, "square"))
        return hf_fail(h, "image_aspect_ratio", "'%s' is not modelled (pad, square: the image "
                                                "becomes one image_size tile)", a);
    return 0;
}

int imp_llava(imp_job *j, hfc *h)
{
    static const char *const marks[] = {"mm_projector_type", "mm_vision_select_layer",
                                        "tune_mm_mlp_adapter", "vision_tower",
                                        "pretrain_mm_mlp_adapter", "mm_use_im_start_end", NULL};
    for (size_t i = 0; marks[i]; i++)
        if (mm_node_get(h->map, marks[i]))
            j->llava = 1;
    if (!j->llava)
        return 0;
    return projector(j, h) || vision(j, h) || trainable(j, h) || lora(j, h) || aspect(j, h) ? -1
                                                                                             : 0;
}
