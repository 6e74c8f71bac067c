/* spec_parts.c - the nested maps of a module (lora, quantization,
 * image_processor, the attention layer pattern) and the checks a module can
 * make on its own: geometry PyTorch would refuse at build time, and
 * combinations that cannot exist (top_k > experts, a pixel shuffle that does
 * not divide, a layer index past the depth ...). */
#include "spec_internal.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* ---- LoRA ------------------------------------------------------------------------- */

#define L(f) offsetof(lora_spec, f)
static const keydesc lora_keys[] = {
    {"r", K_UINT, L(r), 1, 65536, NULL, 0, 1, 0},
    {"alpha", K_FLOAT, L(alpha), 0, 1e9, NULL, 0, 0, 0},
    {"lora_alpha", K_FLOAT, L(alpha), 0, 1e9, NULL, 0, 0, 0},
    {"dropout", K_FLOAT, L(dropout), 0, 0.999, NULL, 0, 0, 0},
    {"lora_dropout", K_FLOAT, L(dropout), 0, 0.999, NULL, 0, 0, 0},
    {"target_modules", K_SPECIAL, 0, 0, 0, NULL, 0, 1, 0},
    {"autocast_adapter_dtype", K_BOOL, L(autocast_adapter_dtype), 0, 1, NULL, 0, 0, 0},
    {"modules_to_save", K_SPECIAL, 0, 0, 0, NULL, 0, 0, 0},
};
#undef L

struct target_name {
    const char *name;
    uint32_t bit;
    unsigned kinds;
};
#define V (1u << MOD_VISION)
#define C (1u << MOD_CONNECTOR)
#define D (1u << MOD_DECODER)
static const struct target_name target_names[] = {
    {"q_proj", LT_Q, V | D},     {"k_proj", LT_K, V | D},       {"v_proj", LT_V, V | D},
    {"o_proj", LT_O, D},         {"out_proj", LT_O, V},         {"proj", LT_O, V},
    {"qkv", LT_QKV, V | D},      {"gate_proj", LT_GATE, V | D}, {"up_proj", LT_UP, V | D},
    {"down_proj", LT_DOWN, V | D}, {"fc1", LT_FC1, V},          {"fc2", LT_FC2, V},
    {"linear", LT_MLP_ALL, C},
    {"experts", LT_EXPERTS, D},  {"router", LT_ROUTER, D},
    /* a decoder's fused qkv Linear as the models name it: Phi-3's qkv_proj,
     * Baichuan's W_pack, GLM's and Falcon's query_key_value, LitGPT's attn.qkv */
    {"qkv_proj", LT_QKV, D},     {"W_pack", LT_QKV, D},         {"query_key_value", LT_QKV, D},
    /* the output layer and the token embedding: PEFT wraps them as lora.Linear and
     * lora.Embedding (peft/tuners/lora/layer.py:910, :1150); never in all-linear */
    {"lm_head", LT_LM_HEAD, D},  {"embed_tokens", LT_EMBED, D},
};
#define NTARGETS (sizeof target_names / sizeof target_names[0])

/* "all-linear" as PEFT means it: every nn.Linear of the module but the output
 * layer (lm_head).  MoE experts are 3-D parameters and the router a custom
 * module in transformers 5, not Linear layers, but for the models PEFT converts
 * from their v4 layout (peft/utils/transformers_weight_conversion.py,
 * _resolve_string_target_modules) all-linear wraps them too (ParamWrapper). */
static uint32_t all_linear(const module_spec *ms)
{
    uint32_t all = 0;
    for (size_t i = 0; i < NTARGETS; i++)
        if (target_names[i].kinds & (1u << ms->kind))
            all |= target_names[i].bit;
    if (!ms->num_experts || !ms->lora_experts)
        all &= ~(uint32_t)(LT_EXPERTS | LT_ROUTER);
    /* one fused qkv Linear or three: PEFT finds only the Linears the model has */
    all &= ms->qkv_fused ? ~(uint32_t)(LT_Q | LT_K | LT_V) : ~(uint32_t)LT_QKV;
    if (ms->kind == MOD_VISION && ms->mlp == MLP_GATED)
        all &= ~(uint32_t)(LT_FC1 | LT_FC2);
    if (ms->kind == MOD_VISION && ms->mlp == MLP_FC)
        all &= ~(uint32_t)(LT_GATE | LT_UP | LT_DOWN);
    return all & ~(uint32_t)(LT_LM_HEAD | LT_EMBED);
}

