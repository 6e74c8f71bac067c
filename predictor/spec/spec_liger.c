/* spec_liger.c - spec layer: training.liger_kernel, what Liger-Kernel's
 * apply_liger_kernel_to_<model_type>(model=...) patches in the model the spec
 * describes.  HF TrainingArguments(use_liger_kernel=True, liger_kernel_config=...)
 * calls liger_kernel.transformers._apply_liger_kernel_to_instance(model, **config)
 * (transformers integrations/liger.py:47-51), which picks the apply function by
 * config.model_type (linkedin/Liger-Kernel ead96b61 src/liger_kernel/transformers/
 * monkey_patch.py:3534-3585 MODEL_TYPE_TO_APPLY_LIGER_FN, :3623-3650) and drops the
 * keyword arguments that function does not take (:3645).  Line numbers below are of
 * that file at that commit.
 *
 *   true          the apply function's defaults: rope, rms_norm, swiglu and
 *                 fused_linear_cross_entropy on, cross_entropy off
 *   {map}         liger_kernel_config: each key left out keeps its default
 *
 * Modelled (model/ops_liger.c): the Llama and Qwen2 decoders (apply_liger_kernel_to_llama
 * :221, _qwen2 :1598, both (rope, cross_entropy, fused_linear_cross_entropy, rms_norm,
 * swiglu)) and LLaVA with one of them (apply_liger_kernel_to_llava :355 patches its
 * text model with the text model's function, :396-411; the CLIP tower's model_type
 * is in no table, :426-430), and Qwen2-VL / Qwen2.5-VL (apply_liger_kernel_to_qwen2_vl
 * :1860 (rope, cross_entropy, fused_linear_cross_entropy, rms_norm, layer_norm, swiglu),
 * _qwen2_5_vl :1955 (the same less layer_norm)): on an instance they patch the text
 * model's RMSNorms and MLPs (:1942-1952, :2032-2041) and the vision blocks' norm1 / norm2
 * (:1933-1939 LayerNorm, :2024-2030 RMSNorm); their rope replaces
 * apply_multimodal_rotary_pos_emb (:1899-1900, :1990-1991), a name transformers 5.17's
 * modeling_qwen2_vl / _qwen2_5_vl no longer call (the rotary embedding recomposes the
 * sections; attention calls apply_rotary_pos_emb): rope changes nothing there, and the
 * model keeps transformers' RoPE for the M-RoPE decoders.  Gemma 3 (apply_liger_kernel_to_
 * gemma3 :1151 / _gemma3_text :1064: rope, cross_entropy, fused_linear_cross_entropy,
 * (layer_norm,) rms_norm, geglu): the text model's Gemma3RMSNorms (final, four per layer,
 * q_norm / k_norm) in gemma casting, offset 1, not in place (:1099-1101, :1114-1123), its
 * MLPs' GeGLU, its RoPE (apply_rotary_pos_emb, which 5.17 calls), and the SigLIP tower's
 * LayerNorms and the projector's norm.  Model types Liger has no function for are refused with
 * that reason; those it patches in ways not modelled yet (LayerNorm in other towers
 * (InternViT, Mllama, SmolVLM), Qwen3-VL's M-RoPE, MoE experts, instance-versus-class patches of Qwen3's q/k
 * norms) are refused with theirs. */
#include "family.h"
#include "spec_internal.h"

#include <stddef.h>
#include <string.h>

#define LG(f) offsetof(liger_spec, f)
static const keydesc liger_keys[] = {
    {"rope", K_BOOL, LG(rope), 0, 1, NULL, 0, 0, 0},
    {"rms_norm", K_BOOL, LG(rms_norm), 0, 1, NULL, 0, 0, 0},
    {"swiglu", K_BOOL, LG(swiglu), 0, 1, NULL, 0, 0, 0},
    {"fused_linear_cross_entropy", K_BOOL, LG(fused_linear_cross_entropy), 0, 1, NULL, 0, 0, 0},
    {"cross_entropy", K_BOOL, LG(cross_entropy), 0, 1, NULL, 0, 0, 0},
    {"layer_norm", K_BOOL, LG(layer_norm), 0, 1, NULL, 0, 0, 0},
    {"geglu", K_BOOL, LG(geglu), 0, 1, NULL, 0, 0, 0},
};
#undef LG

static const char *fam_name(const mm_spec *s, mod_kind k)
{
    const module_spec *m = mm_spec_module(s, k);
    const family_def *f = m ? family_at(k, m->family) : NULL;
    return f ? f->name : NULL;
}

/* decoders whose model type Liger has no function for */
static const char *unpatched(const char *dec)
{
    if (!strcmp(dec, "qwen2_moe"))
        return "model type qwen2_moe is not in MODEL_TYPE_TO_APPLY_LIGER_FN "
               "(monkey_patch.py:3534-3585): Liger patches nothing there";
    if (!strcmp(dec, "llava_llama"))
        return "haotian-liu LLaVA's model type llava_llama is not in "
               "MODEL_TYPE_TO_APPLY_LIGER_FN (monkey_patch.py:3534-3585): Liger patches "
               "nothing there";
    return NULL;
}

