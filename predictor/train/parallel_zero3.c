/* parallel_zero3.c - DeepSpeed ZeRO stage 3's gathered parameters
 * (DeepSpeed 0.19.8 runtime/zero/partitioned_param_coordinator.py,
 * parameter_offload.py, stage3.py; docs/parallel.md).
 *
 * Every module's parameters are fetched (all-gathered, whole, in the model
 * dtype) at its pre-forward and released after it unless they are used again
 * within stage3_max_reuse_distance elements of fetches (the coordinator's
 * __params_to_release): with the default 1e9 a layer stays gathered from its
 * forward into its backward when the fetches in between - the later layers'
 * forward and backward, and their recomputation with checkpointing - stay
 * under it.  A module backward never reaches is released after its forward
 * (its next use is beyond the step's trace).  Parameters of at most
 * stage3_param_persistence_threshold elements are never partitioned
 * (parameter_offload.py mark_persistent_parameters): a full copy beside the
 * partition.  We gather per wrapped layer (the layer loop's boundaries) and
 * the rest of the model (embeddings, head, connector) for the whole step. */
#include "parallel.h"
#include "util.h"

#include <string.h>

/* stage3_param_persistence_threshold, 0 ("auto") = transformers' 10 x hidden */
uint64_t zero3_threshold(const par_state *ps)
{
    uint64_t t = ps->rm->deepspeed.param_persistence_threshold;
    return t ? t : 10 * resolved_decoder_hidden(ps->rm);
}

/* persistent parameters of one instance of a row */
static int persistent_row(const par_state *ps, const sim_row *R)
{
    uint32_t n = R->count ? R->count : 1;
    return R->params && R->params / n <= zero3_threshold(ps);
}

/* the parameters of layer (m, l) a fetch all-gathers: the unit less its
 * persistent ones (rows of that module's layers below the threshold) */
static uint64_t fetched(par_state *ps, uint32_t m, uint64_t l)
{
    const sim *s = ps->c->s;
    uint64_t n = par_unit_params(ps, m, l);
    if (m >= MM_MAX_MODULES || !ps->z_pers_ok[m]) {
        uint64_t pers = 0;
        for (size_t r = 0; r < s->nrows; r++) {
            const sim_row *R = &s->rows[r];
            if (R->module == m && R->count > 1 && persistent_row(ps, R))
                pers += R->params / R->count;
        }
        if (m >= MM_MAX_MODULES)
            return n > pers ? n - pers : 0;
        ps->z_pers[m] = pers;
        ps->z_pers_ok[m] = 1;
    }
    return n > ps->z_pers[m] ? n - ps->z_pers[m] : 0;
}

/* The decoder's head (final norm, lm_head): fetched after the layers and
 * again first in backward */
static uint64_t head_params(par_state *ps)
{
    const sim *s = ps->c->s;
    uint64_t n = 0;
    if (ps->z_head_ok)
        return ps->z_head;
    for (size_t r = 0; r < s->nrows; r++) {
        const sim_row *R = &s->rows[r];
        if (ps->rm->modules[R->module].role == MOD_DECODER &&
            (!strcmp(R->name, "norm") || !strcmp(R->name, "lm_head")))
            n += R->params;
    }
    ps->z_head = n;
    ps->z_head_ok = 1;
    return n;
}

/* elements fetched between layer l's forward and its next use (the
 * backward; with checkpointing the recompute before it): the later layers
 * twice (forward, backward), three times when they are recomputed, and the
 * head twice */
static uint64_t reuse_distance(par_state *ps, uint32_t m, uint64_t l)
{
    const resolved_model *rm = ps->rm;
    uint64_t after = 0;
    if (ps->z_rd_ok && ps->z_rd_m == m) {
        /* the last answer in this module, moved to l one unit at a time (the
         * loop asks layer after layer): the same sum as counting them all */
        uint64_t n = rm->modules[m].layers;
        after = ps->z_rd_after;
        for (uint64_t k = ps->z_rd_l; k < l; k++)
            after -= k + 1 < n && k + 1 < MM_MAX_LAYERS ? par_unit_params(ps, m, k + 1) : 0;
        for (uint64_t k = ps->z_rd_l; k > l; k--)
            after += k < n && k < MM_MAX_LAYERS ? par_unit_params(ps, m, k) : 0;
    } else {
        for (uint32_t mi = m; mi < rm->n_modules; mi++) {
            uint64_t n = rm->modules[mi].layers;
            for (uint64_t k = mi == m ? l + 1 : 0; k < n && k < MM_MAX_LAYERS; k++)
                after += par_unit_params(ps, mi, k);
        }
    }
    ps->z_rd_ok = 1;
    ps->z_rd_m = m;
    ps->z_rd_l = l;
    ps->z_rd_after = after;
    return after * (rm->training.ckpt.enabled ? 3 : 2) + 2 * head_params(ps);
}