/* every module PEFT can wrap by name: the Linears, the expert stacks, the
 * decoder's lm_head and embed_tokens */
static uint32_t nameable(const module_spec *ms)
{
    uint32_t have = all_linear(ms) | (ms->num_experts ? LT_EXPERTS | LT_ROUTER : 0);
    return ms->kind == MOD_DECODER ? have | LT_LM_HEAD | LT_EMBED : have;
}

/* the target named `name` among this module's Linears, NTARGETS if none */
static size_t target_index(const module_spec *ms, const char *name)
{
    uint32_t have = nameable(ms);
    for (size_t q = 0; q < NTARGETS; q++)
        if ((target_names[q].kinds & (1u << ms->kind)) && (target_names[q].bit & have) &&
            strcmp(name, target_names[q].name) == 0)
            return q;
    return NTARGETS;
}

/* A name that matches no Linear of the module (PEFT would wrap nothing): the
 * error names the module's Linears, so q_proj on a fused-qkv decoder says
 * which name to use instead of training nothing. */
static int no_such_linear(dctx *c, const mm_node *e, const module_spec *ms, const char *path)
{
    const char *cands[NTARGETS];
    char list[512] = "";
    size_t nc = 0, used = 0;
    uint32_t have = nameable(ms);
    for (size_t q = 0; q < NTARGETS; q++) {
        if (!(target_names[q].kinds & (1u << ms->kind)) || !(target_names[q].bit & have))
            continue;
        cands[nc++] = target_names[q].name;
        if (target_names[q].bit == LT_EMBED)
            continue; /* named below: an Embedding, not a Linear */
        int w = snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "",
                         target_names[q].name);
        if (w > 0 && (size_t)w < sizeof list - used)
            used += (size_t)w;
    }
    const char *sug = mm_suggest(e->str, cands, nc);
    return key_fail(c, e, path, "'%s' is not a linear layer of this %s module%s%s%s; its "
                    "Linears: %s%s", e->str, spec_kind_name(ms->kind),
                    sug ? " (did you mean '" : "", sug ? sug : "", sug ? "'?)" : "", list,
                    have & LT_EMBED ? "; its Embedding: embed_tokens" : "");
}

static int decode_targets(dctx *c, const mm_node *v, const module_spec *ms, uint32_t *out,
                          const char *path)
{
    if (v->type == MM_NODE_SCALAR && !v->is_null &&
        (!strcmp(v->str, "all-linear") || !strcmp(v->str, "all"))) {
        *out = all_linear(ms);
        return 0;
    }
    if (v->type != MM_NODE_SEQ || v->n == 0)
        return key_fail(c, v, path, "expected a non-empty list of module names or \"all-linear\"");
    uint32_t bits = 0;
    for (size_t i = 0; i < v->n; i++) {
        const mm_node *e = v->vals[i];
        if (e->type != MM_NODE_SCALAR || e->is_null)
            return key_fail(c, e, path, "expected a module name, got %s", key_type_name(e));
        size_t q = target_index(ms, e->str);
        if (q == NTARGETS)
            return no_such_linear(c, e, ms, path);
        bits |= target_names[q].bit;
    }
    *out = bits;
    return 0;
}

/* PEFT modules_to_save: whole modules that train as copies beside the frozen
 * originals (ModulesToSaveWrapper); the decoder's embed_tokens and lm_head */
static int decode_save(dctx *c, const mm_node *v, module_spec *ms, const char *path)
{
    static const char *const names[] = {"embed_tokens", "lm_head"};
    if (v->type != MM_NODE_SEQ)
        return key_fail(c, v, path, "expected a list of module names (embed_tokens, lm_head)");
    if (v->n && ms->kind != MOD_DECODER)
        return key_fail(c, v, path, "only the language model's embed_tokens and lm_head can "
                        "be saved as trainable copies");
    for (size_t i = 0; i < v->n; i++) {
        const mm_node *e = v->vals[i];
        if (e->type != MM_NODE_SCALAR || e->is_null)
            return key_fail(c, e, path, "expected a module name, got %s", key_type_name(e));
        if (!strcmp(e->str, names[0]))
            ms->lora.save_embed = 1;
        else if (!strcmp(e->str, names[1]))
            ms->lora.save_head = 1;
        else {
            const char *sug = mm_suggest(e->str, names, 2);
            return key_fail(c, e, path, "'%s' is not embed_tokens or lm_head%s%s%s", e->str,
                            sug ? " (did you mean '" : "", sug ? sug : "", sug ? "'?)" : "");
        }
    }
    return 0;
}

