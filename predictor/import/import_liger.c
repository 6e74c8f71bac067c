/* import_liger.c - import layer: the jobs' Liger switches -> training.liger_kernel
 * (spec/spec_liger.c), one mapping for the three readers:
 *
 *   HF TrainingArguments use_liger_kernel (+ liger_kernel_config), and ms-swift's
 *   --use_liger_kernel (the same TrainingArguments field): transformers' Trainer calls
 *   apply_liger_kernel(model, liger_kernel_config) once the model exists (trainer.py
 *   1452-1453, integrations/liger.py:47-51): Liger's _apply_liger_kernel_to_instance.
 *   LLaMA-Factory enable_liger_kernel: model/model_utils/liger_kernel.py calls the
 *   model type's apply function before the model is built (model=None): class patches.
 *
 * linkedin/Liger-Kernel ead96b61 src/liger_kernel/transformers/monkey_patch.py: for
 * llama / qwen2 both ways patch RoPE, RMSNorm, SwiGLU and the loss (apply_liger_kernel_to_
 * llama :221): liger_kernel.  For llava the instance path also patches the text model
 * (:388-411), the class path (model=None) only LlavaForConditionalGeneration.forward
 * (:383-386): the fused loss alone.  For qwen2_vl / qwen2_5_vl the instance path patches
 * the text model's RMSNorms and MLPs and the vision blocks' norm1 / norm2 (:1933-1952,
 * :2024-2041): liger_kernel as configured.  Their class path (model=None) swaps
 * modeling_qwen2_*vl.Qwen2RMSNorm and .apply_multimodal_rotary_pos_emb (:1899-1903,
 * :1990-1993), names transformers 5.17's modules no longer use (their norms are
 * Qwen2VLRMSNorm / Qwen2_5_VLRMSNorm), while Qwen2MLP and torch's LayerNorm (Qwen2-VL's
 * vision blocks and merger ln_q) are swapped: liger_kernel {rms_norm: false}.  gemma3 /
 * gemma3_text on an instance (:1064-1148, :1151-1240): liger_kernel as configured; their
 * class path swaps modeling_siglip.nn.LayerNorm, which is torch.nn's own class (every
 * LayerNorm built afterwards), and Gemma's RMSNorm class: not modelled, the loss only.
 * Other model types Liger patches (its table,
 * :3534-3585) keep the fused loss the spec models (loss: fused_linear) and say which
 * kernels are assumed to keep what transformers' ops keep; model types it does not
 * patch get nothing. */
#include "import_rd.h"

#include <stdio.h>
#include <string.h>

/* MODEL_TYPE_TO_APPLY_LIGER_FN's keys (monkey_patch.py:3534-3585) */
static const char *const liger_types[] = {
    "deepseek_v4", "gemma", "gemma2", "gemma3_text", "gemma3", "gemma4_text", "gemma4", "glm4",
    "glm4v", "glm4v_moe", "gpt_oss", "internvl", "llama", "llama4_text", "llama4", "llava",
    "granite", "mllama", "mllama_text_model", "ministral", "mistral", "mixtral", "nemotron",
    "olmo2", "pixtral", "olmo3", "qwen2", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_vl_text",
    "qwen2_5_vl", "qwen2_5_vl_text", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe",
    "qwen3_5_moe_text", "qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text",
    "smollm3", "phi3", "paligemma", "falcon_h1", "smolvlm", "hunyuan_v1_dense",
    "hunyuan_v1_moe", "exaone4", NULL};

static int in_table(const char *t)
{
    for (size_t i = 0; liger_types[i]; i++)
        if (!strcmp(liger_types[i], t))
            return 1;
    return 0;
}

/* the imported decoder's family is one whose kernels are modelled */
static int text_modelled(imp_job *j)
{
    imp_section *d = imp_find_module(j->s, "decoder");
    const char *f = d ? imp_get(d, "family") : NULL;
    return f && (!strcmp(f, "llama") || !strcmp(f, "qwen2"));
}

/* a Qwen2-VL / Qwen2.5-VL job whose decoder and tower were imported as those families */
static int qwen_vl(imp_job *j, const char *t)
{
    imp_section *d = imp_find_module(j->s, "decoder");
    const char *f = d ? imp_get(d, "family") : NULL;
    return (!strcmp(t, "qwen2_vl") || !strcmp(t, "qwen2_5_vl")) && f && !strcmp(f, "qwen2_vl");
}

/* a Gemma 3 job (Gemma3ForConditionalGeneration or the text model alone) */
static int gemma3(imp_job *j, const char *t)
{
    imp_section *d = imp_find_module(j->s, "decoder");
    const char *f = d ? imp_get(d, "family") : NULL;
    return (!strcmp(t, "gemma3") || !strcmp(t, "gemma3_text")) && f && !strcmp(f, "gemma3");
}

/* a liger_kernel_config key the model type's apply function has no parameter for
 * (monkey_patch.py: _qwen2_vl :1860, _qwen2_5_vl :1955, _gemma3_text :1064, _gemma3 :1151) */