static int32_t fetch(par_state *ps, uint64_t params)
{
    sim *s = ps->c->s;
    if (!params)
        return -1;
    sim_label(s, "zero-3 fetch", ps->r_gather);
    int32_t id = sim_alloc(s, ps->r_gather, sim_mul(s, params, ps->c->dt), F_PARAM, SIM_FIXED);
    if (id >= 0 && ps->nzg < sizeof ps->zg / sizeof ps->zg[0])
        ps->zg[ps->nzg++] = id;
    else if (id >= 0)
        ps->zg_over = 1;
    return id;
}

static int kept(par_state *ps, uint32_t m, uint64_t l)
{
    /* __params_to_release stops before a module once the fetches so far
     * reach the distance: kept only below it */
    return reuse_distance(ps, m, l) < ps->rm->deepspeed.max_reuse_distance;
}

static int alive(const sim *s, int32_t id)
{
    return id >= 0 && (size_t)id < s->nt && s->t[id].alive;
}

/* elements gathered now (the coordinator's __n_available_params): the
 * alive gathered tensors, all fetch()'s (the dead ones leave the list) */
static uint64_t available(par_state *ps)
{
    const sim *s = ps->c->s;
    uint64_t b = 0;
    if (ps->zg_over) {
        for (size_t i = 0; i < s->nt; i++)
            if (s->t[i].alive && s->t[i].row == ps->r_gather && s->t[i].base < 0)
                b += s->t[i].bytes;
        return b / (ps->c->dt ? ps->c->dt : 1);
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < ps->nzg; i++) {
        const sim_tensor *t = &s->t[ps->zg[i]];
        if (t->alive && t->row == ps->r_gather && t->base < 0) {
            b += t->bytes;
            ps->zg[k++] = ps->zg[i];
        }
    }
    ps->nzg = k;
    return b / (ps->c->dt ? ps->c->dt : 1);
}

/* Fetch a layer: what was prefetched for it is part of it.  Then prefetch
 * the next layer's parameters, at most stage3_prefetch_bucket_size elements
 * and what stage3_max_live_parameters leaves (fetch_sub_module:
 * max_params_to_prefetch = min(max_available - available, prefetch_bucket)). */
static int32_t fetch_layer(par_state *ps, uint64_t n, uint32_t m, int64_t next)
{
    sim *s = ps->c->s;
    const deepspeed_spec *d = &ps->rm->deepspeed;
    sim_drop(s, ps->zpf);
    ps->zpf = -1;
    int32_t p = fetch(ps, n);
    if (next < 0)
        return p;
    uint64_t want = fetched(ps, m, (uint64_t)next), avail = available(ps);
    uint64_t bucket = d->prefetch_bucket_size ? d->prefetch_bucket_size
                                              : (uint64_t)(0.9 * (double)resolved_decoder_hidden(ps->rm) *
                                                           (double)resolved_decoder_hidden(ps->rm));
    uint64_t room = d->max_live_parameters > avail ? d->max_live_parameters - avail : 0;
    uint64_t pre = want < bucket ? want : bucket;
    ps->zpf = fetch(ps, pre < room ? pre : room);
    return p;
}

/* the layer backward reaches next: the PRE marker before tape index k */
static int64_t next_back(const sim *s, size_t k, void (*fn)(sim *, const sim_node *, void *))
{
    for (size_t j = k; j-- > 0;)
        if (s->tape[j].marker == fn && s->tape[j].aux[3] == 1)
            return alive(s, s->tape[j].aux[2]) ? -1 : (int64_t)j;
    return -1;
}

static void marker(sim *s, const sim_node *n, void *ctx)
{
    par_state *ps = ctx;
    if (n->aux[3] == 2) { /* folded layers: released after the ballast's backward */
        sim_drop(s, n->aux[2]);
        return;
    }
    if (n->aux[3] == 1) { /* pre-backward: fetched again unless it stayed */
        int32_t p = n->aux[2];
        if (!alive(s, p)) {
            int64_t j = next_back(s, (size_t)n->aux[5], marker);
            uint32_t m = (uint32_t)n->aux[0];
            p = fetch_layer(ps, fetched(ps, m, (uint64_t)n->aux[1]), m,
                            j >= 0 && s->tape[j].aux[0] == n->aux[0] ? s->tape[j].aux[1] : -1);
        }
        ps->cur_p = p;
    } else { /* post-backward: released */
        sim_drop(s, ps->cur_p);
        ps->cur_p = -1;
    }
}

/* Folded layers (stack.c): the ballast repeats what the group before them
 * left, their fetched parameters included when that group stayed gathered
 * (then so do all later layers: kept-ness only grows towards the end).
 * Otherwise the folded layers that stay are fetched here, and released by a
 * marker that backward reaches right after the ballast. */
static void folded(par_state *ps, const sim_layer_ev *e)
{
    sim *s = ps->c->s;
    if (!e->count || !e->layer || kept(ps, e->module, e->layer - 1))
        return;
    uint64_t n = 0;
    for (uint64_t l = e->layer; l < e->layer + e->count; l++)
        if (kept(ps, e->module, l))
            n = sim_add(s, n, fetched(ps, e->module, l));
    int32_t p = fetch(ps, n);
    if (p < 0)
        return;
    if (!e->grad) {
        sim_drop(s, p);
        return;
    }
    size_t k = par_marker(s, ps->r_gather, marker, ps, e->module, e->layer, 2, e->count);
    s->tape[k].aux[2] = p;
}