int spec_lora(dctx *c, const mm_node *v, module_spec *ms, const char *prefix)
{
    char lp[128], tp[160];
    key_path(lp, sizeof lp, prefix, "lora");
    lora_spec *l = &ms->lora;
    l->enabled = 1;
    l->dropout = 0.05;
    l->alpha = -1;
    l->autocast_adapter_dtype = 1;
    unsigned char seen[sizeof lora_keys / sizeof lora_keys[0]] = {0};
    size_t n = sizeof lora_keys / sizeof lora_keys[0];
    if (key_decode_map(c, v, lora_keys, n, l, lp, 0, NULL, seen) ||
        key_check_required(c, v, lora_keys, n, seen, lp, 0))
        return -1;
    if (decode_targets(c, mm_node_get(v, "target_modules"), ms, &l->targets,
                       key_path(tp, sizeof tp, lp, "target_modules")))
        return -1;
    const mm_node *ms_node = mm_node_get(v, "modules_to_save");
    if (ms_node && decode_save(c, ms_node, ms, key_path(tp, sizeof tp, lp, "modules_to_save")))
        return -1;
    /* a module in both lists is no adapter target: PEFT's _check_target_module_exists
     * returns _ExcludedModule for it (peft/tuners/tuners_utils.py:2359-2364, PEFT 0.21.2),
     * so the LoRA name would train nothing */
    if ((l->save_head && (l->targets & LT_LM_HEAD)) || (l->save_embed && (l->targets & LT_EMBED)))
        return key_fail(c, mm_node_get(v, "target_modules"),
                        key_path(tp, sizeof tp, lp, "target_modules"), "%s is in modules_to_save "
                        "too: PEFT then trains the module's full copy and puts no adapter on it "
                        "(modules_to_save wins); name it in one list only",
                        l->save_head && (l->targets & LT_LM_HEAD) ? "lm_head" : "embed_tokens");
    if (l->alpha < 0)
        l->alpha = (double)l->r; /* alpha only scales B's output: no bytes depend on it */
    return 0;
}

/* ---- quantized base weights --------------------------------------------------------- */

typedef struct quant_in {
    uint64_t bits, block;
    int type, dq;
} quant_in;
static const char *const qtype_names[] = {"nf4", "fp4", "int8", NULL};
#define Q(f) offsetof(quant_in, f)
static const keydesc quant_keys[] = {
    {"bits", K_UINT, Q(bits), 4, 8, NULL, 0, 1, 0},
    {"quant_type", K_ENUM, Q(type), 0, 0, qtype_names, 0, 0, 0},
    {"double_quant", K_BOOL, Q(dq), 0, 1, NULL, 0, 0, 0},
    {"block_size", K_UINT, Q(block), 16, 4096, NULL, 0, 0, 0},
};
#undef Q

int spec_quantization(dctx *c, const mm_node *v, module_spec *ms, const char *prefix)
{
    char qp[128];
    key_path(qp, sizeof qp, prefix, "quantization");
    quant_in q = {.bits = 4, .block = 64, .type = 0, .dq = 0};
    size_t n = sizeof quant_keys / sizeof quant_keys[0];
    unsigned char seen[sizeof quant_keys / sizeof quant_keys[0]] = {0};
    if (key_decode_map(c, v, quant_keys, n, &q, qp, 0, NULL, seen) ||
        key_check_required(c, v, quant_keys, n, seen, qp, 0))
        return -1;
    if (q.bits != 4 && q.bits != 8)
        return key_fail(c, mm_node_get(v, "bits"), qp, "bits must be 4 or 8 (bitsandbytes)");
    if (q.bits == 8 && q.type != 2 && mm_node_get(v, "quant_type"))
        return key_fail(c, mm_node_get(v, "quant_type"), qp, "8-bit quantization is int8");
    if (q.bits == 4 && q.type == 2)
        return key_fail(c, mm_node_get(v, "quant_type"), qp, "4-bit quantization is nf4 or fp4");
    ms->quant = q.bits == 8 ? QUANT_INT8 : q.type == 1 ? QUANT_FP4 : QUANT_NF4;
    ms->double_quant = q.dq;
    ms->quant_block = q.block;
    return 0;
}

/* ---- the image processor ------------------------------------------------------------ */

