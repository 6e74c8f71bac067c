/* spec_module.c - one entry of `modules:`: its type and family, then every key
 * of the module table over the family's defaults, LoRA, quantization and the
 * image processor.  Checks that need only this module are here; links between
 * modules are in spec_links.c. */
#include "spec_internal.h"
#include "family.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define V (1u << MOD_VISION)
#define C (1u << MOD_CONNECTOR)
#define D (1u << MOD_DECODER)
#define ALL (V | C | D)

static const char *const type_names[] = {"vision", "connector", "decoder",
                                         "vit", "mlp", "llama", NULL};
static const char *const attn_names[] = {"eager", "sdpa", "flash", NULL};
static const char *const act_names[] = {"gelu", "quick_gelu", "relu", "silu",
                                        "gelu_pytorch_tanh", NULL};
static const char *const norm_names[] = {"layernorm", "rmsnorm", "gemma_rmsnorm", "none", NULL};
static const char *const mlp_names[] = {"fc", "gated", NULL};
static const char *const qkv_names[] = {"separate", "fused", NULL};
static const char *const qkn_names[] = {"none", "head", "full", NULL};
static const char *const pos_names[] = {"none", "learned", "rope", "mrope", "rope2d",
                                        "learned_rope2d", NULL};
static const char *const merge_names[] = {"masked_scatter", "llava", "cross_attention", NULL};
static const char *const experts_names[] = {"grouped_mm", "eager", NULL};
static const char *const select_names[] = {"default", "full", NULL};