static void on_layer(sim *s, const sim_layer_ev *e, void *ctx)
{
    par_state *ps = ctx;
    if (e->what == SIM_LAYERS_FOLDED) {
        folded(ps, e);
        return;
    }
    uint64_t n = fetched(ps, e->module, e->layer);
    if (e->what == SIM_LAYER_BEGIN) {
        const resolved_module *m = &ps->rm->modules[e->module];
        uint64_t layers = m->layers;
        ps->fwd_k = e->grad ? par_marker(s, ps->r_gather, marker, ps, e->module, e->layer, 0, 1) + 1
                            : 0;
        ps->fwd_p = fetch_layer(ps, n, e->module,
                                e->layer + 1 < layers ? (int64_t)e->layer + 1 : -1);
        return;
    }
    int32_t p = ps->fwd_p;
    ps->fwd_p = -1;
    int backward = ps->fwd_k && s->ntape > ps->fwd_k;
    if (!backward || !kept(ps, e->module, e->layer)) {
        sim_drop(s, p);
        p = -1;
    }
    if (!ps->fwd_k)
        return;
    if (!backward) {
        s->ntape--;
        return;
    }
    size_t k = par_marker(s, ps->r_gather, marker, ps, e->module, e->layer, 1, 1);
    s->tape[k].aux[2] = p;
}

void zero3_setup(par_state *ps)
{
    sim *s = ps->c->s;
    ps->cur_p = ps->fwd_p = ps->gathered = ps->zpf = -1;
    ps->fwd_k = 0;
    zero3_layout(ps, &ps->zl);
    /* the persistent parameters' full copies (mark_persistent_parameters) */
    for (size_t r = 0; r < s->nrows; r++)
        if (persistent_row(ps, &s->rows[r]) && !ps->rm->deepspeed.offload_param)
            sim_alloc(s, (uint32_t)r, sim_mul(s, s->rows[r].params, ps->c->dt), F_PARAM, 0);
}

/* Does backward reach this root row (rows outside the layers)?  Its
 * module's backward hook fires when it trains or when a gradient flows
 * through it: the decoder's final norm and head (and embeddings tied to it)
 * once anything trains; with gradient checkpointing every input embedding's
 * output requires grad (transformers 5.17 enable_input_require_grads hooks
 * each sub-model's get_input_embeddings), so gradients flow through the
 * frozen towers too.  A row backward never reaches is released after its
 * forward: its next use is beyond the step's trace. */
static int reached(const par_state *ps, const sim_row *R)
{
    const resolved_module *m = &ps->rm->modules[R->module];
    if (R->trainable)
        return 1;
    if (!ps->P_tr)
        return 0;
    if (ps->rm->training.ckpt.enabled)
        return 1;
    if (m->role != MOD_DECODER)
        return 0;
    if (!strcmp(R->name, "embed_tokens"))
        return m->tie_word_embeddings;
    return !strcmp(R->name, "norm") || !strcmp(R->name, "lm_head");
}

void zero3_forward_begin(par_state *ps)
{
    sim *s = ps->c->s;
    uint64_t kept = 0, once = 0;
    for (size_t r = 0; r < s->nrows; r++) {
        const sim_row *R = &s->rows[r];
        if (!R->params || strstr(R->name, "layers.") || persistent_row(ps, R))
            continue;
        if (reached(ps, R))
            kept = sim_add(s, kept, R->params);
        else
            once = sim_add(s, once, R->params);
    }
    if (once) /* fetched for its forward, released after it */
        sim_drop(s, fetch(ps, once));
    ps->gathered = fetch(ps, kept);
    s->on_layer = on_layer;
    s->on_layer_ctx = ps;
}

void zero3_forward_end(par_state *ps)
{
    ps->c->s->on_layer = NULL;
}

void zero3_backward_begin(par_state *ps)
{
    (void)ps;
}

void zero3_backward_end(par_state *ps)
{
    sim *s = ps->c->s;
    sim_drop(s, ps->zpf);
    ps->zpf = -1;
    sim_drop(s, ps->gathered);
    ps->gathered = -1;
    if (!ps->zg_over) { /* every gathered tensor is a fetch()'s in zg, in id order:
                           the same drops as the look at every tensor below */
        for (uint32_t i = 0; i < ps->nzg; i++)
            if (alive(s, ps->zg[i]) && s->t[ps->zg[i]].row == ps->r_gather &&
                s->t[ps->zg[i]].base < 0)
                sim_drop(s, ps->zg[i]);
        return;
    }
    for (size_t i = 0; i < s->nt; i++)
        if (s->t[i].alive && s->t[i].row == ps->r_gather && s->t[i].base < 0)
            sim_drop(s, (int32_t)i);
}