/* the model_type whose apply function runs, or NULL with *why set: the reason the key is
 * refused for this model */
static const char *liger_model_type(const mm_spec *s, const char **why)
{
    const char *dec = fam_name(s, MOD_DECODER), *vis = fam_name(s, MOD_VISION),
               *con = fam_name(s, MOD_CONNECTOR);
    const module_spec *v = mm_spec_module(s, MOD_VISION);
    int text = dec && (!strcmp(dec, "llama") || !strcmp(dec, "qwen2"));
    *why = NULL;
    if (!dec) {
        *why = "the spec has no decoder: Liger patches a language model";
        return NULL;
    }
    if ((*why = unpatched(dec)))
        return NULL;
    if (!v)
        return text ? dec : !strcmp(dec, "gemma3") ? "gemma3_text" : NULL;
    /* Qwen2-VL / Qwen2.5-VL: the tower's model_type picks the function (the two share the
     * qwen2_vl text decoder); one image kind, dynamic resolution */
    if (!strcmp(dec, "qwen2_vl") && vis && (!strcmp(vis, "qwen2_vl") || !strcmp(vis, "qwen2_5_vl")))
        return vis;
    /* Gemma 3: SigLIP and the avg-pool projector (Gemma3ForConditionalGeneration) */
    if (!strcmp(dec, "gemma3") && vis && !strcmp(vis, "siglip") && con && !strcmp(con, "avg_pool"))
        return "gemma3";
    /* LLaVA-1.5: CLIP, the mlp projector, one fixed-size image (llava_next and
     * llava_onevision cut anyres grids and are other model types) */
    if (vis && !strcmp(vis, "clip") && con && !strcmp(con, "mlp") && v->img.kind == IMG_FIXED && text)
        return "llava";
    if (v->img.kind == IMG_ANYRES)
        *why = "LLaVA-NeXT / LLaVA-OneVision (anyres) are model types llava_next / "
               "llava_onevision, which MODEL_TYPE_TO_APPLY_LIGER_FN does not list "
               "(monkey_patch.py:3534-3585): Liger patches nothing there";
    else if (vis && !strcmp(vis, "idefics3"))
        *why = "an Idefics3 tower: model type idefics3 is not in MODEL_TYPE_TO_APPLY_LIGER_FN "
               "(monkey_patch.py:3534-3585), Liger patches nothing there; smolvlm is, and "
               "apply_liger_kernel_to_smolvlm (:2784) patches the tower's LayerNorm: not "
               "modelled yet";
    return NULL;
}

static const char *not_modelled(const mm_spec *s)
{
    const char *dec = fam_name(s, MOD_DECODER), *vis = fam_name(s, MOD_VISION);
    if (vis && (!strcmp(vis, "intern_vit") || !strcmp(vis, "mllama") || !strcmp(vis, "siglip")))
        return "Liger's function for this model also patches the vision tower's LayerNorm "
               "(apply_liger_kernel_to_internvl :2672, _mllama :523, _smolvlm :2784): not "
               "modelled yet for these towers (Qwen2-VL's and Gemma 3's SigLIP are)";
    if (vis && !strcmp(vis, "qwen3_vl"))
        return "apply_liger_kernel_to_qwen3_vl (:2044) patches the text model's norms and "
               "Qwen3-VL's interleaved M-RoPE: not modelled yet";
    if (dec && (!strcmp(dec, "mixtral") || !strcmp(dec, "qwen3_moe")))
        return "Liger's MoE patch (apply_liger_kernel_to_mixtral :799, _qwen3_moe :1722: the "
               "experts' SwiGLU) is not modelled yet";
    if (dec && !strcmp(dec, "qwen3"))
        return "apply_liger_kernel_to_qwen3 (:1665) swaps the RMSNorm class too: q_norm / "
               "k_norm are Liger's when it runs before the model is built (LLaMA-Factory), "
               "HF's when after (the Trainer); not modelled yet";
    return "no Liger apply function for this model is modelled (Llama, Qwen2, LLaVA with "
           "either, Qwen2-VL, Qwen2.5-VL and Gemma 3 are)";
}

/* the parameters of apply_liger_kernel_to_<mt> beyond rope / cross_entropy /
 * fused_linear_cross_entropy / rms_norm (monkey_patch.py: _llama :221, _qwen2 :1598,
 * _qwen2_vl :1860, _qwen2_5_vl :1955, _gemma3_text :1064, _gemma3 :1151) */
static int takes(const char *mt, const char *param)
{
    int gemma = !strcmp(mt, "gemma3") || !strcmp(mt, "gemma3_text");
    if (!strcmp(param, "swiglu"))
        return !gemma;
    if (!strcmp(param, "geglu"))
        return gemma;
    /* layer_norm */
    return !strcmp(mt, "qwen2_vl") || !strcmp(mt, "gemma3");
}

