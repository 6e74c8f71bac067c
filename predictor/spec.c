/* spec.c - decode and validate a model spec from the document tree.
 * Every key is described once in a table (name, type, range, which module
 * types it applies to); unknown keys get a "did you mean" suggestion and every
 * error names file:line:col and the dotted key path.  No silent defaults for
 * required keys; documented defaults for the rest (README "Spec reference"). */
#include "spec.h"
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum { K_UINT, K_INT, K_INT32, K_BOOL, K_FLOAT, K_ENUM, K_STRING, K_SIZE, K_VERSION, K_TARGETS,
               K_NAME } kkind;

#define T_VIT (1u << MOD_VIT)
#define T_MLP (1u << MOD_MLP)
#define T_LLAMA (1u << MOD_LLAMA)
#define T_ALL (T_VIT | T_MLP | T_LLAMA)

typedef struct keydesc {
    const char *key;
    kkind kind;
    size_t off;
    double min, max;
    const char *const *enums;
    unsigned types; /* module types it applies to (module table only) */
    int required;   /* required for those types */
} keydesc;

static const char *const mod_types[] = {"vit", "mlp", "llama", NULL};
static const char *const attn_names[] = {"eager", "sdpa", "flash", NULL};
static const char *const act_names[] = {"gelu", "quick_gelu", "relu", "silu", NULL};
static const char *const prec_names[] = {"bf16", "fp16", "fp32", NULL};
static const char *const master_names[] = {"none", "fp32", NULL};
static const char *const opt_names[] = {"adamw", "adam", "sgd", "sgd_momentum", "adamw_8bit",
                                        "adafactor", NULL};
static const char *const impl_names[] = {"foreach", "fused", "for_loop", NULL};

#define M(f) offsetof(module_spec, f)
static const keydesc module_keys[] = {
    {"name", K_NAME, M(name), 0, 0, NULL, T_ALL, 1},
    {"type", K_ENUM, M(type), 0, 0, mod_types, T_ALL, 1},
    {"trainable", K_BOOL, M(trainable), 0, 1, NULL, T_ALL, 0},
    {"attention", K_ENUM, M(attention), 0, 0, attn_names, T_VIT | T_LLAMA, 0},
    {"hidden_size", K_UINT, M(hidden_size), 1, 1 << 17, NULL, T_ALL, 1},
    {"num_hidden_layers", K_UINT, M(num_hidden_layers), 1, MM_MAX_LAYERS, NULL,
     T_VIT | T_LLAMA, 1},
    {"num_attention_heads", K_UINT, M(num_attention_heads), 1, 4096, NULL, T_VIT | T_LLAMA, 1},
    {"num_key_value_heads", K_UINT, M(num_key_value_heads), 1, 4096, NULL, T_LLAMA, 0},
    {"head_dim", K_UINT, M(head_dim), 1, 4096, NULL, T_LLAMA, 0},
    {"intermediate_size", K_UINT, M(intermediate_size), 1, 1 << 20, NULL, T_VIT | T_LLAMA, 1},
    {"vocab_size", K_UINT, M(vocab_size), 1, 1 << 24, NULL, T_LLAMA, 1},
    {"tie_word_embeddings", K_BOOL, M(tie_word_embeddings), 0, 1, NULL, T_LLAMA, 0},
    {"hidden_act", K_ENUM, M(act), 0, 0, act_names, T_VIT | T_LLAMA, 0},
    {"activation", K_ENUM, M(act), 0, 0, act_names, T_MLP, 0},
    {"image_size", K_UINT, M(image_size), 1, 16384, NULL, T_VIT, 1},
    {"patch_size", K_UINT, M(patch_size), 1, 16384, NULL, T_VIT, 1},
    {"num_channels", K_UINT, M(num_channels), 1, 64, NULL, T_VIT, 0},
    {"select_layer", K_INT, M(select_layer), -(MM_MAX_LAYERS + 1), MM_MAX_LAYERS, NULL, T_VIT, 0},
    {"input_size", K_UINT, M(input_size), 1, 1 << 17, NULL, T_MLP, 1},
    {"num_layers", K_UINT, M(num_layers), 1, 64, NULL, T_MLP, 0},
    {"lora", K_STRING /* map, handled specially */, 0, 0, 0, NULL, T_ALL, 0},
};
#undef M

#define L(f) offsetof(lora_spec, f)
static const keydesc lora_keys[] = {
    {"r", K_UINT, L(r), 1, 65536, NULL, 0, 1},
    {"alpha", K_FLOAT, L(alpha), 0, 1e9, NULL, 0, 0},
    {"lora_alpha", K_FLOAT, L(alpha), 0, 1e9, NULL, 0, 0},
    {"dropout", K_FLOAT, L(dropout), 0, 0.999, NULL, 0, 0},
    {"lora_dropout", K_FLOAT, L(dropout), 0, 0.999, NULL, 0, 0},
    {"target_modules", K_TARGETS, L(targets), 0, 0, NULL, 0, 1},
};
#undef L

