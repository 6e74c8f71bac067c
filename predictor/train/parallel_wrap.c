/* parallel_wrap.c - train layer: which modules FSDP1's size-based auto-wrap
 * (fsdp.wrap_policy size, fsdp.min_num_params) makes units of, for a text
 * decoder, from the rows' parameter counts.  Below parallel_unit.c (which asks
 * it for a layer's unit) and parallel_fsdp.c (the outer units).
 *
 * torch 2.13 distributed/fsdp/wrap.py:
 *   size_based_auto_wrap_policy (:341-397): recurse into a module when its
 *   nonwrapped numel >= min_num_params and it is not a FORCE_LEAF_MODULES
 *   (nn.MultiheadAttention: no HF decoder has one); wrap it when the remainder
 *   >= min_num_params and it is not an EXCLUDE_WRAP_MODULES (nn.ModuleList,
 *   nn.ModuleDict).
 *   _recursive_wrap (:488-563): counts every parameter of the subtree (:532-535),
 *   asks recurse=True first (:538), wraps the children first (:541-555), then the
 *   remainder, subtree minus what its children wrapped (:557), is asked
 *   recurse=False (:558-562).  FSDP1's constructor runs it from the root with
 *   only_wrap_children (_wrap_utils.py:76-102): the root is the root unit.
 * The HF module tree of a *ForCausalLM (modeling_llama.py and its copies):
 * root { model { embed_tokens, layers (ModuleList), norm, rotary_emb }, lm_head };
 * under PEFT, PeftModel { LoraModel { *ForCausalLM ... } } and each LoRA Linear
 * is { base_layer, lora_A (ModuleDict), lora_B, lora_dropout } (peft tuners/lora/
 * layer.py LoraLayer.update_layer).  The rows name a layer's modules by their
 * path in the layer ("layers.self_attn.q_proj", ".lora_A" under it), so the
 * layer's subtree is rebuilt from the names. */
#include "parallel.h"
#include "util.h"

#include <string.h>

typedef struct witem {
    const char *name;                  /* the path below the subtree walked */
    uint64_t p, t;                     /* parameters of one instance, trainable ones */
} witem;

typedef struct wsum {
    uint64_t total, wrapped, wrapped_tr; /* the subtree; what became units in it */
    uint64_t total_tr;
    int self, base;                    /* the module itself is a unit; its base_layer is */
    uint64_t unit_tr;                  /* the trainable parameters that unit holds */
} wsum;

enum { W_MAX = 256 };              /* rows of a layer, at most */

static int under(const char *name, const char *pre, size_t n)
{
    return !n || (!strncmp(name, pre, n) && (name[n] == 0 || name[n] == '.'));
}

/* the child component of `name` below prefix (length n): its end in name */
static size_t child_end(const char *name, size_t n)
{
    size_t b = n ? n + 1 : 0;
    const char *d = strchr(name + b, '.');
    return d ? (size_t)(d - name) : strlen(name);
}

/* _recursive_wrap over the items under `pre` (length n); excluded: a ModuleList
 * or ModuleDict (EXCLUDE_WRAP_MODULES), recursed into but never a unit */
