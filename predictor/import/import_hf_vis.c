/* import_hf_vis.c - a VLM's vision config -> the vision module, and the
 * model's projector keys -> the connector.  Defaults are the transformers
 * 5.17 vision config classes' (CLIPVisionConfig, SiglipVisionConfig,
 * Qwen2VL / Qwen2_5_VL / Qwen3VL VisionConfig, InternVLVisionConfig,
 * Idefics3 / SmolVLM VisionConfig, MllamaVisionConfig, PixtralVisionConfig) and, for InternVL's
 * original remote-code format, InternVisionConfig's. */
#include "import_hf.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define ULL(x) ((unsigned long long)(x))

typedef struct vis_class {
    const char *vision_type;   /* vision_config.model_type (or the top type) */
    const char *family;
    uint64_t hidden, inter, layers, heads, image, patch;
    const char *act;
} vis_class;

static const vis_class vis_classes[] = {
    {"clip_vision_model", "clip", 768, 3072, 12, 12, 224, 32, "quick_gelu"},
    {"siglip_vision_model", "siglip", 768, 3072, 12, 12, 224, 16, "gelu_pytorch_tanh"},
    {"qwen2_vl", "qwen2_vl", 1280, 5120, 32, 16, 0, 14, "quick_gelu"},
    {"qwen2_5_vl", "qwen2_5_vl", 3584, 3420, 32, 16, 0, 14, "silu"},
    {"qwen3_vl", "qwen3_vl", 1152, 4304, 27, 16, 0, 16, "gelu_pytorch_tanh"},
    {"internvl_vision", "intern_vit", 1024, 4096, 24, 16, 448, 14, "gelu"},
    {"intern_vit_6b", "intern_vit", 3200, 12800, 48, 25, 224, 14, "gelu"},
    {"idefics3_vision", "idefics3", 1152, 3072, 12, 16, 224, 32, "gelu_pytorch_tanh"},
    {"smolvlm_vision", "idefics3", 1152, 3072, 12, 16, 224, 32, "gelu_pytorch_tanh"},
    {"mllama_vision_model", "mllama", 1280, 5120, 32, 16, 448, 14, "gelu"},
    {"pixtral", "pixtral", 1024, 4096, 24, 16, 1024, 16, "gelu"}, /* PixtralVisionConfig */
};

static const vis_class *vis_class_of(const char *type)
{
    for (size_t i = 0; i < sizeof vis_classes / sizeof vis_classes[0]; i++)
        if (strcmp(vis_classes[i].vision_type, type) == 0)
            return &vis_classes[i];
    return NULL;
}

static void setu(imp_section *m, hfc *h, const char *key, const char *hfkey, uint64_t v)
{
    char w[128];
    imp_set(m, key, hf_where(h, hfkey, w, sizeof w), "%llu", ULL(v));
}

/* Qwen-VL: depth / embed_dim / num_heads (+ mlp_ratio for Qwen2-VL) */
static int qwen_geometry(hfc *v, const vis_class *vc, imp_section *m, uint64_t *hidden)
{
    uint64_t L, a, h, I, ratio, ch, p, t, sm;
    int q2 = !strcmp(vc->family, "qwen2_vl");
    const char *hk = q2 ? "embed_dim" : "hidden_size";
    const char *ck = hf_node(v, "in_chans") ? "in_chans" : "in_channels";
    if (hf_u64(v, "depth", vc->layers, &L) || hf_u64(v, "num_heads", vc->heads, &a) ||
        hf_u64(v, hk, vc->hidden, &h) || hf_u64(v, "mlp_ratio", 4, &ratio) ||
        hf_u64(v, "intermediate_size", vc->inter, &I) || hf_u64(v, ck, 3, &ch) ||
        hf_u64(v, "patch_size", vc->patch, &p) || hf_u64(v, "temporal_patch_size", 2, &t) ||
        hf_u64(v, "spatial_merge_size", 2, &sm))
        return -1;
    hf_mark(v, "in_chans");
    hf_mark(v, "in_channels");
    setu(m, v, "hidden_size", hk, h);
    setu(m, v, "num_hidden_layers", "depth", L);
    setu(m, v, "num_attention_heads", "num_heads", a);
    if (q2)
        imp_set(m, "intermediate_size", "vision_config.embed_dim x mlp_ratio", "%llu", ULL(h * ratio));
    else
        setu(m, v, "intermediate_size", "intermediate_size", I);
    setu(m, v, "patch_size", "patch_size", p);
    setu(m, v, "temporal_patch_size", "temporal_patch_size", t);
    setu(m, v, "spatial_merge_size", "spatial_merge_size", sm);
    setu(m, v, "num_channels", ck, ch);
    *hidden = h;
    return 0;
}