static int dropped(imp_job *j, const char *t, const char *k)
{
    int g = gemma3(j, t), q = qwen_vl(j, t);
    if (!strcmp(k, "swiglu"))
        return g;
    if (!strcmp(k, "geglu"))
        return q;
    if (!strcmp(k, "layer_norm"))
        return (q || g) && strcmp(t, "qwen2_vl") && strcmp(t, "gemma3");
    return 0;
}

/* liger_kernel_config: {kernel: bool} as the map the spec takes; LLaVA's instance path
 * keeps only the loss switches (monkey_patch.py:3645 filters by the signature) */
static int config_map(imp_job *j, hfc *h, int llava, const char *t, char *out, size_t n)
{
    static const char *const known[] = {"rope", "rms_norm", "swiglu", "fused_linear_cross_entropy",
                                        "cross_entropy", "layer_norm", "geglu", NULL};
    const mm_node *c = hf_node(h, "liger_kernel_config");
    char w[160];
    snprintf(out, n, "true");
    if (!c)
        return 0;
    if (c->type != MM_NODE_MAP)
        return hf_fail(h, "liger_kernel_config", "expected a mapping of Liger kernels to true/false");
    size_t len = (size_t)snprintf(out, n, "{");
    for (size_t i = 0; i < c->n; i++) {
        const char *k = c->keys[i], *v = c->vals[i]->str;
        size_t m = 0;
        while (known[m] && strcmp(known[m], k))
            m++;
        if (!known[m] || c->vals[i]->type != MM_NODE_SCALAR || !v)
            return hf_fail(h, "liger_kernel_config", "'%s': expected one of rope, rms_norm, "
                           "swiglu, fused_linear_cross_entropy, cross_entropy, layer_norm, geglu "
                           "with true or false", k);
        if (llava && m < 3) {
            imp_note(j->s, "ignored %s.%s: _apply_liger_kernel_to_instance passes "
                           "apply_liger_kernel_to_llava only its own parameters (Liger "
                           "monkey_patch.py:3645): the text model gets the defaults",
                     hf_where(h, "liger_kernel_config", w, sizeof w), k);
            continue;
        }
        /* the instance path drops what the function does not take (monkey_patch.py:3645) */
        if (dropped(j, t, k)) {
            imp_note(j->s, "ignored %s.%s: apply_liger_kernel_to_%s has no such parameter; "
                           "_apply_liger_kernel_to_instance drops it (Liger monkey_patch.py:3645)",
                     hf_where(h, "liger_kernel_config", w, sizeof w), k, t);
            continue;
        }
        len += (size_t)snprintf(out + len, len < n ? n - len : 0, "%s%s: %s",
                                len > 1 ? ", " : "", k, v);
    }
    snprintf(out + len, len < n ? n - len : 0, "}");
    return 0;
}

int imp_liger(imp_job *j, hfc *h, const char *key, int instance)
{
    const char *t = j->model_type;
    char w[160], map[400];
    hf_where(h, key, w, sizeof w);
    int llava = !strcmp(t, "llava") && text_modelled(j);
    /* a preset (no model_type): the spec decides, and refuses with the reason */
    if (!t[0] || !strcmp(t, "llama") || !strcmp(t, "qwen2") || (llava && instance) ||
        ((qwen_vl(j, t) || gemma3(j, t)) && instance)) {
        if (instance && config_map(j, h, llava, t, map, sizeof map))
            return -1;
        imp_set(&j->s->training, "liger_kernel", w, "%s", instance ? map : "true");
        return 0;
    }
    if (qwen_vl(j, t)) { /* the class path (model=None), see the header */
        imp_set(&j->s->training, "liger_kernel", w, "{rms_norm: false}");
        imp_note(j->s, "assumed %s: apply_liger_kernel_to_%s(model=None) swaps Qwen2RMSNorm and "
                       "apply_multimodal_rotary_pos_emb, names transformers 5.17 no longer uses: "
                       "the norms and RoPE stay transformers'; the MLP, the loss%s are Liger's%s",
                 w, t, strcmp(t, "qwen2_vl") ? "" : " and the vision LayerNorms",
                 strcmp(t, "qwen2_vl") ? "" : " (the merger's ln_q predicted as torch's)");
        return 0;
    }
    if (!in_table(t)) {
        imp_note(j->s, "ignored %s: Liger has no kernels for model_type '%s' "
                       "(MODEL_TYPE_TO_APPLY_LIGER_FN)", w, t);
        return 0;
    }
    imp_set(&j->s->training, "loss", w, "fused_linear");
    if (llava)
        imp_note(j->s, "assumed %s: apply_liger_kernel_to_llava(model=None) patches the loss only; "
                       "the text model keeps transformers' RMSNorm, MLP and RoPE", w);
    else
        imp_note(j->s, "assumed %s: Liger's other kernels for '%s' (RMSNorm, LayerNorm, SwiGLU/"
                       "GeGLU, RoPE) are not modelled yet: predicted as transformers' ops, which "
                       "keep more; only the fused linear cross-entropy is modelled", w, t);
    return 0;
}