#define TR(f) offsetof(training_spec, f)
static const keydesc training_keys[] = {
    {"micro_batch_size", K_UINT, TR(micro_batch_size), 1, 1 << 16, NULL, 0, 1},
    {"seq_len", K_UINT, TR(seq_len), 1, 1 << 22, NULL, 0, 1},
    {"images_per_sample", K_UINT, TR(images_per_sample), 0, 64, NULL, 0, 0},
    {"precision", K_ENUM, TR(precision), 0, 0, prec_names, 0, 0},
    {"master_weights", K_ENUM, TR(master_weights), 0, 0, master_names, 0, 0},
    {"optimizer", K_ENUM, TR(optimizer), 0, 0, opt_names, 0, 0},
    {"optimizer_impl", K_ENUM, TR(impl), 0, 0, impl_names, 0, 0},
    {"zero_stage", K_INT32, TR(zero_stage), 0, 3, NULL, 0, 0},
    {"data_parallel", K_UINT, TR(data_parallel), 1, 1 << 20, NULL, 0, 0},
    {"gradient_accumulation_steps", K_UINT, TR(grad_accum), 1, 1 << 20, NULL, 0, 0},
    {"gradient_checkpointing", K_BOOL, TR(gradient_checkpointing), 0, 1, NULL, 0, 0},
    {"attention", K_ENUM, TR(attention), 0, 0, attn_names, 0, 0},
};
#undef TR

#define FW(f) offsetof(framework_spec, f)
static const keydesc framework_keys[] = {
    {"transformers_version", K_VERSION, FW(tf_major), 0, 0, NULL, 0, 0},
    {"torch_version", K_VERSION, FW(torch_major), 0, 0, NULL, 0, 0},
    {"deepspeed_version", K_VERSION, FW(ds_major), 0, 0, NULL, 0, 0},
};
#undef FW

#define DS(f) offsetof(deepspeed_spec, f)
static const keydesc deepspeed_keys[] = {
    {"reduce_bucket_size", K_UINT, DS(reduce_bucket_size), 0, 1e12, NULL, 0, 0},
    {"allgather_bucket_size", K_UINT, DS(allgather_bucket_size), 0, 1e12, NULL, 0, 0},
    {"overlap_comm", K_BOOL, DS(overlap_comm), 0, 1, NULL, 0, 0},
    {"stage3_prefetch_bucket_size", K_UINT, DS(prefetch_bucket_size), 0, 1e12, NULL, 0, 0},
    {"stage3_max_live_parameters", K_UINT, DS(max_live_parameters), 0, 1e12, NULL, 0, 0},
    {"stage3_param_persistence_threshold", K_UINT, DS(param_persistence_threshold), 0, 1e12,
     NULL, 0, 0},
};
#undef DS

#define DV(f) offsetof(device_spec, f)
static const keydesc device_keys[] = {
    {"cuda_context", K_SIZE, DV(cuda_context), 0, 0, NULL, 0, 0},
    {"nccl", K_SIZE, DV(nccl), 0, 0, NULL, 0, 0},
    {"allocator_fixed", K_SIZE, DV(allocator_fixed), 0, 0, NULL, 0, 0},
    {"allocator_fraction", K_FLOAT, DV(allocator_fraction), 0, 1, NULL, 0, 0},
    {"alloc_conf", K_STRING, DV(alloc_conf), 0, 0, NULL, 0, 0},
};
#undef DV

static const char *const top_keys[] = {"name", "modules", "training", "framework",
                                       "deepspeed", "device"};

/* ---- helpers ---------------------------------------------------------------- */

typedef struct dctx {
    const char *file;
    mm_error *err;
} dctx;

static int fail(dctx *c, const mm_node *at, const char *path, const char *fmt, ...)
    MM_PRINTF(4, 5);
static int fail(dctx *c, const mm_node *at, const char *path, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    mm_err_at(c->err, c->file, at ? at->line : 0, at ? at->col : 0, "%s: %s", path, what);
    return -1;
}

static int fail_key(dctx *c, const mm_node *map, size_t i, const char *path, const char *what)
{
    mm_err_at(c->err, c->file, map->key_line[i], map->key_col[i], "%s: %s", path, what);
    return -1;
}

static const char *type_name(const mm_node *n)
{
    return n->type == MM_NODE_MAP ? "a mapping" : n->type == MM_NODE_SEQ ? "a list" : "a scalar";
}

static int parse_u64_str(const char *s, uint64_t *out)
{
    if (!*s || !(isdigit((unsigned char)s[0])))
        return -1;
    int sci = strpbrk(s, "eE.") != NULL;
    if (!sci) {
        errno = 0;
        char *end;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || *end)
            return -1;
        *out = v;
        return 0;
    }
    /* 5e8 style (DeepSpeed configs): must be an exact integer below 2^53 */
    errno = 0;
    char *end;
    double d = strtod(s, &end);
    if (errno || *end || !isfinite(d) || d < 0 || d > 9007199254740992.0 || floor(d) != d)
        return -1;
    *out = (uint64_t)d;
    return 0;
}