static const char *const img_names[] = {"fixed", "dynamic", "tiles", "anyres", "mllama", "split",
                                        "pixtral", NULL};
#define I(f) offsetof(image_proc, f)
static const keydesc img_keys[] = {
    {"kind", K_ENUM, I(kind), 0, 0, img_names, 0, 0, 0},
    {"min_pixels", K_UINT, I(min_pixels), 1, 1ull << 40, NULL, 0, 0, 0},
    {"max_pixels", K_UINT, I(max_pixels), 1, 1ull << 40, NULL, 0, 0, 0},
    {"min_tiles", K_UINT, I(min_tiles), 1, 256, NULL, 0, 0, 0},
    {"max_tiles", K_UINT, I(max_tiles), 1, 256, NULL, 0, 0, 0},
    {"use_thumbnail", K_BOOL, I(thumbnail), 0, 1, NULL, 0, 0, 0},
    {"longest_edge", K_UINT, I(longest_edge), 1, 1 << 20, NULL, 0, 0, 0},
    {"image_grid_pinpoints", K_SPECIAL, 0, 0, 0, NULL, 0, 0, 0},
    {"image_newline", K_BOOL, I(newline), 0, 1, NULL, 0, 0, 0},
};
#undef I

static int decode_pinpoints(dctx *c, const mm_node *v, image_proc *ip, const char *path)
{
    if (v->type != MM_NODE_SEQ || v->n == 0 || v->n > 64)
        return key_fail(c, v, path, "expected a list of 1 to 64 [height, width] pairs");
    for (size_t i = 0; i < v->n; i++) {
        const mm_node *p = v->vals[i];
        if (p->type != MM_NODE_SEQ || p->n != 2)
            return key_fail(c, p, path, "expected [height, width]");
        for (int k = 0; k < 2; k++) {
            const mm_node *e = p->vals[k];
            uint64_t u;
            if (e->type != MM_NODE_SCALAR || e->quoted || e->is_null || key_parse_u64(e->str, &u) ||
                u < 1 || u > 65536)
                return key_fail(c, e, path, "expected a size in pixels (1..65536)");
            ip->pinpoints[i][k] = u;
        }
    }
    ip->n_pinpoints = v->n;
    return 0;
}

int spec_image_processor(dctx *c, const mm_node *v, module_spec *ms, const char *prefix)
{
    char ip[128], pp[160];
    key_path(ip, sizeof ip, prefix, "image_processor");
    size_t n = sizeof img_keys / sizeof img_keys[0];
    if (key_decode_map(c, v, img_keys, n, &ms->img, ip, 0, NULL, NULL))
        return -1;
    const mm_node *p = mm_node_get(v, "image_grid_pinpoints");
    if (p && decode_pinpoints(c, p, &ms->img, key_path(pp, sizeof pp, ip, "image_grid_pinpoints")))
        return -1;
    const image_proc *I = &ms->img;
    if (I->min_pixels && I->max_pixels && I->min_pixels > I->max_pixels)
        return key_fail(c, v, ip, "min_pixels %llu exceeds max_pixels %llu",
                        (unsigned long long)I->min_pixels, (unsigned long long)I->max_pixels);
    if (I->min_tiles && I->max_tiles && I->min_tiles > I->max_tiles)
        return key_fail(c, v, ip, "min_tiles exceeds max_tiles");
    if (I->kind == IMG_ANYRES && !I->n_pinpoints)
        return key_fail(c, v, ip, "anyres needs image_grid_pinpoints");
    return 0;
}

/* ---- which layers use sliding-window attention ----------------------------------------- */

/* sliding_window_pattern: N (Gemma 2/3): layer i is global when (i + 1) % N == 0 */
int spec_sliding_pattern(dctx *c, const mm_node *v, module_spec *ms, const char *prefix)
{
    char path[160];
    uint64_t n = 0;
    static const keydesc pk = {"sliding_window_pattern", K_UINT, 0, 1, MM_MAX_LAYERS, NULL, 0, 0, 0};
    if (key_decode_scalar(c, &pk, v, &n, key_path(path, sizeof path, prefix,
                                                   "sliding_window_pattern")))
        return -1;
    memset(&ms->sliding, 0, sizeof ms->sliding);
    for (uint64_t i = 0; i < ms->num_hidden_layers; i++)
        if ((i + 1) % n != 0)
            lset_add(&ms->sliding, i);
    return 0;
}