static int qwen_extras(hfc *v, const vis_class *vc, imp_section *m)
{
    char list[600], w[128];
    size_t n;
    if (!strcmp(vc->family, "qwen2_5_vl")) {
        uint64_t win;
        if (hf_u64(v, "window_size", 112, &win) || hf_list(v, "fullatt_block_indexes", list,
                                                            sizeof list, &n))
            return -1;
        setu(m, v, "window_size", "window_size", win);
        imp_set(m, "fullatt_block_indexes", hf_where(v, "fullatt_block_indexes", w, sizeof w), "%s",
                n ? list : "[7, 15, 23, 31]");
    }
    if (!strcmp(vc->family, "qwen3_vl")) {
        uint64_t np;
        if (hf_list(v, "deepstack_visual_indexes", list, sizeof list, &n) ||
            hf_u64(v, "num_position_embeddings", 2304, &np))
            return -1;
        imp_set(m, "deepstack_visual_indexes", hf_where(v, "deepstack_visual_indexes", w, sizeof w),
                "%s", n ? list : "[8, 16, 24]");
        setu(m, v, "num_position_embeddings", "num_position_embeddings", np);
    }
    return 0;
}

/* CLIP, SigLIP, InternViT, Idefics3, Mllama: the usual names */
static int vit_geometry(hfc *v, const vis_class *vc, imp_section *m, uint64_t *hidden)
{
    uint64_t h, L, a, I, img, p, ch;
    const char *hk = !strcmp(vc->family, "mllama") ? "attention_heads" : "num_attention_heads";
    if (hf_u64(v, "hidden_size", vc->hidden, &h) || hf_u64(v, "num_hidden_layers", vc->layers, &L) ||
        hf_u64(v, hk, vc->heads, &a) || hf_u64(v, "intermediate_size", vc->inter, &I) ||
        hf_u64_or_pair(v, "image_size", vc->image, &img) ||
        hf_u64_or_pair(v, "patch_size", vc->patch, &p) || hf_u64(v, "num_channels", 3, &ch))
        return -1;
    setu(m, v, "hidden_size", "hidden_size", h);
    setu(m, v, "num_hidden_layers", "num_hidden_layers", L);
    setu(m, v, "num_attention_heads", hk, a);
    setu(m, v, "intermediate_size", "intermediate_size", I);
    setu(m, v, "image_size", "image_size", img);
    setu(m, v, "patch_size", "patch_size", p);
    setu(m, v, "num_channels", "num_channels", ch);
    *hidden = h;
    return 0;
}

/* InternViT's norm, biases, qk-norm and layer scale (both config formats) */
static int intern_vit(hfc *v, imp_section *m, int original)
{
    char norm[64], w[128];
    int qkvb, qkn, mean;
    double ls;
    if (hf_str(v, "norm_type", original ? "rms_norm" : "layer_norm", norm, sizeof norm) ||
        hf_bool(v, original ? "qkv_bias" : "attention_bias", 0, &qkvb) ||
        hf_bool(v, original ? "qk_normalization" : "use_qk_norm", original, &qkn) ||
        hf_bool(v, "use_mean_pooling", 1, &mean) ||
        hf_f64(v, "layer_scale_init_value", 0.1, &ls))
        return -1;
    if (strcmp(norm, "layer_norm") && strcmp(norm, "rms_norm"))
        return hf_fail(v, "norm_type", "expected layer_norm or rms_norm, got '%s'", norm);
    imp_set(m, "norm", hf_where(v, "norm_type", w, sizeof w), "%s",
            !strcmp(norm, "rms_norm") ? "rmsnorm" : "layernorm");
    imp_set(m, "qkv_bias", original ? "vision_config.qkv_bias" : "vision_config.attention_bias", "%s",
            qkvb ? "true" : "false");
    imp_set(m, "qk_norm", "qk-norm over all heads", "%s", qkn ? "full" : "none");
    if (original) /* the remote-code InternViT keeps one qkv Linear */
        imp_set(m, "qkv", "InternViT (remote code): attn.qkv", "fused");
    else
        imp_set(m, "post_layernorm", "vision_config.use_mean_pooling", "%s", mean ? "false" : "true");
    int moe = 0;
    if (original && hf_bool(v, "use_moe", 0, &moe))
        return -1;
    if (moe)
        return hf_fail(v, "use_moe", "InternViT-MoE is not modelled");
    static const char *const inert[] = {"capacity_factor", "eval_capacity_factor", "laux_allreduce",
                                        "moe_coeff_ratio", "moe_intermediate_size",
                                        "moe_output_scale", "noisy_gate_policy", "num_experts",
                                        "num_routed_experts", "num_shared_experts",
                                        "shared_expert_intermediate_size", "use_residual", "use_rts",
                                        "use_weighted_residual"};
    for (size_t i = 0; original && i < sizeof inert / sizeof inert[0]; i++)
        if (hf_node(v, inert[i]))
            imp_note(v->s, "ignored vision_config.%s: InternViT-MoE option, use_moe is false",
                     inert[i]);
    return 0;
}