#define M(f) offsetof(module_spec, f)
static const keydesc module_keys[] = {
    {"name", K_NAME, M(name), 0, 0, NULL, ALL, 1, 0},
    {"type", K_SPECIAL, 0, 0, 0, NULL, ALL, 1, 0},
    {"family", K_SPECIAL, 0, 0, 0, NULL, ALL, 0, 0},
    {"trainable", K_BOOL, M(trainable), 0, 1, NULL, ALL, 0, 0},
    {"attention", K_ENUM, M(attention), 0, 0, attn_names, V | D, 0, 0},
    {"hidden_size", K_UINT, M(hidden_size), 1, 1 << 17, NULL, ALL, 1, 0},
    {"num_hidden_layers", K_UINT, M(num_hidden_layers), 1, MM_MAX_LAYERS, NULL, V | D, 1, 0},
    {"num_attention_heads", K_UINT, M(num_attention_heads), 1, 4096, NULL, V | D, 1, 0},
    {"num_key_value_heads", K_UINT, M(num_key_value_heads), 1, 4096, NULL, V | D, 0, 0},
    {"head_dim", K_UINT, M(head_dim), 1, 4096, NULL, V | D, 0, 0},
    {"intermediate_size", K_UINT, M(intermediate_size), 1, 1 << 20, NULL, V | D, 1, 0},
    {"intermediate_size", K_UINT, M(intermediate_size), 1, 1 << 20, NULL, C, 0, 0},
    {"hidden_act", K_ENUM, M(act), 0, 0, act_names, ALL, 0, 0},
    {"activation", K_ENUM, M(act), 0, 0, act_names, C, 0, 0},
    /* the block */
    {"norm", K_ENUM, M(norm), 0, 0, norm_names, V | D, 0, 0},
    {"norm", K_ENUM, M(conn_norm), 0, 0, norm_names, C, 0, 0},
    {"sandwich_norm", K_BOOL, M(sandwich_norm), 0, 1, NULL, D, 0, 0},
    {"qkv", K_ENUM, M(qkv_fused), 0, 0, qkv_names, V | D, 0, 0},
    {"attention_bias", K_SPECIAL, 0, 0, 0, NULL, V | D, 0, 0},
    {"qkv_bias", K_SPECIAL, 0, 0, 0, NULL, V | D, 0, 0},
    {"o_bias", K_BOOL, M(o_bias), 0, 1, NULL, V | D, 0, 0},
    {"qk_norm", K_ENUM, M(qk_norm), 0, 0, qkn_names, V | D, 0, 0},
    {"layer_scale", K_BOOL, M(layer_scale), 0, 1, NULL, V, 0, 0},
    {"mlp", K_ENUM, M(mlp), 0, 0, mlp_names, V | D, 0, 0},
    {"mlp_bias", K_BOOL, M(mlp_bias), 0, 1, NULL, V | D, 0, 0},
    {"softmax_fp32", K_BOOL, M(softmax_fp32), 0, 1, NULL, V | D, 0, 0},
    {"rope_fp32", K_BOOL, M(rope_fp32), 0, 1, NULL, V, 0, 0},
    {"position_embedding", K_ENUM, M(pos), 0, 0, pos_names, V | D, 0, 0},
    /* decoder */
    {"vocab_size", K_UINT, M(vocab_size), 1, 1 << 24, NULL, D, 1, 0},
    {"tie_word_embeddings", K_BOOL, M(tie_word_embeddings), 0, 1, NULL, D, 0, 0},
    {"embedding_rows", K_UINT, M(embedding_rows), 1, 1 << 24, NULL, D, 0, 0},
    {"scale_embeddings", K_BOOL, M(scale_embeddings), 0, 1, NULL, D, 0, 0},
    {"sliding_window", K_UINT, M(sliding_window), 0, 1 << 24, NULL, D, 0, 0},
    {"sliding_layers", K_LAYERS, M(sliding), 0, 0, NULL, D, 0, 0},
    {"sliding_window_pattern", K_SPECIAL, 0, 0, 0, NULL, D, 0, 0},
    {"layer_types", K_SPECIAL, 0, 0, 0, NULL, D, 0, 0},
    {"image_merge", K_ENUM, M(merge), 0, 0, merge_names, D, 0, 0},
    {"bidirectional_images", K_BOOL, M(bidirectional_images), 0, 1, NULL, D, 0, 0},
    {"num_experts", K_UINT, M(num_experts), 0, 4096, NULL, D, 0, 0},
    {"num_experts_per_tok", K_UINT, M(experts_per_tok), 1, 4096, NULL, D, 0, 0},
    {"lora_targets_experts", K_BOOL, M(lora_experts), 0, 1, NULL, D, 0, 0},
    {"moe_intermediate_size", K_UINT, M(moe_intermediate_size), 1, 1 << 20, NULL, D, 0, 0},
    {"shared_expert_intermediate_size", K_UINT, M(shared_expert_intermediate_size), 0, 1 << 20,
     NULL, D, 0, 0},
    {"shared_expert_gate", K_BOOL, M(shared_expert_gate), 0, 1, NULL, D, 0, 0},
    {"dense_layers", K_LAYERS, M(dense), 0, 0, NULL, D, 0, 0},
    {"experts_implementation", K_ENUM, M(experts), 0, 0, experts_names, D, 0, 0},
    {"moe_imbalance", K_FLOAT, M(moe_imbalance), 1, 4096, NULL, D, 0, 0},
    {"output_router_logits", K_BOOL, M(router_logits), 0, 1, NULL, D, 0, 0},
    {"cross_attention_layers", K_LAYERS, M(cross), 0, 0, NULL, D, 0, 0},
    /* vision */
    {"image_size", K_UINT, M(image_size), 1, 16384, NULL, V, 0, 0},
    {"patch_size", K_UINT, M(patch_size), 1, 1024, NULL, V, 1, 0},
    {"num_channels", K_UINT, M(num_channels), 1, 64, NULL, V, 0, 0},
    {"temporal_patch_size", K_UINT, M(temporal_patch_size), 0, 64, NULL, V, 0, 0},
    {"spatial_merge_size", K_UINT, M(spatial_merge_size), 0, 64, NULL, V, 0, 0},
    {"patch_bias", K_BOOL, M(patch_bias), 0, 1, NULL, V, 0, 0},
    {"class_token", K_BOOL, M(class_token), 0, 1, NULL, V, 0, 0},
    {"pre_layernorm", K_BOOL, M(pre_layernorm), 0, 1, NULL, V, 0, 0},
    {"post_layernorm", K_BOOL, M(post_layernorm), 0, 1, NULL, V, 0, 0},
    {"packed", K_BOOL, M(packed), 0, 1, NULL, V, 0, 0},
    {"select_layer", K_INT, M(select_layer), -(MM_MAX_LAYERS + 1), MM_MAX_LAYERS, NULL, V, 0, 0},
    {"feature_select", K_ENUM, M(keep_cls), 0, 0, select_names, V, 0, 0},
    {"output_hidden_states", K_BOOL, M(hidden_tuple), 0, 1, NULL, V, 0, 0},
    {"feature_post_norm", K_BOOL, M(feature_post_norm), 0, 1, NULL, V, 0, 0},
    {"window_size", K_UINT, M(window_size), 0, 1 << 20, NULL, V, 0, 0},
    {"fullatt_block_indexes", K_LAYERS, M(full_attention), 0, 0, NULL, V, 0, 0},
    {"deepstack_visual_indexes", K_LAYERS, M(deepstack), 0, 0, NULL, V, 0, 0},
    {"deepstack_trainable", K_BOOL, M(deepstack_trainable), 0, 1, NULL, C, 0, 0},
    {"num_global_layers", K_UINT, M(num_global_layers), 0, MM_MAX_LAYERS, NULL, V, 0, 0},
    {"intermediate_layers_indices", K_LAYERS, M(taps), 0, 0, NULL, V, 0, 0},
    {"max_num_tiles", K_UINT, M(max_num_tiles), 1, 64, NULL, V, 0, 0},
    {"aspect_ratio_ids", K_UINT, M(aspect_ratio_ids), 1, 4096, NULL, V, 0, 0},
    {"num_position_embeddings", K_UINT, M(num_position_embeddings), 1, 1 << 20, NULL, V, 0, 0},
    {"pooling_head", K_BOOL, M(pooling_head), 0, 1, NULL, V, 0, 0},
    /* ms-swift vit_gradient_checkpointing (swift/trainers/mixin.py
     * _prepare_gradient_checkpointing): the tower's own switch over training's */
    {"gradient_checkpointing", K_BOOL, M(tower_ckpt), 0, 1, NULL, V, 0, 0},
    {"image_processor", K_SPECIAL, 0, 0, 0, NULL, V, 0, 0},
    /* connector */
    {"input_size", K_UINT, M(input_size), 1, 1 << 17, NULL, C, 1, 0},
    {"num_layers", K_UINT, M(num_layers), 1, 64, NULL, C, 0, 0},
    {"norm_after_merge", K_BOOL, M(conn_norm_after), 0, 1, NULL, C, 0, 0},
    {"merge_size", K_UINT, M(merge_size), 1, 64, NULL, C, 0, 0},
    {"pool_kernel", K_UINT, M(pool_kernel), 1, 256, NULL, C, 0, 0},
    {"bias", K_BOOL, M(conn_bias), 0, 1, NULL, C, 0, 0},
    {"image_newline", K_BOOL, M(image_newline), 0, 1, NULL, C, 0, 0},
    /* all */
    {"quantization", K_SPECIAL, 0, 0, 0, NULL, ALL, 0, 0},
    {"lora", K_SPECIAL, 0, 0, 0, NULL, ALL, 0, 0},
};
#undef M
#define NMODKEYS (sizeof module_keys / sizeof module_keys[0])