static wsum wrap_rec(const witem *it, size_t ni, const char *pre, size_t n, uint64_t min,
                     int excluded, int depth)
{
    wsum r = {0, 0, 0, 0, 0, 0, 0};
    uint64_t own = 0, own_tr = 0, sub = 0, sub_tr = 0;
    int lora = 0;
    for (size_t i = 0; i < ni; i++)
        if (under(it[i].name, pre, n)) {
            r.total += it[i].p;
            r.total_tr += it[i].t;
            if (it[i].name[n] == 0 && n) {
                own += it[i].p;
                own_tr += it[i].t;
            }
        }
    if (r.total < min || depth > 16) /* :538, recurse=False: not large enough */
        return r;
    for (size_t i = 0; i < ni; i++) {
        if (!under(it[i].name, pre, n) || (n && it[i].name[n] == 0))
            continue;
        size_t e = child_end(it[i].name, n), j;
        for (j = 0; j < i; j++) /* each child once */
            if (under(it[j].name, pre, n) && child_end(it[j].name, n) == e &&
                !strncmp(it[j].name, it[i].name, e))
                break;
        if (j < i)
            continue;
        char cp[MM_MAX_NAME * 2];
        if (e >= sizeof cp)
            continue;
        memcpy(cp, it[i].name, e);
        cp[e] = 0;
        lora |= !strncmp(cp + (n ? n + 1 : 0), "lora_", 5);
        wsum c = wrap_rec(it, ni, cp, e, min, !strncmp(cp + (n ? n + 1 : 0), "lora_", 5), depth + 1);
        sub += c.wrapped;
        sub_tr += c.wrapped_tr;
    }
    /* a LoRA Linear's own weight is its base_layer child, a leaf */
    if (lora && own >= min) {
        sub += own;
        sub_tr += own_tr;
        r.base = 1;
        r.unit_tr = own_tr;
    }
    r.wrapped = sub;
    r.wrapped_tr = sub_tr;
    if (!excluded && r.total - sub >= min) { /* :557-562 */
        r.unit_tr = r.total_tr - sub_tr;
        r.wrapped = r.total;
        r.wrapped_tr = r.total_tr;
        r.self = 1;
    }
    return r;
}

static int in_layers(const sim_row *R)
{
    return !strncmp(R->name, "layers.", 7);
}

/* one instance's trainable parameters of row R in layer l */
static uint64_t inst_tr(const sim_row *R, uint64_t l)
{
    return l < R->trainable_count && R->trainable_count ? R->trainable / R->trainable_count : 0;
}

/* layer l's items (the names below "layers."); returns their count.  An
 * "experts" row is a parameter of its module, not a module (transformers 5's
 * fused experts: MixtralExperts.gate_up_proj / down_proj, 3-D Parameters): it
 * counts as its module's own (names holds the shortened copies). */
static size_t layer_items(const par_state *ps, uint64_t l, witem *it,
                          char (*names)[MM_MAX_NAME])
{
    const sim *s = ps->c->s;
    size_t n = 0;
    for (size_t r = 0; r < s->nrows && n < W_MAX; r++) {
        const sim_row *R = &s->rows[r];
        if (R->module != ps->llm || !R->params || !R->count || !in_layers(R) || l >= R->count)
            continue;
        const char *nm = R->name + 7, *dot = strrchr(nm, '.');
        if (!strcmp(R->kind, "experts") && dot) {
            size_t k = (size_t)(dot - nm);
            memcpy(names[n], nm, k);
            names[n][k] = 0;
            nm = names[n];
        }
        it[n] = (witem){nm, R->params / R->count, inst_tr(R, l)};
        n++;
    }
    return n;
}

static uint64_t n_layers(const par_state *ps)
{
    const resolved_module *m = &ps->rm->modules[ps->llm];
    uint64_t n = m->layers;
    return n < MM_MAX_LAYERS ? n : MM_MAX_LAYERS;
}

/* the parameters of layer l that units hold (the layer's own, or units inside
 * it: the parameters they do not hold are their parents'); trainable: those
 * that train.  0 when the ModuleList is not walked (its subtree below min). */
uint64_t wrap_layer(const par_state *ps, uint64_t l, int trainable)
{
    witem it[W_MAX];
    char names[W_MAX][MM_MAX_NAME];
    if (!ps->layers_walked || l >= n_layers(ps))
        return 0;
    wsum w = wrap_rec(it, layer_items(ps, l, it, names), "", 0, ps->rm->fsdp.min_num_params, 0, 0);
    return trainable ? w.wrapped_tr : w.wrapped;
}

/* Which unit of layer l holds layer row R's parameter: the deepest module on its
 * path that is a unit (the layer itself included), or its LoRA Linear's
 * base_layer.  Returns -1 for none (the parameter is its parent's, the base
 * model's or the root's: its gradient waits for that unit's post-backward,
 * parallel_fsdp.c drop_unit_grads), else the trainable parameters of that unit
 * (does its flat parameter require grad). */