static int mllama_vision(hfc *v, imp_section *m, uint64_t h, uint64_t *out_dim)
{
    char list[600], w[128];
    size_t n;
    uint64_t G, tiles, od;
    const mm_node *ar = hf_node(v, "supported_aspect_ratios");
    if (hf_u64(v, "num_global_layers", 8, &G) || hf_u64(v, "max_num_tiles", 4, &tiles) ||
        hf_list(v, "intermediate_layers_indices", list, sizeof list, &n) ||
        hf_u64(v, "vision_output_dim", 7680, &od))
        return -1;
    if (!n) {
        snprintf(list, sizeof list, "[3, 7, 15, 23, 30]");
        n = 5;
    }
    if (od != h * (1 + n))
        return hf_fail(v, "vision_output_dim", "%llu is not hidden_size x (1 + %zu taps) = %llu",
                       ULL(od), n, ULL(h * (1 + n)));
    setu(m, v, "num_global_layers", "num_global_layers", G);
    setu(m, v, "max_num_tiles", "max_num_tiles", tiles);
    imp_set(m, "intermediate_layers_indices",
            hf_where(v, "intermediate_layers_indices", w, sizeof w), "%s", list);
    imp_set(m, "aspect_ratio_ids", "len(vision_config.supported_aspect_ratios)", "%zu",
            ar && ar->type == MM_NODE_SEQ ? ar->n : (size_t)8);
    *out_dim = od;
    return 0;
}

/* PixtralVisionConfig.__post_init__ (configuration_pixtral.py:55-57) derives
 * head_dim = hidden_size // num_attention_heads; PixtralAttention uses that
 * (modeling_pixtral.py:178), so a config.json's head_dim must agree */
static int pixtral_vision(hfc *v, imp_section *m)
{
    uint64_t h = 0, a = 0, hd;
    key_parse_u64(imp_get(m, "hidden_size"), &h);
    key_parse_u64(imp_get(m, "num_attention_heads"), &a);
    if (!a || hf_u64(v, "head_dim", h / a, &hd))
        return -1;
    if (hd != h / a)
        return hf_fail(v, "head_dim", "%llu is not hidden_size / num_attention_heads = %llu "
                                      "(PixtralAttention derives it)", ULL(hd), ULL(h / a));
    return 0;
}

/* which hidden state and whether the CLS token is kept */
static int feature_layer(hfc *top, imp_section *m, const char *top_type)
{
    char w[128], strat[64];
    int64_t sel = -1;
    const mm_node *fl = hf_node(top, "vision_feature_layer");
    if (fl && fl->type == MM_NODE_SEQ)
        return hf_fail(top, "vision_feature_layer", "several concatenated layers are not modelled");
    if (!strcmp(top_type, "llava") && hf_i64(top, "vision_feature_layer", -2, &sel))
        return -1;
    if ((!strcmp(top_type, "llava_onevision") || !strcmp(top_type, "internvl") ||
         !strcmp(top_type, "mistral3")) &&
        hf_i64(top, "vision_feature_layer", -1, &sel))
        return -1;
    if (!strcmp(top_type, "internvl_chat") && hf_i64(top, "select_layer", -1, &sel))
        return -1;
    imp_set(m, "select_layer", hf_where(top, "vision_feature_layer", w, sizeof w), "%lld",
            (long long)sel);
    if (hf_str(top, "vision_feature_select_strategy",
               !strcmp(top_type, "llava_onevision") ? "full" : "default", strat, sizeof strat))
        return -1;
    if (strcmp(strat, "default") && strcmp(strat, "full"))
        return hf_fail(top, "vision_feature_select_strategy", "expected default or full");
    if (!strcmp(strat, "full"))
        imp_set(m, "feature_select", "vision_feature_select_strategy", "full");
    return 0;
}