/* type (and the family it implies for the 0.1 names) */
static int decode_type(dctx *c, const mm_node *ty, module_spec *ms, const char *prefix,
                       const family_def **fam)
{
    char path[160];
    static const keydesc tk = {"type", K_ENUM, 0, 0, 0, type_names, 0, 1, 0};
    int t = 0;
    if (key_decode_scalar(c, &tk, ty, &t, key_path(path, sizeof path, prefix, "type")))
        return -1;
    static const char *const legacy_family[3] = {"clip", "mlp", "llava_llama"};
    ms->kind = (mod_kind)(t % 3);
    ms->legacy = t >= 3;
    *fam = ms->legacy ? family_find(ms->kind, legacy_family[t - 3]) : family_default(ms->kind);
    return 0;
}

static int decode_family(dctx *c, const mm_node *fn, module_spec *ms, const char *prefix,
                         const family_def **fam)
{
    char path[160];
    key_path(path, sizeof path, prefix, "family");
    if (fn->type != MM_NODE_SCALAR || fn->is_null)
        return key_fail(c, fn, path, "expected a family name, got %s", key_type_name(fn));
    if (ms->legacy)
        return key_fail(c, fn, path, "type '%s' has a fixed family; use type: %s with family:",
                        ms->kind == MOD_VISION ? "vit" : ms->kind == MOD_CONNECTOR ? "mlp"
                                                                                   : "llama",
                        spec_kind_name(ms->kind));
    *fam = family_find(ms->kind, fn->str);
    if (*fam)
        return 0;
    const char *names[64];
    size_t n = family_names(ms->kind, names, 64);
    const char *sug = mm_suggest(fn->str, names, n);
    char list[512] = "";
    for (size_t i = 0; i < n; i++) {
        strncat(list, names[i], sizeof list - strlen(list) - 1);
        if (i + 1 < n)
            strncat(list, " | ", sizeof list - strlen(list) - 1);
    }
    return key_fail(c, fn, path, "unknown %s family '%s'%s%s%s (expected %s)",
                    spec_kind_name(ms->kind), fn->str, sug ? " (did you mean '" : "",
                    sug ? sug : "", sug ? "'?)" : "", list);
}