int64_t wrap_row_unit(const par_state *ps, const sim_row *R, uint64_t l)
{
    witem it[W_MAX];
    char names[W_MAX][MM_MAX_NAME];
    if (!ps->layers_walked || !in_layers(R) || l >= n_layers(ps))
        return -1;
    size_t ni = layer_items(ps, l, it, names);
    uint64_t min = ps->rm->fsdp.min_num_params;
    const char *name = R->name + 7;
    size_t n = 0, len = strlen(name);
    int64_t unit = -1;
    for (;;) {
        size_t b = 0; /* the last component of name[0..n] */
        for (size_t k = 0; k < n; k++)
            if (name[k] == '.')
                b = k + 1;
        wsum w = wrap_rec(it, ni, name, n, min, n && !strncmp(name + b, "lora_", 5), 0);
        if (w.self)
            unit = (int64_t)w.unit_tr;
        if (n == len && w.base && !strcmp(R->kind, "linear"))
            unit = (int64_t)w.unit_tr; /* the base weight: its base_layer's unit */
        if (n == len || w.total < min) /* nothing below is a unit */
            return unit;
        n = child_end(name, n);
    }
}

/* a row outside the layers: its parameters, trainable ones */
static uint64_t outer(const par_state *ps, const char *name, int trainable)
{
    const sim *s = ps->c->s;
    uint64_t n = 0;
    for (size_t r = 0; r < s->nrows; r++) {
        const sim_row *R = &s->rows[r];
        if (R->module == ps->llm && !in_layers(R) && under(R->name, name, strlen(name)))
            n = sim_add(ps->c->s, n, trainable ? R->trainable : R->params);
    }
    return n;
}

/* The units outside the layers (fsdp_setup): embed_tokens and lm_head, leaves,
 * units when they hold min_num_params; the base model (`model`), when what its
 * children left reaches it; under PEFT the *ForCausalLM and LoraModel levels
 * above it are no root (PeftModel is): a remainder there that reaches min is
 * a unit too, counted with the root here (it reshards after forward, the root
 * does not: the prediction keeps it the longer). */
void wrap_plan(par_state *ps)
{
    sim *s = ps->c->s;
    uint64_t min = ps->rm->fsdp.min_num_params, all = 0, all_tr = 0, L = 0, Lw = 0, Lw_tr = 0;
    for (size_t r = 0; r < s->nrows; r++)
        if (s->rows[r].module == ps->llm) {
            all = sim_add(s, all, s->rows[r].params);
            all_tr = sim_add(s, all_tr, s->rows[r].trainable);
            if (in_layers(&s->rows[r]))
                L = sim_add(s, L, s->rows[r].params);
        }
    uint64_t head = outer(ps, "lm_head", 0), base = all - head;
    ps->w_emb = ps->w_emb_tr = ps->w_head = ps->w_head_tr = ps->w_base = ps->w_base_tr = 0;
    ps->layers_walked = 0;
    if (all < min) /* the root's own recurse=True question (:538) */
        return;
    if (head >= min) {
        ps->w_head = head;
        ps->w_head_tr = outer(ps, "lm_head", 1);
    }
    if (base < min)
        return;
    uint64_t emb = outer(ps, "embed_tokens", 0);
    if (emb >= min) {
        ps->w_emb = emb;
        ps->w_emb_tr = outer(ps, "embed_tokens", 1);
    }
    ps->layers_walked = L >= min;
    for (uint64_t l = 0; l < n_layers(ps); l++) {
        Lw = sim_add(s, Lw, wrap_layer(ps, l, 0));
        Lw_tr = sim_add(s, Lw_tr, wrap_layer(ps, l, 1));
    }
    /* norm and the other leaves of the base model: a leaf that large would be a
     * unit of its own; none of the decoders' is */
    uint64_t rest = base - ps->w_emb - Lw;
    if (rest >= min) {
        ps->w_base = rest;
        ps->w_base_tr = all_tr - outer(ps, "lm_head", 1) - ps->w_emb_tr - Lw_tr;
    }
}