static int connector(hfc *top, const char *top_type, imp_spec *s, uint64_t vh, uint64_t th,
                     uint64_t mllama_dim, const vis_class *vc)
{
    imp_section *c = imp_module(s, "connector");
    char w[128], act[64];
    if (!strcmp(top_type, "llava") || !strcmp(top_type, "llava_onevision")) {
        int bias;
        if (hf_str(top, "projector_hidden_act", "gelu", act, sizeof act) ||
            hf_bool(top, "multimodal_projector_bias", 1, &bias))
            return -1;
        imp_set(c, "family", "multi_modal_projector", "mlp");
        imp_set(c, "hidden_act", hf_where(top, "projector_hidden_act", w, sizeof w), "%s", act);
        if (!bias)
            imp_set(c, "bias", "multimodal_projector_bias", "false");
        int nl = !strcmp(top_type, "llava_onevision");
        if (nl && hf_bool(top, "use_image_newline_parameter", 1, &nl))
            return -1;
        if (nl)
            imp_set(c, "image_newline", "use_image_newline_parameter", "true");
    } else if (!strcmp(vc->family, "qwen2_vl") || !strcmp(vc->family, "qwen3_vl")) {
        imp_set(c, "family", "merger", "patch_merger");
    } else if (!strcmp(vc->family, "qwen2_5_vl")) {
        imp_set(c, "family", "merger (RMSNorm ln_q)", "patch_merger_rms");
    } else if (!strcmp(top_type, "internvl") || !strcmp(top_type, "internvl_chat")) {
        double r;
        if (hf_f64(top, "downsample_ratio", 0.5, &r))
            return -1;
        if (r <= 0 || fabs(1.0 / r - floor(1.0 / r + 0.5)) > 1e-9)
            return hf_fail(top, "downsample_ratio", "1/ratio must be a whole number");
        imp_set(c, "family", "multi_modal_projector (mlp1)", "pixel_shuffle_mlp");
        imp_set(c, "merge_size", "1 / downsample_ratio", "%.0f", 1.0 / r);
        if (!strcmp(top_type, "internvl")) { /* InternVLMultiModalProjector's act */
            if (hf_str(top, "projector_hidden_act", "gelu", act, sizeof act))
                return -1;
            imp_set(c, "hidden_act", hf_where(top, "projector_hidden_act", w, sizeof w), "%s", act);
        }
    } else if (!strcmp(top_type, "idefics3") || !strcmp(top_type, "smolvlm")) {
        uint64_t sf;
        if (hf_u64(top, "scale_factor", 2, &sf))
            return -1;
        imp_set(c, "family", "connector.modality_projection", "pixel_shuffle_linear");
        imp_set(c, "merge_size", "scale_factor", "%llu", ULL(sf));
    } else if (!strcmp(top_type, "gemma3")) {
        uint64_t t, img, p;
        if (hf_u64(top, "mm_tokens_per_image", 256, &t))
            return -1;
        imp_section *v = imp_module(s, "vision");
        key_parse_u64(imp_get(v, "image_size"), &img);
        key_parse_u64(imp_get(v, "patch_size"), &p);
        uint64_t side = (uint64_t)(sqrt((double)t) + 0.5), g = p ? img / p : 0;
        if (!side || side * side != t || !g || g % side)
            return hf_fail(top, "mm_tokens_per_image", "%llu tokens do not pool a %llux%llu grid",
                           ULL(t), ULL(g), ULL(g));
        imp_set(c, "family", "Gemma3MultiModalProjector", "avg_pool");
        imp_set(c, "pool_kernel", "patches per side / sqrt(mm_tokens_per_image)", "%llu",
                ULL(g / side));
    } else if (!strcmp(top_type, "mistral3")) { /* Mistral3Config (configuration_mistral3.py) */
        uint64_t sm;
        int bias;
        if (hf_u64(top, "spatial_merge_size", 2, &sm) || hf_str(top, "projector_hidden_act", "gelu",
                                                                 act, sizeof act) ||
            hf_bool(top, "multimodal_projector_bias", 0, &bias))
            return -1;
        imp_set(c, "family", "Mistral3MultiModalProjector", "mistral3_merger");
        imp_set(c, "merge_size", hf_where(top, "spatial_merge_size", w, sizeof w), "%llu", ULL(sm));
        imp_set(c, "hidden_act", hf_where(top, "projector_hidden_act", w, sizeof w), "%s", act);
        if (bias)
            imp_set(c, "bias", "multimodal_projector_bias", "true");
    } else if (!strcmp(top_type, "mllama")) {
        imp_set(c, "family", "multi_modal_projector", "linear");
        vh = mllama_dim;
    }
    imp_set(c, "input_size", "the vision output width", "%llu", ULL(vh));
    imp_set(c, "hidden_size", "the decoder's hidden_size", "%llu", ULL(th));
    return 0;
}