/* name, type and family first: they decide the key path and the defaults */
static int module_head(dctx *c, const mm_node *m, size_t idx, module_spec *ms, char *prefix,
                       size_t np)
{
    snprintf(prefix, np, "modules[%zu]", idx);
    if (m->type != MM_NODE_MAP)
        return key_fail(c, m, prefix, "expected a mapping, got %s", key_type_name(m));
    const mm_node *nm = mm_node_get(m, "name"), *ty = mm_node_get(m, "type");
    const mm_node *fn = mm_node_get(m, "family");
    char path[160];
    if (!nm)
        return key_fail(c, m, prefix, "required key 'name' is missing");
    char name[MM_MAX_NAME];
    static const keydesc nk = {"name", K_NAME, 0, 0, 0, NULL, 0, 1, 0};
    if (key_decode_scalar(c, &nk, nm, name, key_path(path, sizeof path, prefix, "name")))
        return -1;
    snprintf(prefix, np, "%s", name);
    if (!ty)
        return key_fail(c, m, prefix, "required key 'type' is missing");
    const family_def *fam = NULL;
    module_spec head;
    memset(&head, 0, sizeof head);
    if (decode_type(c, ty, &head, prefix, &fam))
        return -1;
    if (fn && decode_family(c, fn, &head, prefix, &fam))
        return -1;
    memset(ms, 0, sizeof *ms);
    ms->kind = head.kind;
    ms->legacy = head.legacy;
    ms->trainable = 1;
    ms->attention = ATT_INHERIT;
    fam->apply(ms);
    ms->family = (int)(fam - family_at(ms->kind, 0));
    mm_strlcpy(ms->name, name, sizeof ms->name);
    ms->line = m->line;
    ms->col = m->col;
    return 0;
}

static int decode_specials(dctx *c, const mm_node *m, module_spec *ms, const char *prefix)
{
    char path[160];
    const mm_node *v;
    if ((v = mm_node_get(m, "attention_bias"))) {
        int b = 0;
        static const keydesc bk = {"attention_bias", K_BOOL, 0, 0, 1, NULL, 0, 0, 0};
        if (key_decode_scalar(c, &bk, v, &b, key_path(path, sizeof path, prefix, "attention_bias")))
            return -1;
        ms->q_bias = ms->k_bias = ms->v_bias = ms->o_bias = b;
    }
    if ((v = mm_node_get(m, "qkv_bias"))) {
        int b = 0;
        static const keydesc bk = {"qkv_bias", K_BOOL, 0, 0, 1, NULL, 0, 0, 0};
        if (key_decode_scalar(c, &bk, v, &b, key_path(path, sizeof path, prefix, "qkv_bias")))
            return -1;
        ms->q_bias = ms->k_bias = ms->v_bias = b;
    }
    if ((v = mm_node_get(m, "o_bias")) && mm_node_get(m, "attention_bias")) {
        /* o_bias after attention_bias refines it: decode it again */
        static const keydesc ok = {"o_bias", K_BOOL, offsetof(module_spec, o_bias), 0, 1, NULL,
                                   0, 0, 0};
        if (key_decode_scalar(c, &ok, v, ms, key_path(path, sizeof path, prefix, "o_bias")))
            return -1;
    }
    if ((v = mm_node_get(m, "sliding_window_pattern")) && spec_sliding_pattern(c, v, ms, prefix))
        return -1;
    if ((v = mm_node_get(m, "layer_types")) && spec_layer_types(c, v, ms, prefix))
        return -1;
    if ((v = mm_node_get(m, "image_processor")) && spec_image_processor(c, v, ms, prefix))
        return -1;
    if ((v = mm_node_get(m, "quantization")) && !v->is_null && spec_quantization(c, v, ms, prefix))
        return -1;
    if ((v = mm_node_get(m, "lora")) && !v->is_null && spec_lora(c, v, ms, prefix))
        return -1;
    /* Qwen's train_qwen.py tune_mm_mlp trains visual.merger only */
    ms->deepstack_frozen = mm_node_get(m, "deepstack_trainable") && !ms->deepstack_trainable;
    if ((v = mm_node_get(m, "gradient_checkpointing"))) {
        ms->tower_ckpt_given = 1;
        if (ms->tower_ckpt && ms->no_ckpt)
            return key_fail(c, v, key_path(path, sizeof path, prefix, "gradient_checkpointing"),
                            "true has no effect on this "
                            "family's tower (its encoder layers are not "
                            "GradientCheckpointingLayers)");
    }
    return 0;
}

int spec_decode_module(dctx *c, const mm_node *m, size_t idx, module_spec *ms)
{
    char prefix[96];
    if (module_head(c, m, idx, ms, prefix, sizeof prefix))
        return -1;
    unsigned kb = 1u << ms->kind;
    unsigned char seen[NMODKEYS] = {0};
    const char *kname = ms->legacy ? (ms->kind == MOD_VISION ? "vit" : ms->kind == MOD_CONNECTOR
                                                                     ? "mlp" : "llama")
                                   : spec_kind_name(ms->kind);
    if (key_decode_map(c, m, module_keys, NMODKEYS, ms, prefix, kb, kname, seen))
        return -1;
    if (key_check_required(c, m, module_keys, NMODKEYS, seen, prefix, kb))
        return -1;
    if (decode_specials(c, m, ms, prefix))
        return -1;
    if (ms->kind != MOD_CONNECTOR && !ms->num_key_value_heads)
        ms->num_key_value_heads = ms->num_attention_heads;
    return spec_validate_module(c, m, ms);
}