static int decode_scalar(dctx *c, const keydesc *k, const mm_node *v, void *base,
                         const char *path)
{
    char *field = (char *)base + k->off;
    if (k->kind == K_TARGETS)
        return 0; /* handled by the caller, needs the module type */
    if (v->type != MM_NODE_SCALAR || v->is_null)
        return fail(c, v, path, "expected %s, got %s",
                    k->kind == K_BOOL ? "true or false" : k->kind == K_ENUM ? "a name" : "a value",
                    v->is_null ? "null" : type_name(v));
    const char *s = v->str;
    switch (k->kind) {
    case K_UINT:
    case K_INT:     /* int64_t field */
    case K_INT32: { /* int field */
        int neg = s[0] == '-';
        uint64_t u;
        if (v->quoted || parse_u64_str(neg ? s + 1 : s, &u))
            return fail(c, v, path, "expected an integer, got '%s'", s);
        if (neg && (k->kind == K_UINT || k->min >= 0 || (double)u > -k->min))
            goto range;
        if (!neg && (double)u > k->max)
            goto range;
        if (!neg && (double)u < k->min)
            goto range;
        if (k->kind == K_UINT)
            *(uint64_t *)(void *)field = u;
        else if (k->kind == K_INT32) /* the range check keeps it within int */
            *(int *)(void *)field = neg ? -(int)u : (int)u;
        else
            *(int64_t *)(void *)field = neg ? -(int64_t)u : (int64_t)u;
        return 0;
    range:
        return fail(c, v, path, "%s is out of range (%.0f..%.0f)", s, k->min, k->max);
    }
    case K_BOOL:
        if (!v->quoted && (!strcmp(s, "true") || !strcmp(s, "yes") || !strcmp(s, "True"))) {
            *(int *)(void *)field = 1;
            return 0;
        }
        if (!v->quoted && (!strcmp(s, "false") || !strcmp(s, "no") || !strcmp(s, "False"))) {
            *(int *)(void *)field = 0;
            return 0;
        }
        return fail(c, v, path, "expected true or false, got '%s'", s);
    case K_FLOAT: {
        errno = 0;
        char *end;
        double d = strtod(s, &end);
        if (v->quoted || !*s || *end || errno || !isfinite(d))
            return fail(c, v, path, "expected a number, got '%s'", s);
        if (d < k->min || d > k->max)
            return fail(c, v, path, "%s is out of range (%g..%g)", s, k->min, k->max);
        *(double *)(void *)field = d;
        return 0;
    }
    case K_ENUM: {
        for (int i = 0; k->enums[i]; i++) {
            if (strcmp(s, k->enums[i]) == 0) {
                *(int *)(void *)field = i;
                return 0;
            }
        }
        size_t n = 0;
        while (k->enums[n])
            n++;
        const char *sug = mm_suggest(s, k->enums, n);
        char list[256] = "";
        for (size_t i = 0; i < n; i++) {
            strncat(list, k->enums[i], sizeof list - strlen(list) - 1);
            if (i + 1 < n)
                strncat(list, " | ", sizeof list - strlen(list) - 1);
        }
        if (sug)
            return fail(c, v, path, "unknown value '%s' (did you mean '%s'? expected %s)", s, sug,
                        list);
        return fail(c, v, path, "unknown value '%s' (expected %s)", s, list);
    }
    case K_STRING:
    case K_NAME: {
        size_t cap = k->kind == K_NAME ? MM_MAX_NAME : 128;
        if (!*s)
            return fail(c, v, path, "must not be empty");
        if (strlen(s) >= cap)
            return fail(c, v, path, "longer than %zu characters", cap - 1);
        for (const char *p = s; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                return fail(c, v, path, "contains control characters");
        if (k->kind == K_NAME)
            for (const char *p = s; *p; p++)
                if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-')
                    return fail(c, v, path,
                                "'%s': module names use letters, digits, '_' and '-' only", s);
        mm_strlcpy(field, s, cap);
        return 0;
    }
    case K_SIZE: {
        uint64_t b;
        mm_error e2;
        if (mm_parse_size(s, &b, &e2))
            return fail(c, v, path, "%s", e2.msg);
        *(uint64_t *)(void *)field = b;
        /* has_* flag lives in the int just before each pair; set by caller */
        return 0;
    }
    case K_VERSION: {
        int a = 0, b = 0, p = 0;
        char tail;
        int n = sscanf(s, "%d.%d.%d%c", &a, &b, &p, &tail);
        if (n < 2 || n > 3 || a < 0 || b < 0 || p < 0 || a > 1000 || b > 1000)
            return fail(c, v, path, "expected a version like \"4.46\" or \"0.14.3\", got '%s'", s);
        int *f = (int *)(void *)field;
        f[0] = a;
        f[1] = b;
        if (k->off == offsetof(framework_spec, ds_major))
            f[2] = p;
        return 0;
    }
    default:
        return fail(c, v, path, "internal: unhandled key kind");
    }
}

/* Decode `map` against `keys`; `types` = module type bit (0 = not a module). */
static int decode_map(dctx *c, const mm_node *map, const keydesc *keys, size_t nkeys,
                      void *base, const char *prefix, unsigned types, unsigned char *seen)
{
    char path[256];
    if (map->type != MM_NODE_MAP) {
        snprintf(path, sizeof path, "%s", prefix);
        return fail(c, map, path, "expected a mapping, got %s", type_name(map));
    }
    for (size_t i = 0; i < map->n; i++) {
        const char *key = map->keys[i];
        snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", key);
        size_t j;
        for (j = 0; j < nkeys; j++)
            if (strcmp(keys[j].key, key) == 0)
                break;
        if (j == nkeys) {
            const char *cands[64];
            size_t nc = 0;
            for (size_t q = 0; q < nkeys && nc < 64; q++)
                if (!types || (keys[q].types & types))
                    cands[nc++] = keys[q].key;
            const char *sug = mm_suggest(key, cands, nc);
            char what[160];
            if (sug)
                snprintf(what, sizeof what, "unknown key (did you mean '%s'?)", sug);
            else
                snprintf(what, sizeof what, "unknown key");
            return fail_key(c, map, i, path, what);
        }
        if (types && !(keys[j].types & types)) {
            char what[160];
            snprintf(what, sizeof what, "does not apply to a %s module",
                     types == T_VIT ? "vit" : types == T_MLP ? "mlp" : "llama");
            return fail_key(c, map, i, path, what);
        }
        if (seen)
            seen[j] = 1;
        if (strcmp(key, "lora") == 0 || keys[j].kind == K_TARGETS)
            continue; /* decoded by the caller */
        if (decode_scalar(c, &keys[j], map->vals[i], base, path))
            return -1;
    }
    return 0;
}

static int check_required(dctx *c, const mm_node *map, const keydesc *keys, size_t nkeys,
                          const unsigned char *seen, const char *prefix, unsigned types)
{
    for (size_t j = 0; j < nkeys; j++) {
        if (!keys[j].required || seen[j] || (types && !(keys[j].types & types)))
            continue;
        /* aliases (alpha/lora_alpha) are never required, so no double-count */
        char path[256];
        snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", keys[j].key);
        return fail(c, map, path, "required key is missing");
    }
    return 0;
}

/* ---- LoRA targets ----------------------------------------------------------- */

struct target_name {
    const char *name;
    uint32_t bit;
    unsigned types;
};
static const struct target_name target_names[] = {
    {"q_proj", LT_Q, T_VIT | T_LLAMA},   {"k_proj", LT_K, T_VIT | T_LLAMA},
    {"v_proj", LT_V, T_VIT | T_LLAMA},   {"o_proj", LT_O, T_LLAMA},
    {"out_proj", LT_O, T_VIT},           {"gate_proj", LT_GATE, T_LLAMA},
    {"up_proj", LT_UP, T_LLAMA},         {"down_proj", LT_DOWN, T_LLAMA},
    {"fc1", LT_FC1, T_VIT},              {"fc2", LT_FC2, T_VIT},
    {"linear", LT_MLP_ALL, T_MLP},
};

static int decode_targets(dctx *c, const mm_node *v, unsigned type_bit, uint32_t *out,
                          const char *path)
{
    uint32_t all = 0;
    for (size_t i = 0; i < sizeof target_names / sizeof target_names[0]; i++)
        if (target_names[i].types & type_bit)
            all |= target_names[i].bit;
    if (v->type == MM_NODE_SCALAR && !v->is_null && strcmp(v->str, "all-linear") == 0) {
        *out = all;
        return 0;
    }
    if (v->type != MM_NODE_SEQ || v->n == 0)
        return fail(c, v, path, "expected a non-empty list of module names or \"all-linear\"");
    uint32_t bits = 0;
    for (size_t i = 0; i < v->n; i++) {
        const mm_node *e = v->vals[i];
        if (e->type != MM_NODE_SCALAR || e->is_null)
            return fail(c, e, path, "expected a module name, got %s", type_name(e));
        size_t q;
        const char *cands[16];
        size_t nc = 0;
        for (q = 0; q < sizeof target_names / sizeof target_names[0]; q++) {
            if (!(target_names[q].types & type_bit))
                continue;
            cands[nc++] = target_names[q].name;
            if (strcmp(e->str, target_names[q].name) == 0)
                break;
        }
        if (q == sizeof target_names / sizeof target_names[0]) {
            const char *sug = mm_suggest(e->str, cands, nc);
            if (sug)
                return fail(c, e, path, "'%s' is not a linear layer of this module (did you mean '%s'?)",
                            e->str, sug);
            return fail(c, e, path, "'%s' is not a linear layer of this module", e->str);
        }
        bits |= target_names[q].bit;
    }
    *out = bits;
    return 0;
}

/* ---- modules ---------------------------------------------------------------- */

static int decode_module(dctx *c, const mm_node *m, size_t idx, module_spec *ms)
{
    char prefix[96];
    snprintf(prefix, sizeof prefix, "modules[%zu]", idx);
    if (m->type != MM_NODE_MAP)
        return fail(c, m, prefix, "expected a mapping, got %s", type_name(m));
    memset(ms, 0, sizeof *ms);
    ms->line = m->line;
    ms->col = m->col;
    ms->trainable = 1;
    ms->attention = ATT_INHERIT;
    ms->select_layer = -2;
    ms->num_channels = 3;
    ms->num_layers = 2;
    ms->act = ACT_GELU;
    /* name and type first: they decide the key path and which keys apply */
    const mm_node *nm = mm_node_get(m, "name");
    const mm_node *ty = mm_node_get(m, "type");
    if (!nm)
        return fail(c, m, prefix, "required key 'name' is missing");
    char path[160];
    snprintf(path, sizeof path, "%s.name", prefix);
    if (decode_scalar(c, &module_keys[0], nm, ms, path))
        return -1;
    snprintf(prefix, sizeof prefix, "%s", ms->name);
    if (!ty)
        return fail(c, m, prefix, "required key 'type' is missing");
    snprintf(path, sizeof path, "%s.type", prefix);
    if (decode_scalar(c, &module_keys[1], ty, ms, path))
        return -1;
    if (ms->type == MOD_VIT)
        ms->act = ACT_QUICK_GELU; /* CLIP's MLP uses quick_gelu */
    if (ms->type == MOD_LLAMA)
        ms->act = ACT_SILU;
    unsigned tb = 1u << ms->type;
    unsigned char seen[sizeof module_keys / sizeof module_keys[0]] = {0};
    if (decode_map(c, m, module_keys, sizeof module_keys / sizeof module_keys[0], ms, prefix, tb,
                   seen))
        return -1;
    if (check_required(c, m, module_keys, sizeof module_keys / sizeof module_keys[0], seen, prefix,
                       tb))
        return -1;
    const mm_node *lora = mm_node_get(m, "lora");
    if (lora && !lora->is_null) {
        char lp[128];
        snprintf(lp, sizeof lp, "%s.lora", prefix);
        lora_spec *l = &ms->lora;
        l->enabled = 1;
        l->dropout = 0.05;
        l->alpha = -1;
        unsigned char lseen[sizeof lora_keys / sizeof lora_keys[0]] = {0};
        if (decode_map(c, lora, lora_keys, sizeof lora_keys / sizeof lora_keys[0], l, lp, 0,
                       lseen))
            return -1;
        if (check_required(c, lora, lora_keys, sizeof lora_keys / sizeof lora_keys[0], lseen, lp,
                           0))
            return -1;
        const mm_node *tm = mm_node_get(lora, "target_modules");
        char tp[160];
        snprintf(tp, sizeof tp, "%s.target_modules", lp);
        if (decode_targets(c, tm, tb, &l->targets, tp))
            return -1;
        if (l->alpha < 0)
            l->alpha = (double)l->r; /* alpha only scales B's output: no bytes depend on it */
    }
    /* defaults that depend on other keys */
    if (ms->type == MOD_LLAMA) {
        if (!ms->num_key_value_heads)
            ms->num_key_value_heads = ms->num_attention_heads;
    }
    return 0;
}

static const module_spec *find_type(const mm_spec *s, mod_type t)
{
    for (size_t i = 0; i < s->n_modules; i++)
        if (s->modules[i].type == t)
            return &s->modules[i];
    return NULL;
}

/* Cross-field checks: geometry that PyTorch would reject at model build time. */
static int validate_module(dctx *c, const mm_node *m, module_spec *ms)
{
    char path[160];
    const char *n = ms->name;
    if (ms->type == MOD_VIT || ms->type == MOD_LLAMA) {
        uint64_t heads = ms->num_attention_heads;
        if (ms->type == MOD_VIT || !ms->head_dim) {
            if (ms->hidden_size % heads) {
                snprintf(path, sizeof path, "%s.num_attention_heads", n);
                return fail(c, mm_node_get(m, "num_attention_heads"), path,
                            "%llu heads do not divide hidden_size %llu",
                            (unsigned long long)heads, (unsigned long long)ms->hidden_size);
            }
            ms->head_dim = ms->hidden_size / heads;
        }
        if (ms->type == MOD_LLAMA) {
            if (ms->num_key_value_heads > heads || heads % ms->num_key_value_heads) {
                snprintf(path, sizeof path, "%s.num_key_value_heads", n);
                return fail(c, mm_node_get(m, "num_key_value_heads"), path,
                            "%llu key/value heads must divide num_attention_heads %llu",
                            (unsigned long long)ms->num_key_value_heads,
                            (unsigned long long)heads);
            }
            if (ms->head_dim % 2) {
                snprintf(path, sizeof path, "%s.head_dim", n);
                return fail(c, m, path, "head_dim %llu must be even for rotary embeddings",
                            (unsigned long long)ms->head_dim);
            }
        }
    }
    if (ms->type == MOD_VIT) {
        if (ms->patch_size > ms->image_size || ms->image_size % ms->patch_size) {
            snprintf(path, sizeof path, "%s.patch_size", n);
            return fail(c, mm_node_get(m, "patch_size"), path,
                        "patch_size %llu must divide image_size %llu",
                        (unsigned long long)ms->patch_size, (unsigned long long)ms->image_size);
        }
        int64_t L = (int64_t)ms->num_hidden_layers;
        if (ms->select_layer < -(L + 1) || ms->select_layer > L || ms->select_layer == 0) {
            snprintf(path, sizeof path, "%s.select_layer", n);
            return fail(c, mm_node_get(m, "select_layer"), path,
                        "%lld is not a hidden state of a %lld-layer tower (1..%lld or -1..-%lld)",
                        (long long)ms->select_layer, (long long)L, (long long)L,
                        (long long)(L + 1));
        }
    }
    if (ms->lora.enabled) {
        snprintf(path, sizeof path, "%s.lora", n);
        if (ms->trainable)
            return fail(c, mm_node_get(m, "lora"), path,
                        "LoRA adapts a frozen base: set %s.trainable: false (PEFT freezes the "
                        "base weights)", n);
        if (ms->lora.r > ms->hidden_size)
            return fail(c, mm_node_get(m, "lora"), path, "r %llu exceeds hidden_size %llu",
                        (unsigned long long)ms->lora.r, (unsigned long long)ms->hidden_size);
    }
    return 0;
}

static int decode_all(dctx *c, mm_spec *s)
{
    const mm_node *root = s->doc;
    if (root->type != MM_NODE_MAP)
        return fail(c, root, "(top)", "a spec is a mapping with name, modules and training");
    for (size_t i = 0; i < root->n; i++) {
        size_t q, nt = sizeof top_keys / sizeof top_keys[0];
        for (q = 0; q < nt; q++)
            if (strcmp(root->keys[i], top_keys[q]) == 0)
                break;
        if (q == nt) {
            const char *sug = mm_suggest(root->keys[i], top_keys, nt);
            char what[128];
            snprintf(what, sizeof what, "unknown key%s%s%s", sug ? " (did you mean '" : "",
                     sug ? sug : "", sug ? "'?)" : "");
            return fail_key(c, root, i, root->keys[i], what);
        }
    }
    /* name */
    const mm_node *nm = mm_node_get(root, "name");
    if (!nm)
        return fail(c, root, "name", "required key is missing");
    static const keydesc name_key = {"name", K_STRING, offsetof(mm_spec, name), 0, 0, NULL, 0, 1};
    if (decode_scalar(c, &name_key, nm, s, "name"))
        return -1;
    /* modules */
    const mm_node *mods = mm_node_get(root, "modules");
    if (!mods)
        return fail(c, root, "modules", "required key is missing");
    if (mods->type != MM_NODE_SEQ || mods->n == 0)
        return fail(c, mods, "modules", "expected a non-empty list of modules");
    if (mods->n > MM_MAX_MODULES)
        return fail(c, mods, "modules", "%zu modules exceed the limit of %d", mods->n,
                    MM_MAX_MODULES);
    s->n_modules = mods->n;
    for (size_t i = 0; i < mods->n; i++) {
        if (decode_module(c, mods->vals[i], i, &s->modules[i]))
            return -1;
        for (size_t j = 0; j < i; j++)
            if (strcmp(s->modules[j].name, s->modules[i].name) == 0) {
                char path[96];
                snprintf(path, sizeof path, "%s.name", s->modules[i].name);
                return fail(c, mm_node_get(mods->vals[i], "name"), path,
                            "duplicate module name (also modules[%zu])", j);
            }
        if (!strcmp(s->modules[i].name, "training") || !strcmp(s->modules[i].name, "framework") ||
            !strcmp(s->modules[i].name, "deepspeed") || !strcmp(s->modules[i].name, "device") ||
            !strcmp(s->modules[i].name, "name") || !strcmp(s->modules[i].name, "modules")) {
            char path[96];
            snprintf(path, sizeof path, "modules[%zu].name", i);
            return fail(c, mm_node_get(mods->vals[i], "name"), path,
                        "'%s' is reserved (it names a top-level section)", s->modules[i].name);
        }
        if (validate_module(c, mods->vals[i], &s->modules[i]))
            return -1;
    }
    /* structure: [vit] [mlp] llama, in this order */
    int order[3] = {0, 0, 0};
    int last = -1;
    for (size_t i = 0; i < s->n_modules; i++) {
        int t = (int)s->modules[i].type;
        if (order[t] || t < last) {
            char path[96];
            snprintf(path, sizeof path, "%s.type", s->modules[i].name);
            return fail(c, mods->vals[i], path,
                        "a spec has at most one vit, one mlp and one llama module, in that order");
        }
        order[t] = 1;
        last = t;
    }
    const module_spec *llm = find_type(s, MOD_LLAMA), *vit = find_type(s, MOD_VIT),
                      *mlp = find_type(s, MOD_MLP);
    if (!llm)
        return fail(c, mods, "modules", "a llama (language model) module is required: it "
                                        "produces the logits and the loss");
    /* training */
    training_spec *t = &s->training;
    memset(t, 0, sizeof *t);
    t->images_per_sample = vit ? 1 : 0;
    t->data_parallel = 1;
    t->grad_accum = 1;
    t->attention = ATT_SDPA;
    const mm_node *tr = mm_node_get(root, "training");
    if (!tr)
        return fail(c, root, "training", "required key is missing");
    unsigned char tseen[sizeof training_keys / sizeof training_keys[0]] = {0};
    if (decode_map(c, tr, training_keys, sizeof training_keys / sizeof training_keys[0], t,
                   "training", 0, tseen))
        return -1;
    if (check_required(c, tr, training_keys, sizeof training_keys / sizeof training_keys[0], tseen,
                       "training", 0))
        return -1;
    if (t->zero_stage >= 1 && t->precision != PREC_FP32)
        t->master_weights = MASTER_FP32; /* DeepSpeed always keeps fp32 master weights */
    if (t->master_weights == MASTER_FP32 && t->precision == PREC_FP32) {
        const mm_node *mw = mm_node_get(tr, "master_weights");
        if (mw)
            return fail(c, mw, "training.master_weights",
                        "fp32 master weights need precision bf16 or fp16");
    }
    if (t->images_per_sample && !vit)
        return fail(c, mm_node_get(tr, "images_per_sample"), "training.images_per_sample",
                    "images need a vit module");
    /* geometry links between modules */
    uint64_t feat = 0;
    if (vit) {
        uint64_t g = vit->image_size / vit->patch_size;
        uint64_t img_tokens = g * g * t->images_per_sample;
        if (img_tokens > t->seq_len)
            return fail(c, mm_node_get(tr, "seq_len"), "training.seq_len",
                        "%llu is shorter than the %llu image tokens (%llu images x %llu patches)",
                        (unsigned long long)t->seq_len, (unsigned long long)img_tokens,
                        (unsigned long long)t->images_per_sample, (unsigned long long)(g * g));
        feat = vit->hidden_size;
    }
    if (mlp) {
        if (vit && mlp->input_size != feat) {
            char path[96];
            snprintf(path, sizeof path, "%s.input_size", mlp->name);
            return fail(c, mods, path, "%llu does not match %s.hidden_size %llu",
                        (unsigned long long)mlp->input_size, vit->name,
                        (unsigned long long)feat);
        }
        if (mlp->hidden_size != llm->hidden_size) {
            char path[96];
            snprintf(path, sizeof path, "%s.hidden_size", mlp->name);
            return fail(c, mods, path, "%llu does not match %s.hidden_size %llu",
                        (unsigned long long)mlp->hidden_size, llm->name,
                        (unsigned long long)llm->hidden_size);
        }
    } else if (vit && t->images_per_sample && feat != llm->hidden_size) {
        return fail(c, mods, "modules",
                    "without a projector (mlp) the vit hidden_size must equal the llama one");
    }
    /* framework */
    framework_spec *f = &s->framework;
    f->tf_major = 4;
    f->tf_minor = 46;
    f->torch_major = 2;
    f->torch_minor = 1;
    f->ds_major = 0;
    f->ds_minor = 14;
    f->ds_patch = 3;
    const mm_node *fw = mm_node_get(root, "framework");
    if (fw && decode_map(c, fw, framework_keys, sizeof framework_keys / sizeof framework_keys[0],
                         f, "framework", 0, NULL))
        return -1;
    /* deepspeed */
    deepspeed_spec *d = &s->deepspeed;
    memset(d, 0, sizeof *d);
    d->overlap_comm = 1;
    d->max_live_parameters = 1000000000ull;
    const mm_node *ds = mm_node_get(root, "deepspeed");
    if (ds && decode_map(c, ds, deepspeed_keys, sizeof deepspeed_keys / sizeof deepspeed_keys[0],
                         d, "deepspeed", 0, NULL))
        return -1;
    /* device overrides */
    device_spec *dv = &s->device;
    memset(dv, 0, sizeof *dv);
    const mm_node *dev = mm_node_get(root, "device");
    if (dev) {
        if (decode_map(c, dev, device_keys, sizeof device_keys / sizeof device_keys[0], dv,
                       "device", 0, NULL))
            return -1;
        dv->has_context = mm_node_get(dev, "cuda_context") != NULL;
        dv->has_nccl = mm_node_get(dev, "nccl") != NULL;
        dv->has_afix = mm_node_get(dev, "allocator_fixed") != NULL;
        dv->has_afrac = mm_node_get(dev, "allocator_fraction") != NULL;
        mm_alloc_conf ac;
        mm_error e2;
        mm_alloc_conf_default(&ac);
        if (dv->alloc_conf[0] && mm_alloc_conf_parse(&ac, dv->alloc_conf, &e2) < 0)
            return fail(c, mm_node_get(dev, "alloc_conf"), "device.alloc_conf", "%s", e2.msg);
    }
    return 0;
}

int mm_spec_decode(mm_spec *spec, mm_error *err)
{
    dctx c = {.file = spec->path[0] ? spec->path : "<spec>", .err = err};
    return decode_all(&c, spec);
}

size_t mm_dtype_bytes(precision_kind p)
{
    return p == PREC_FP32 ? 4 : 2;
}

/* ---- loading ----------------------------------------------------------------- */

mm_spec *mm_spec_load_buffer(const char *buf, size_t len, const char *name, mm_format fmt,
                             mm_error *err)
{
    if (!name)
        name = "<spec>";
    if (err)
        err->msg[0] = '\0';
    if (len > MM_MAX_SPEC_BYTES) {
        mm_err(err, "%s: spec is %zu bytes, larger than the %u-byte limit", name, len,
               MM_MAX_SPEC_BYTES);
        return NULL;
    }
    if (memchr(buf, '\0', len)) {
        mm_err(err, "%s: spec contains a NUL byte (binary file?)", name);
        return NULL;
    }
    if (fmt == MM_FMT_AUTO) {
        size_t nl = strlen(name);
        if (nl > 5 && strcmp(name + nl - 5, ".json") == 0)
            fmt = MM_FMT_JSON;
        else if ((nl > 5 && strcmp(name + nl - 5, ".yaml") == 0) ||
                 (nl > 4 && strcmp(name + nl - 4, ".yml") == 0))
            fmt = MM_FMT_YAML;
        else {
            size_t i = 0;
            while (i < len && isspace((unsigned char)buf[i]))
                i++;
            fmt = i < len && buf[i] == '{' ? MM_FMT_JSON : MM_FMT_YAML;
        }
    }
    mm_spec *s = calloc(1, sizeof *s);
    if (!s) {
        mm_err(err, "%s: out of memory", name);
        return NULL;
    }
    mm_strlcpy(s->path, name, sizeof s->path);
    mm_sha256_hex(buf, len, s->digest);
    s->json = fmt == MM_FMT_JSON;
    s->doc = s->json ? mm_json_parse(buf, len, name, err) : mm_yaml_parse(buf, len, name, err);
    if (!s->doc || mm_spec_decode(s, err)) {
        mm_spec_free(s);
        return NULL;
    }
    return s;
}

mm_spec *mm_spec_load_file(const char *path, mm_error *err)
{
    if (err)
        err->msg[0] = '\0';
    /* O_NONBLOCK: never hang on a FIFO; the regular-file check below refuses it */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        mm_err(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        mm_err(err, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        mm_err(err, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size > (off_t)MM_MAX_SPEC_BYTES) {
        mm_err(err, "%s: spec is %lld bytes, larger than the %u-byte limit", path,
               (long long)st.st_size, MM_MAX_SPEC_BYTES);
        close(fd);
        return NULL;
    }
    size_t cap = (size_t)st.st_size + 1, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        mm_err(err, "%s: out of memory", path);
        close(fd);
        return NULL;
    }
    for (;;) {
        if (len == cap) { /* file grew while reading: refuse beyond the limit */
            if (cap > MM_MAX_SPEC_BYTES) {
                mm_err(err, "%s: spec is larger than the %u-byte limit", path, MM_MAX_SPEC_BYTES);
                free(buf);
                close(fd);
                return NULL;
            }
            size_t ncap = cap * 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                mm_err(err, "%s: out of memory", path);
                free(buf);
                close(fd);
                return NULL;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            mm_err(err, "%s: read error: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return NULL;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    mm_spec *s = mm_spec_load_buffer(buf, len, path, MM_FMT_AUTO, err);
    free(buf);
    return s;
}

void mm_spec_free(mm_spec *spec)
{
    if (!spec)
        return;
    mm_node_free(spec->doc);
    free(spec);
}

mm_spec *mm_spec_clone(const mm_spec *spec)
{
    mm_spec *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    memcpy(c, spec, sizeof *c);
    c->doc = mm_node_clone(spec->doc);
    if (!c->doc) {
        free(c);
        return NULL;
    }
    return c;
}

mm_spec *mm_spec_copy_decoded(const mm_spec *spec)
{
    mm_spec *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    memcpy(c, spec, sizeof *c);
    c->doc = NULL;
    return c;
}

/* ---- --set ---------------------------------------------------------------------- */

static void clear_positions(mm_node *n)
{
    n->line = n->col = 0;
    for (size_t i = 0; i < n->n; i++) {
        if (n->type == MM_NODE_MAP)
            n->key_line[i] = n->key_col[i] = 0;
        clear_positions(n->vals[i]);
    }
}

int mm_spec_set(mm_spec *spec, const char *assignment, mm_error *err)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) {
        mm_err(err, "--set %s: expected KEY=VALUE (e.g. training.micro_batch_size=8)", assignment);
        return -1;
    }
    char key[256];
    size_t kl = (size_t)(eq - assignment);
    if (kl >= sizeof key) {
        mm_err(err, "--set: key too long");
        return -1;
    }
    memcpy(key, assignment, kl);
    key[kl] = '\0';
    const char *value = eq + 1;
    if (!*value) {
        mm_err(err, "--set %s: empty value", assignment);
        return -1;
    }
    /* the value is YAML flow: 8, true, bf16, [q_proj, v_proj], {r: 8, ...} */
    mm_error verr;
    mm_node *val = mm_yaml_parse(value, strlen(value), "--set", &verr);
    if (!val) {
        mm_err(err, "--set %s: %s", assignment, verr.msg);
        return -1;
    }
    clear_positions(val);
    mm_node *doc = mm_node_clone(spec->doc);
    if (!doc) {
        mm_node_free(val);
        mm_err(err, "out of memory");
        return -1;
    }
    /* walk: first component is a section, "name", or a module name */
    char *save = NULL;
    char *first = strtok_r(key, ".", &save);
    mm_node *cur = NULL;
    char *leaf = NULL;
    if (!first) {
        mm_err(err, "--set %s: empty key", assignment);
        goto fail;
    }
    if (strcmp(first, "name") == 0) {
        cur = doc;
        leaf = first;
    } else if (!strcmp(first, "training") || !strcmp(first, "framework") ||
               !strcmp(first, "deepspeed") || !strcmp(first, "device")) {
        cur = mm_node_get(doc, first);
        if (!cur) {
            cur = mm_node_new(MM_NODE_MAP, 0, 0);
            if (!cur || mm_node_map_put(doc, first, cur, 0, 0)) {
                mm_node_free(cur);
                mm_err(err, "out of memory");
                goto fail;
            }
        }
    } else {
        mm_node *mods = mm_node_get(doc, "modules");
        for (size_t i = 0; mods && mods->type == MM_NODE_SEQ && i < mods->n; i++) {
            mm_node *nm = mm_node_get(mods->vals[i], "name");
            if (nm && nm->type == MM_NODE_SCALAR && nm->str && strcmp(nm->str, first) == 0)
                cur = mods->vals[i];
        }
        if (!cur) {
            const char *cands[MM_MAX_MODULES + 5] = {"training", "framework", "deepspeed",
                                                      "device", "name"};
            size_t nc = 5;
            for (size_t i = 0; i < spec->n_modules; i++)
                cands[nc++] = spec->modules[i].name;
            const char *sug = mm_suggest(first, cands, nc);
            mm_err(err, "--set %s: '%s' is neither a section nor a module name%s%s%s", assignment,
                   first, sug ? " (did you mean '" : "", sug ? sug : "", sug ? "'?)" : "");
            goto fail;
        }
    }
    if (!leaf) {
        char *part = strtok_r(NULL, ".", &save);
        if (!part) {
            mm_err(err, "--set %s: name a key inside '%s'", assignment, first);
            goto fail;
        }
        for (;;) {
            char *next = strtok_r(NULL, ".", &save);
            if (!next) {
                leaf = part;
                break;
            }
            mm_node *sub = mm_node_get(cur, part);
            if (!sub) {
                sub = mm_node_new(MM_NODE_MAP, 0, 0);
                if (!sub || mm_node_map_put(cur, part, sub, 0, 0)) {
                    mm_node_free(sub);
                    mm_err(err, "out of memory");
                    goto fail;
                }
            }
            if (sub->type != MM_NODE_MAP) {
                mm_err(err, "--set %s: '%s' is not a mapping", assignment, part);
                goto fail;
            }
            cur = sub;
            part = next;
        }
    }
    if (cur->type != MM_NODE_MAP) {
        mm_err(err, "--set %s: '%s' is not a mapping", assignment, first);
        goto fail;
    }
    if (mm_node_map_put(cur, leaf, val, 0, 0)) {
        mm_err(err, "out of memory");
        goto fail;
    }
    val = NULL;
    mm_spec *tmp = malloc(sizeof *tmp);
    if (!tmp) {
        mm_err(err, "out of memory");
        goto fail;
    }
    memcpy(tmp, spec, sizeof *tmp);
    tmp->doc = doc;
    mm_error derr;
    if (mm_spec_decode(tmp, &derr)) {
        mm_err(err, "--set %s: %s", assignment, derr.msg);
        free(tmp);
        goto fail;
    }
    mm_node_free(spec->doc);
    memcpy(spec, tmp, sizeof *spec);
    free(tmp);
    return 0;
fail:
    mm_node_free(val);
    mm_node_free(doc);
    return -1;
}

/* ---- accessors ---------------------------------------------------------------------- */

const char *mm_spec_name(const mm_spec *s) { return s->name; }
const char *mm_spec_path(const mm_spec *s) { return s->path; }
const char *mm_spec_digest(const mm_spec *s) { return s->digest; }
uint32_t mm_spec_data_parallel(const mm_spec *s) { return (uint32_t)s->training.data_parallel; }
uint32_t mm_spec_micro_batch(const mm_spec *s) { return (uint32_t)s->training.micro_batch_size; }
int mm_spec_zero_stage(const mm_spec *s) { return s->training.zero_stage; }
int mm_spec_checkpointing(const mm_spec *s) { return s->training.gradient_checkpointing; }