int imp_hf_vision(hfc *top, hfc *v, const char *top_type, imp_spec *s)
{
    char vtype[64] = "", w[128];
    if (hf_str(v, "model_type", "", vtype, sizeof vtype))
        return -1;
    if (!strcmp(top_type, "qwen2_vl") || !strcmp(top_type, "qwen2_5_vl") ||
        !strncmp(top_type, "qwen3_vl", 8))
        snprintf(vtype, sizeof vtype, "%s", !strncmp(top_type, "qwen3_vl", 8) ? "qwen3_vl" : top_type);
    if (!vtype[0])
        snprintf(vtype, sizeof vtype, "%s", !strcmp(top_type, "llava") ? "clip_vision_model"
                                           : !strcmp(top_type, "internvl") ? "internvl_vision"
                                           : !strcmp(top_type, "mllama") ? "mllama_vision_model"
                                           : !strcmp(top_type, "idefics3") ? "idefics3_vision"
                                           : !strcmp(top_type, "smolvlm") ? "smolvlm_vision"
                                           : !strcmp(top_type, "mistral3") ? "pixtral"
                                           : "siglip_vision_model");
    const vis_class *vc = vis_class_of(vtype);
    if (!vc)
        return hf_fail(v, "model_type", "vision model '%s' is not one mmguard describes", vtype);
    imp_section *m = imp_module(s, "vision");
    imp_set(m, "family", hf_where(v, "model_type", w, sizeof w), "%s", vc->family);
    imp_set(m, "trainable", "most recipes freeze the vision tower: edit if yours trains it",
            "false");
    uint64_t vh = 0, od = 0;
    int qwen = !strncmp(vc->family, "qwen", 4);
    if (qwen ? qwen_geometry(v, vc, m, &vh) || qwen_extras(v, vc, m) : vit_geometry(v, vc, m, &vh))
        return -1;
    char act[64];
    if (hf_str(v, "hidden_act", vc->act, act, sizeof act))
        return -1;
    imp_set(m, "hidden_act", hf_where(v, "hidden_act", w, sizeof w), "%s", act);
    if (!strcmp(vc->family, "intern_vit") && intern_vit(v, m, !strcmp(vtype, "intern_vit_6b")))
        return -1;
    if (!strcmp(vc->family, "mllama") && mllama_vision(v, m, vh, &od))
        return -1;
    if (!strcmp(vc->family, "pixtral") && pixtral_vision(v, m))
        return -1;
    if (!strcmp(vc->family, "siglip")) {
        int head;
        if (hf_bool(v, "vision_use_head", 1, &head))
            return -1;
        if (head)
            imp_set(m, "pooling_head", "vision_config.vision_use_head", "true");
        if (!strcmp(top_type, "gemma3")) { /* last_hidden_state, post_layernorm applied */
            imp_set(m, "output_hidden_states", "Gemma3 takes last_hidden_state", "false");
            imp_set(m, "feature_post_norm", "Gemma3 takes last_hidden_state", "true");
        }
    }
    if (!qwen && strcmp(vc->family, "mllama") && strcmp(vc->family, "idefics3") &&
        strcmp(top_type, "gemma3") && feature_layer(top, m, top_type))
        return -1;
    hf_mark(v, "vocab_size"); /* CLIP vision configs carry a stray vocab_size */
    if (hf_node(v, "tie_word_embeddings"))
        imp_note(s, "ignored vision_config.tie_word_embeddings: a vision model has no word "
                    "embeddings");
    uint64_t th = 0;
    const char *hidden = qwen && !strcmp(vc->family, "qwen2_vl") ? "hidden_size" : "out_hidden_size";
    if (qwen && hf_u64(v, hidden, 0, &th))
        return -1;
    if (hf_finish(v))
        return -1;
    if (!th)
        key_parse_u64(imp_get(imp_module(s, "decoder"), "hidden_size"), &th);
    return connector(top, top_type, s, vh, th, od, vc);
}
