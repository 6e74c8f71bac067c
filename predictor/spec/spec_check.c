/* spec_check.c - what one module can check on its own: geometry PyTorch would
 * refuse when building the model, and combinations that cannot exist.  Each
 * refusal names the key and says why. */
#include "spec_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ULL(x) ((unsigned long long)(x))

static int bad(dctx *c, const mm_node *m, const module_spec *ms, const char *key,
               const char *fmt, ...) MM_PRINTF(5, 6);
static int bad(dctx *c, const mm_node *m, const module_spec *ms, const char *key,
               const char *fmt, ...)
{
    char path[160], what[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(path, sizeof path, "%s.%s", ms->name, key);
    const mm_node *at = mm_node_get(m, key);
    return key_fail(c, at ? at : m, path, "%s", what);
}

/* layer_types: [sliding_attention, full_attention, ...] (transformers >= 4.53) */
int spec_layer_types(dctx *c, const mm_node *v, module_spec *ms, const char *prefix)
{
    char path[160];
    key_path(path, sizeof path, prefix, "layer_types");
    if (v->type != MM_NODE_SEQ)
        return key_fail(c, v, path, "expected a list of sliding_attention | full_attention");
    memset(&ms->sliding, 0, sizeof ms->sliding);
    for (size_t i = 0; i < v->n; i++) {
        const mm_node *e = v->vals[i];
        if (e->type != MM_NODE_SCALAR || e->is_null)
            return key_fail(c, e, path, "expected sliding_attention or full_attention");
        if (!strcmp(e->str, "sliding_attention"))
            lset_add(&ms->sliding, i);
        else if (strcmp(e->str, "full_attention") != 0)
            return key_fail(c, e, path, "unknown layer type '%s' (expected sliding_attention | "
                                        "full_attention)", e->str);
    }
    if (v->n != ms->num_hidden_layers)
        return key_fail(c, v, path, "%zu entries for %llu layers", v->n, ULL(ms->num_hidden_layers));
    return 0;
}

static int layers_in_range(dctx *c, const mm_node *m, const module_spec *ms, const layer_set *s,
                           const char *key, uint64_t depth)
{
    uint64_t i = lset_first_from(s, depth);
    if (i < MM_MAX_LAYERS)
        return bad(c, m, ms, key, "layer %llu does not exist (the module has %llu layers)",
                   ULL(i), ULL(depth));
    return 0;
}

static int check_heads(dctx *c, const mm_node *m, module_spec *ms)
{
    uint64_t heads = ms->num_attention_heads;
    if (!ms->head_dim) {
        if (ms->hidden_size % heads)
            return bad(c, m, ms, "num_attention_heads", "%llu heads do not divide hidden_size %llu",
                       ULL(heads), ULL(ms->hidden_size));
        ms->head_dim = ms->hidden_size / heads;
    }
    if (ms->num_key_value_heads > heads || heads % ms->num_key_value_heads)
        return bad(c, m, ms, "num_key_value_heads",
                   "%llu key/value heads must divide num_attention_heads %llu",
                   ULL(ms->num_key_value_heads), ULL(heads));
    int rot = ms->pos == POS_ROPE || ms->pos == POS_MROPE;
    if (rot && ms->head_dim % 2)
        return bad(c, m, ms, "head_dim", "head_dim %llu must be even for rotary embeddings",
                   ULL(ms->head_dim));
    if ((ms->pos == POS_ROPE2D || ms->pos == POS_LEARNED_ROPE2D) && ms->head_dim % 4)
        return bad(c, m, ms, "head_dim", "head_dim %llu must be a multiple of 4 for 2-D rotary",
                   ULL(ms->head_dim));
    return 0;
}

static int check_decoder(dctx *c, const mm_node *m, module_spec *ms)
{
    uint64_t L = ms->num_hidden_layers;
    if (layers_in_range(c, m, ms, &ms->sliding, "sliding_layers", L) ||
        layers_in_range(c, m, ms, &ms->dense, "dense_layers", L) ||
        layers_in_range(c, m, ms, &ms->cross, "cross_attention_layers", L))
        return -1;
    if (!ms->sliding_window && lset_first_from(&ms->sliding, 0) < L)
        return bad(c, m, ms, "sliding_window", "sliding-window layers need sliding_window > 0");
    if (ms->num_experts) {
        if (!ms->experts_per_tok || ms->experts_per_tok > ms->num_experts)
            return bad(c, m, ms, "num_experts_per_tok",
                       "top-k %llu must be between 1 and num_experts %llu",
                       ULL(ms->experts_per_tok), ULL(ms->num_experts));
        if (!ms->moe_intermediate_size)
            ms->moe_intermediate_size = ms->intermediate_size;
    } else if (ms->shared_expert_intermediate_size) {
        return bad(c, m, ms, "shared_expert_intermediate_size", "a shared expert needs num_experts");
    }
    if (ms->merge == MERGE_CROSS_ATTENTION && lset_first_from(&ms->cross, 0) >= L)
        return bad(c, m, ms, "cross_attention_layers",
                   "image_merge cross_attention needs cross_attention_layers");
    return 0;
}

static int check_vision(dctx *c, const mm_node *m, module_spec *ms)
{
    uint64_t L = ms->num_hidden_layers;
    if (layers_in_range(c, m, ms, &ms->full_attention, "fullatt_block_indexes", L) ||
        layers_in_range(c, m, ms, &ms->deepstack, "deepstack_visual_indexes", L) ||
        layers_in_range(c, m, ms, &ms->taps, "intermediate_layers_indices", L))
        return -1;
    img_kind k = ms->img.kind;
    if (k == IMG_FIXED || k == IMG_TILES || k == IMG_SPLIT || k == IMG_MLLAMA || k == IMG_ANYRES) {
        if (!ms->image_size)
            return bad(c, m, ms, "image_size", "required by this image processor (the tile or "
                       "image side in pixels)");
        if (ms->patch_size > ms->image_size) /* a strided conv floors: 384 / 14 -> 27 */
            return bad(c, m, ms, "patch_size", "patch_size %llu exceeds image_size %llu",
                       ULL(ms->patch_size), ULL(ms->image_size));
    }
    if (k == IMG_PIXTRAL && !ms->img.longest_edge && !ms->image_size)
        return bad(c, m, ms, "image_size", "the pixtral image processor needs image_size or "
                   "image_processor.longest_edge (the longest side in pixels)");
    if (k == IMG_PIXTRAL && (ms->img.longest_edge ? ms->img.longest_edge : ms->image_size) <
                                ms->patch_size)
        return bad(c, m, ms, "patch_size", "patch_size %llu exceeds the longest image side",
                   ULL(ms->patch_size));
    if (k == IMG_DYNAMIC) {
        if (!ms->temporal_patch_size || !ms->spatial_merge_size)
            return bad(c, m, ms, "spatial_merge_size",
                       "dynamic resolution needs temporal_patch_size and spatial_merge_size");
        uint64_t unit = ms->patch_size * ms->spatial_merge_size;
        if (ms->window_size && ms->window_size % unit)
            return bad(c, m, ms, "window_size",
                       "window_size %llu must be a multiple of patch_size x spatial_merge_size "
                       "(%llu)", ULL(ms->window_size), ULL(unit));
    }
    int64_t sel = ms->select_layer, Li = (int64_t)L;
    if (sel < -(Li + 1) || sel > Li)
        return bad(c, m, ms, "select_layer",
                   "%lld is not a hidden state of this tower (0..%llu or -1..-(layers+1))",
                   (long long)sel, ULL(L));
    return 0;
}

int spec_validate_module(dctx *c, const mm_node *m, module_spec *ms)
{
    if (ms->kind != MOD_CONNECTOR && check_heads(c, m, ms))
        return -1;
    if (ms->kind == MOD_DECODER && check_decoder(c, m, ms))
        return -1;
    if (ms->kind == MOD_VISION && check_vision(c, m, ms))
        return -1;
    if (ms->kind == MOD_CONNECTOR && !ms->intermediate_size)
        ms->intermediate_size = 0; /* = the output width, resolved by the program */
    if (ms->lora.enabled) {
        if (ms->trainable)
            return bad(c, m, ms, "lora",
                       "LoRA adapts a frozen base: set trainable: false (PEFT freezes the base "
                       "weights)");
        if (ms->lora.r > ms->hidden_size)
            return bad(c, m, ms, "lora", "r %llu exceeds hidden_size %llu", ULL(ms->lora.r),
                       ULL(ms->hidden_size));
    }
    if (ms->quant && ms->trainable)
        return bad(c, m, ms, "quantization",
                   "quantized base weights cannot be trained: set trainable: false (QLoRA)");
    return 0;
}