/* a switch the model's apply function has no parameter for, or one not modelled */
static int check_switches(dctx *c, const mm_node *v, const liger_spec *l, const char *mt)
{
    const mm_node *k;
    static const char *const sw[] = {"swiglu", "geglu", "layer_norm"};
    if (l->cross_entropy && v->type == MM_NODE_MAP && (k = mm_node_get(v, "cross_entropy")))
        return key_fail(c, k, "training.liger_kernel.cross_entropy",
                        "Liger's non-fused cross-entropy (ops/cross_entropy.py) is not modelled "
                        "yet; fused_linear_cross_entropy is");
    const int on[] = {l->swiglu, l->geglu, l->layer_norm};
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
        if (on[i] && !takes(mt, sw[i]) && v->type == MM_NODE_MAP && (k = mm_node_get(v, sw[i])))
            return key_fail(c, k, i == 0   ? "training.liger_kernel.swiglu"
                                  : i == 1 ? "training.liger_kernel.geglu"
                                           : "training.liger_kernel.layer_norm",
                            "apply_liger_kernel_to_%s takes no %s%s: "
                            "_apply_liger_kernel_to_instance drops it (monkey_patch.py:3645)", mt,
                            sw[i], i == 1 ? " (its MLP is SwiGLU)" : "");
    /* apply_liger_kernel_to_llava's signature is (cross_entropy, fused_linear_cross_entropy,
     * model, **kwargs): the instance path keeps only those names (:3645), so its text model
     * gets its own defaults whatever the config says (:396-411) */
    if (!strcmp(mt, "llava") && v->type == MM_NODE_MAP && (!l->rope || !l->rms_norm || !l->swiglu))
        return key_fail(c, v, "training.liger_kernel",
                        "LLaVA: _apply_liger_kernel_to_instance passes apply_liger_kernel_to_llava "
                        "only cross_entropy / fused_linear_cross_entropy (monkey_patch.py:3645), "
                        "so its text model always gets rope, rms_norm and swiglu (:396-411): "
                        "turning one off is not what runs");
    return 0;
}

/* the fused linear cross-entropy is the loss: loss: fused_linear, or a conflict */
static int liger_loss(dctx *c, const mm_node *tr, mm_spec *s)
{
    training_spec *t = &s->training;
    const mm_node *lk = mm_node_get(tr, "loss");
    if (!t->liger.fused_linear_cross_entropy)
        return 0;
    if (lk && t->loss != LOSS_FUSED_LINEAR)
        return key_fail(c, lk, "training.loss", "liger_kernel's fused_linear_cross_entropy "
                                                "replaces the model's loss: it is fused_linear");
    t->loss = LOSS_FUSED_LINEAR;
    return 0;
}

int spec_liger(dctx *c, const mm_node *tr, mm_spec *s)
{
    liger_spec *l = &s->training.liger;
    const mm_node *v = mm_node_get(tr, "liger_kernel");
    memset(l, 0, sizeof *l);
    if (!v)
        return 0;
    static const keydesc on = {"liger_kernel", K_BOOL, 0, 0, 1, NULL, 0, 0, 0};
    int enabled = 1;
    if (v->type != MM_NODE_MAP && key_decode_scalar(c, &on, v, &enabled, "training.liger_kernel"))
        return -1;
    if (!enabled)
        return 0;
    /* each apply function's defaults (monkey_patch.py:221-228) */
    l->enabled = l->rope = l->rms_norm = l->swiglu = l->fused_linear_cross_entropy = 1;
    if (v->type == MM_NODE_MAP &&
        key_decode_map(c, v, liger_keys, sizeof liger_keys / sizeof liger_keys[0], l,
                       "training.liger_kernel", 0, NULL, NULL))
        return -1;
    const char *why, *mt = liger_model_type(s, &why);
    if (!mt)
        return key_fail(c, v, "training.liger_kernel", "%s", why ? why : not_modelled(s));
    /* apply_liger_kernel_to_qwen2_vl's layer_norm defaults true (monkey_patch.py:1866);
     * both Qwen-VL functions patch the vision blocks' norm1 / norm2 on an instance */
    int qvl = !strcmp(mt, "qwen2_vl") || !strcmp(mt, "qwen2_5_vl"), g3 = !strcmp(mt, "gemma3");
    /* Gemma 3 (:1151-1240): the SigLIP blocks' layer_norm1 / 2 with layer_norm, its
     * post_layernorm always (:1217), the projector's mm_soft_emb_norm with rms_norm (:1228) */
    l->vision_norms = qvl || g3;
    l->vision_post_ln = g3;
    l->connector_norm = g3;
    for (int i = 0; i < 2; i++) { /* defaults true where the function takes the switch */
        const char *name = i ? "geglu" : "layer_norm";
        const mm_node *k = v->type == MM_NODE_MAP ? mm_node_get(v, name) : NULL;
        if (!k && takes(mt, name))
            *(i ? &l->geglu : &l->layer_norm) = 1;
    }
    if (check_switches(c, v, l, mt))
        return -1;
    return liger_loss(c, tr, s);
}
