/* parallel_fsdp.c - FSDP1 (FullyShardedDataParallel, flat parameters) and
 * FSDP2 (fully_shard, per-parameter shards) on the timeline, unit by unit.
 *
 * A unit is each wrapped layer (the model's _no_split_modules: decoder
 * layers, vision blocks) plus the root (everything else).  Sources, torch
 * 2.13 (docs/parallel.md has the walk-through):
 *   FSDP1 distributed/fsdp/_flat_param.py, _runtime_utils.py
 *   FSDP2 distributed/fsdp/_fully_shard/_fsdp_param_group.py, _fsdp_collectives.py
 * Forward: a unit is gathered at its pre-forward and, resharding after
 * forward, freed at its post-forward (FSDP1 never reshards the root there:
 * _runtime_utils.py _post_forward_reshard).  Backward: a unit is gathered
 * again at its pre-backward, the next one is prefetched, its gradients pile
 * up unsharded until its post-backward reduce-scatters them into a shard and
 * frees them.  The layer loop tells us where units begin and end (stack.c,
 * sim_layer_ev); markers on the tape stand for the pre- and post-backward
 * hooks. */
#include "parallel.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

enum { MK_POST = 0, MK_PRE, MK_FOLDED };

static int fsdp2(const par_state *ps)
{
    return ps->kind == PAR_FSDP2;
}

/* fsdp.wrap_policy peft_lora (FSDP1): PEFT's fsdp_auto_wrap_policy
 * (peft/utils/other.py:1294-1307, lambda_policy_fn or'ed with the layer
 * policy) makes every trainable leaf (each lora_A / lora_B Linear, a trainable
 * connector's Linears) a FlatParameter of its own, nested in its layer's or
 * the root's unit (torch distributed/fsdp/wrap.py _recursive_wrap :488-563
 * wraps the children first).  The layer's and the root's flat parameters then
 * hold the frozen weights only: they do not require grad (_flat_param.py
 * _validate_tensors_to_flatten), get no flat gradient and their views none
 * either.  The adapters' units are gathered inside their parent's and each
 * reduce-scatters its own flat gradient at its post-backward hook; here they
 * are counted with their parent: gathered with it (their bytes for the whole
 * of the parent's forward and backward, not only their own op's) and one flat
 * gradient of the parent's trainable elements, not of all its elements. */
static int peft_units(const par_state *ps)
{
    return !fsdp2(ps) && ps->rm->fsdp.wrap_peft;
}

/* the elements of a unit's FSDP1 flat gradient: the whole flat parameter once
 * any of it trains, its trainable leaves only under peft_units */
static uint64_t flat_grad_elems(const par_state *ps, uint64_t params, uint64_t tr)
{
    return !tr ? 0 : peft_units(ps) ? tr : params;
}

static void drop(sim *s, int32_t *id)
{
    sim_drop(s, *id);
    *id = -1;
}

static int alive(const sim *s, int32_t id)
{
    return id >= 0 && (size_t)id < s->nt && s->t[id].alive;
}

/* FSDP2 without a MixedPrecision policy gathers and reduces each parameter in
 * its own dtype: mixed dtypes are all-gathered as bytes
 * (_fsdp_collectives.py:799-800 _get_all_gather_input_metadatas: uint8) and
 * copied out per parameter; reduce_dtype None is the gradients' dtype
 * (foreach_reduce :559-560).  PEFT's fp32 adapters on a 16-bit model (the
 * rows' pesz) are "wide": 4 bytes each there.  A unit's wide elements (m =
 * MM_MAX_MODULES: the root); a layer gets its module's share of them. */
static uint64_t unit_wide(const par_state *ps, uint32_t m, uint64_t l)
{
    if (!ps->w_esz)
        return 0;
    if (m >= MM_MAX_MODULES)
        return ps->root_w;
    if (!ps->l_tr[m])
        return 0;
    return (uint64_t)((unsigned __int128)par_unit_trainable(ps, m, l) * ps->w_tr[m] / ps->l_tr[m]);
}

/* bytes of n elements, w of them wide, in the gather (param) dtype */
static uint64_t in_pdt(const par_state *ps, uint64_t n, uint64_t w, uint64_t dt)
{
    sim *s = ps->c->s;
    w = w < n ? w : n;
    return sim_add(s, sim_mul(s, n - w, dt), sim_mul(s, w, ps->w_esz));
}

static uint64_t unit_bytes(const par_state *ps, uint32_t m, uint64_t l)
{
    return in_pdt(ps, par_unit_params(ps, m, l), unit_wide(ps, m, l), ps->pdt);
}

static int in_layers(const sim_row *R)
{
    return strstr(R->name, "layers.") != NULL;
}

/* the wide elements per module's layers and in the root (fsdp_setup) */
static void wide_setup(par_state *ps)
{
    sim *s = ps->c->s;
    uint64_t all = 0, units = 0;
    if (!fsdp2(ps) || ps->rm->fsdp.mixed_precision)
        return;
    for (size_t r = 0; r < s->nrows; r++) {
        const sim_row *R = &s->rows[r];
        int wide = R->pesz > ps->store && R->trainable;
        if (wide) {
            ps->w_esz = R->pesz > ps->w_esz ? R->pesz : ps->w_esz;
            all = sim_add(s, all, R->trainable);
        }
        if (R->module < MM_MAX_MODULES && in_layers(R)) {
            ps->l_tr[R->module] = sim_add(s, ps->l_tr[R->module], R->trainable);
            if (wide)
                ps->w_tr[R->module] = sim_add(s, ps->w_tr[R->module], R->trainable);
        }
    }
    for (uint32_t m = 0; m < ps->rm->n_modules && m < MM_MAX_MODULES; m++) {
        uint64_t n = ps->rm->modules[m].layers;
        for (uint64_t l = 0; l < n && l < MM_MAX_LAYERS; l++)
            units = sim_add(s, units, unit_wide(ps, m, l));
    }
    ps->root_w = all > units ? all - units : 0;
}

/* ---- FSDP1: the trainable elements of the busiest rank's shards ---------------- */

/* One flat parameter cut into N equal chunks (_flat_param.py
 * _get_shard: the padded flat parameter's chunk `rank`); acc[r] += the
 * trainable elements of rank r's chunk. */
typedef struct flatcut {
    uint64_t N, S, off;
    uint64_t *acc;                     /* NULL: only count the elements */
} flatcut;

static void cut_segment(flatcut *f, uint64_t n, int trainable)
{
    if (f->acc && trainable && n && f->S) {
        uint64_t last = (f->off + n - 1) / f->S;
        for (uint64_t r = f->off / f->S; r <= last && r < f->N; r++) {
            uint64_t lo = r * f->S, hi = lo + f->S;
            uint64_t a = f->off > lo ? f->off : lo, b = f->off + n < hi ? f->off + n : hi;
            f->acc[r] += b - a;
        }
    }
    f->off += n;
}

enum { U_ROOT = MM_MAX_LAYERS, U_EMB, U_HEAD };

/* CLIP and SigLIP list their vision embeddings (and SigLIP its pooling
 * head) in _no_split_modules (transformers 5.17 modeling_clip.py:397
 * CLIPVisionEmbeddings, modeling_siglip.py:366-371 SiglipVisionEmbeddings,
 * SiglipMultiheadAttentionPoolingHead): units of their own.  Returns U_EMB,
 * U_HEAD or U_ROOT for the row's unit outside the layers. */
static uint64_t unit_of(const par_state *ps, uint32_t module, const char *name)
{
    const resolved_module *m = &ps->rm->modules[module];
    if (m->unit_embeddings && !strncmp(name, "embeddings.", 11))
        return U_EMB;
    if (m->unit_head && (!strcmp(name, "head") || !strncmp(name, "head.", 5)))
        return U_HEAD;
    return U_ROOT;
}

static uint64_t own_unit(const par_state *ps, const sim_row *R)
{
    return unit_of(ps, R->module, R->name);
}

/* a unit's parameters in module order, row by row (a row's instance k is
 * layer k's); unit U_ROOT: the root, every row outside the layers and the
 * units of own_unit; U_EMB, U_HEAD: that unit of module m */
static void unit_walk(const par_state *ps, uint32_t m, uint64_t unit, flatcut *f)
{
    const sim *s = ps->c->s;
    int layer = unit < MM_MAX_LAYERS;
    for (size_t r = 0; r < s->nrows; r++) {
        const sim_row *R = &s->rows[r];
        if (!R->params || !R->count || (unit != U_ROOT && R->module != m) || in_layers(R) != layer ||
            (!layer && own_unit(ps, R) != unit))
            continue;
        uint64_t n = R->params / R->count;
        uint32_t tc = R->trainable_count;
        for (uint32_t k = layer ? (uint32_t)unit : 0; k < R->count && (!layer || k == unit); k++)
            cut_segment(f, n, k < tc && R->trainable);
    }
}

static void unit_cut(const par_state *ps, uint32_t m, uint64_t layer, flatcut *f)
{
    uint64_t *acc = f->acc;
    f->acc = NULL;
    f->off = 0;
    unit_walk(ps, m, layer, f);
    f->S = mm_ceil_div(f->off, f->N);
    f->acc = acc;
    f->off = 0;
    unit_walk(ps, m, layer, f);
}

/* FSDP1 shards each unit's flat parameter, frozen and trainable parameters
 * alike, into N equal chunks.  With use_orig_params the optimizer holds the
 * original parameters, views into this rank's chunk (_flat_param.py
 * _use_sharded_views), and keeps states only for those that get a gradient;
 * without it, it holds the flat shards, all of the same size.  A root of a
 * frozen vision tower followed by trainable embeddings and head puts the
 * frozen ones in rank 0's chunk, the trainable ones in the last ranks'.
 * Returns the trainable elements the busiest rank holds beyond an even
 * share (P_tr / N). */
uint64_t fsdp1_state_excess(const par_state *ps)
{
    sim *s = ps->c->s;
    flatcut f = {.N = s->dp ? s->dp : 1};
    /* peft_units: every trainable leaf is a flat parameter of its own, cut
     * evenly (up to its padding) */
    if (fsdp2(ps) || peft_units(ps) || !ps->rm->fsdp.use_orig_params || f.N < 2 ||
        !(f.acc = calloc(f.N, sizeof *f.acc)))
        return 0;
    unit_cut(ps, 0, U_ROOT, &f);
    for (uint32_t m = 0; m < ps->rm->n_modules && m < MM_MAX_MODULES; m++) {
        uint64_t n = ps->rm->modules[m].layers;
        unit_cut(ps, m, U_EMB, &f);
        unit_cut(ps, m, U_HEAD, &f);
        for (uint64_t l = 0; l < n && l < MM_MAX_LAYERS; l++)
            unit_cut(ps, m, l, &f);
    }
    uint64_t most = 0;
    for (uint64_t r = 0; r < f.N; r++)
        most = f.acc[r] > most ? f.acc[r] : most;
    free(f.acc);
    uint64_t even = ps->P_tr / f.N;
    return most > even ? most - even : 0;
}

/* The gradients accumulated between micro-batches, in elements (unsharded;
 * sync_each_micro_batch keeps 1/N of them).  FSDP1's gradient is the flat
 * parameter's: a unit with any trainable parameter has a gradient of its whole
 * flat parameter, frozen elements included (the views' gradients assembled into
 * one, _flat_param.py _use_unsharded_views / the split's backward), kept unsharded
 * as flat_param.grad under no_sync (_runtime_utils.py _post_backward_hook
 * :743-746) and as the flat shard _saved_grad_shard otherwise
 * (_accumulate_sharded_grad :907-915, _flat_param.py prepare_gradient_for_backward
 * :1640).  FSDP2 keeps one gradient per trainable parameter. */
uint64_t fsdp_accum_grad_elems(const par_state *ps)
{
    sim *s = ps->c->s;
    if (fsdp2(ps))
        return ps->P_grad;
    uint64_t n = flat_grad_elems(ps, ps->root, ps->root_tr);
    for (uint32_t m = 0; m < ps->rm->n_modules && m < MM_MAX_MODULES; m++) {
        uint64_t L = ps->rm->modules[m].layers;
        for (uint64_t l = 0; l < L && l < MM_MAX_LAYERS; l++)
            n = sim_add(s, n, flat_grad_elems(ps, par_unit_params(ps, m, l),
                                              par_unit_trainable(ps, m, l)));
    }
    n = sim_add(s, n, flat_grad_elems(ps, ps->w_emb, ps->w_emb_tr)); /* wrap_policy size */
    n = sim_add(s, n, flat_grad_elems(ps, ps->w_head, ps->w_head_tr));
    return sim_add(s, n, flat_grad_elems(ps, ps->w_base, ps->w_base_tr));
}

/* ---- FSDP1 use_orig_params: frozen weights in a flat parameter that trains ------- */

/* the unit outside the layers of module m's entry rows (vision.c embeddings()
 * asks before its first row: CLIP / SigLIP embeddings are their own unit) */
static uint64_t entry_unit(const par_state *ps, uint32_t m)
{
    return unit_of(ps, m, "embeddings.");
}

/* does unit u outside the layers (U_ROOT: the root of every module; U_EMB,
 * U_HEAD: module m's) hold a trainable parameter */
static int outer_trains(const par_state *ps, uint32_t m, uint64_t u)
{
    const sim *s = ps->c->s;
    for (size_t r = 0; r < s->nrows; r++) {
        const sim_row *R = &s->rows[r];
        if (!R->trainable)
            continue;
        if (in_layers(R)) { /* Idefics3: the layers but their self_attn are the root's */
            if (u == U_ROOT && par_attention_only(ps, R->module) && !par_attention_row(R))
                return 1;
            continue;
        }
        if (own_unit(ps, R) == u && (u == U_ROOT || R->module == m))
            return 1;
    }
    return 0;
}

/* op_trainable's question for a frozen weight of row `row` (UINT32_MAX: the
 * module's entry).  FSDP1 flattens a unit's parameters into one FlatParameter
 * that requires grad when any of them does (_flat_param.py
 * _validate_tensors_to_flatten :832, mixed requires_grad only with
 * use_orig_params :817-825).  In forward each module gets a plain-tensor view
 * of the unsharded flat parameter (_use_unsharded_views as_params=False
 * :1994-2007, views of torch.split :1925), which requires grad like it: a
 * frozen weight there gets a weight gradient, its inputs are saved for it, and
 * its outputs require grad (a frozen tower behind a pre-norm or patch
 * embedding in the root records a graph).  The views' gradients wait for
 * SplitWithSizesBackward, which cats them (zeros for the missing) into the
 * flat gradient when the unit's last one arrives (reduce_unit: the cat, then
 * they go).  A unit that does not train keeps a flat parameter without grad
 * and views without it. */
/* fsdp1_frozen_rg under wrap_policy size: does the unit holding row R (layer
 * `layer`, UINT64_MAX outside the layers) train.  A layer row in none of its
 * layer's units, and the rows outside the layers that are no unit of their own,
 * are the base model's unit when there is one, else the root's. */
static int size_frozen_rg(const par_state *ps, const sim_row *R, uint64_t layer)
{
    int outer = ps->w_base ? ps->w_base_tr != 0 : ps->root_tr != 0;
    if (!R)
        return layer < MM_MAX_LAYERS ? par_unit_trainable(ps, ps->llm, layer) != 0 || outer
                                     : outer;
    if (layer < MM_MAX_LAYERS && in_layers(R)) {
        int64_t u = wrap_row_unit(ps, R, layer);
        return u < 0 ? outer : u != 0;
    }
    if (!strcmp(R->name, "embed_tokens") && ps->w_emb)
        return ps->w_emb_tr != 0;
    if (!strcmp(R->name, "lm_head") && ps->w_head)
        return ps->w_head_tr != 0;
    return outer;
}

static int fsdp1_frozen_rg(const lctx *c, uint32_t row)
{
    const par_state *ps = c->frozen_rg_ctx;
    const sim *s = c->s;
    const sim_row *R = row < s->nrows && s->rows[row].module == c->mi ? &s->rows[row] : NULL;
    int layer = c->per_layer && c->layer < MM_MAX_LAYERS && (!R || in_layers(R));
    if (ps->rm->fsdp.wrap_size)
        return size_frozen_rg(ps, R, layer ? c->layer : UINT64_MAX);
    if (layer && (!R || !par_attention_only(ps, c->mi) || par_attention_row(R)))
        return par_unit_trainable(ps, c->mi, c->layer) != 0;
    if (layer)
        return outer_trains(ps, c->mi, U_ROOT);
    return outer_trains(ps, c->mi, R ? own_unit(ps, R) : entry_unit(ps, c->mi));
}

/* Issue a unit's all-gather.  FSDP1 gathers straight into the padded flat
 * parameter (_flat_param.py unshard: _alloc_padded_unsharded_flat_param); with
 * MixedPrecision the shard is first cast into _mp_shard, freed after
 * (_use_low_precision_shard / _free_low_precision_sharded_param).  FSDP2
 * allocates the flat output (_fsdp_collectives.py foreach_all_gather:
 * all_gather_output), with a param_dtype after casting the shards into one
 * flat input (_get_param_all_gather_inputs: flat_foreach_copy_input). */
static int32_t ag_issue(par_state *ps, uint64_t b)
{
    sim *s = ps->c->s;
    int32_t cast = ps->pdt != ps->store ? sim_alloc(s, ps->r_gather, b, F_PARAM, SIM_SHARDED) : -1;
    int32_t out = sim_alloc(s, ps->r_gather, b, F_PARAM, SIM_FIXED);
    sim_drop(s, cast);
    return out;
}

/* FSDP2's copy-out into per-parameter tensors (foreach_all_gather_copy_out:
 * alloc_all_gather_outputs, split_with_sizes_copy) */
static int32_t copy_out(par_state *ps, uint64_t b)
{
    return sim_alloc(ps->c->s, ps->r_gather, b, F_PARAM, SIM_FIXED);
}

/* forward: FSDP2 keeps the flat output until the next all-gather's copy-out
 * (_fsdp_param_group.py wait_for_unshard: comm_ctx.all_gather_state) */
static int32_t gather_forward(par_state *ps, uint64_t b)
{
    sim *s = ps->c->s;
    int32_t out = ag_issue(ps, b);
    if (!fsdp2(ps))
        return out;
    int32_t p = copy_out(ps, b);
    sim_drop(s, ps->ag_held);
    ps->ag_held = out;
    return p;
}

/* backward: the flat output is freed right after the copy-out */
static int32_t gather_backward(par_state *ps, uint64_t b)
{
    int32_t out = ag_issue(ps, b);
    if (!fsdp2(ps))
        return out;
    int32_t p = copy_out(ps, b);
    sim_drop(ps->c->s, out);
    return p;
}

/* FSDP2's foreach_reduce copies the gradients into the reduce-scatter input
 * and clears its list (_fsdp_collectives.py:603-606), but the loop before it
 * (:580-590, `for i, (fsdp_param, unsharded_grad) in enumerate(...)`, run
 * whenever world_size > 1) leaves its variable on the group's last gradient:
 * that one lives until foreach_reduce returns (:769), past the allocation of
 * the reduce-scatter output (:612-616) and its cast.  A unit's parameters are
 * in registration order; the root of a *ForCausalLM or
 * *ForConditionalGeneration registers lm_head last (untied: its own weight).
 * A wrapped layer's last parameter is a norm weight or a bias: not modelled.
 * Returns the held gradient's id, -1 for none. */
static int32_t root_last_grad(const par_state *ps, int32_t mark)
{
    sim *s = ps->c->s;
    if (s->dp <= 1)
        return -1;
    for (size_t i = s->nt; i-- > (mark > 0 ? (size_t)mark : 0);) {
        const sim_tensor *t = &s->t[i];
        if (t->alive && t->cls == F_GRAD && t->sharded == SIM_FIXED && t->base < 0 &&
            t->row != ps->r_grads && !strcmp(s->rows[t->row].name, "lm_head"))
            return (int32_t)i;
    }
    return -1;
}

/* Post-backward of a unit with `params` parameters, `tr` of them trainable,
 * whose gradients were made since tensor `mark`.  FSDP1 (_runtime_utils.py
 * _post_backward_hook, _reduce_grad): the flat parameter's gradient (the
 * whole flat parameter once any of it trains) is assembled from the views'
 * gradients, the unit resharded, a shard allocated for the reduce-scatter
 * (_get_reduce_scatter_tensors: new_sharded_grad) and cast to the parameter
 * dtype (_cast_grad_to_param_dtype).  FSDP2 (_fsdp_collectives.py
 * foreach_reduce): reshard, a reduce_scatter_input of the trainable
 * gradients in reduce_dtype (kept until the next reduce-scatter), the
 * gradients freed, the output shard becomes .grad (cast when reduce_dtype
 * differs from the parameter). */
/* par_drop_grads, but under wrap_policy size a layer unit (ps->keep_layer) keeps
 * the gradients of the layer's parameters that no unit of the layer holds: they
 * are views of the base model's or the root's flat parameter and wait for its
 * split's backward (its post-backward drops them). */
static void drop_unit_grads(par_state *ps, int32_t mark)
{
    sim *s = ps->c->s;
    if (ps->keep_layer >= MM_MAX_LAYERS) {
        par_drop_grads(ps, mark);
        return;
    }
    for (size_t i = mark > 0 ? (size_t)mark : 0; i < s->nt; i++) {
        const sim_tensor *t = &s->t[i];
        if (!t->alive || t->cls != F_GRAD || t->sharded != SIM_FIXED || t->base >= 0 ||
            t->row == ps->r_bucket || t->row == ps->r_part || t->row == ps->r_grads)
            continue;
        const sim_row *R = &s->rows[t->row];
        if (R->module == ps->llm && !strncmp(R->name, "layers.", 7) &&
            wrap_row_unit(ps, R, ps->keep_layer) < 0)
            continue;
        sim_drop(s, (int32_t)i);
    }
}

static void reduce_unit(par_state *ps, uint64_t params, uint64_t tr, uint64_t w, int32_t mark,
                        int32_t *p)
{
    sim *s = ps->c->s;
    if (!fsdp2(ps)) {
        params = tr ? flat_grad_elems(ps, params, tr) : params;
        uint64_t N = s->dp ? s->dp : 1, padded = sim_mul(s, mm_ceil_div(params, N), N);
        int32_t g = tr ? sim_alloc(s, ps->r_grads, sim_mul(s, params, ps->pdt), F_GRAD, 0) : -1;
        drop_unit_grads(ps, mark);
        drop(s, p);
        if (g >= 0) {
            /* a flat gradient not divisible by N is padded first (F.pad) */
            int32_t pad = padded != params ? sim_alloc(s, ps->r_grads, sim_mul(s, padded, ps->pdt),
                                                       F_GRAD, 0) : -1;
            int32_t sh = sim_alloc(s, ps->r_grads, sim_mul(s, params, ps->rdt), F_GRAD, SIM_SHARDED);
            sim_drop(s, pad);
            if (ps->rdt != ps->store) {
                sim_alloc(s, ps->r_grads, sim_mul(s, params, ps->store), F_GRAD, SIM_SHARDED);
                sim_drop(s, sh);
            }
        }
        sim_drop(s, g);
        return;
    }
    drop(s, p);
    drop(s, &ps->rs_held);
    uint64_t rb = in_pdt(ps, tr, w, ps->rdt);
    int32_t in = tr ? sim_alloc(s, ps->r_grads, rb, F_GRAD, 0) : -1;
    int32_t last = p == &ps->root_p ? root_last_grad(ps, mark) : -1;
    sim_hold(s, last);
    par_drop_grads(ps, mark);
    if (in >= 0) {
        int32_t out = sim_alloc(s, ps->r_grads, rb, F_GRAD, SIM_SHARDED);
        if (ps->rdt != ps->store) {
            sim_alloc(s, ps->r_grads, sim_mul(s, tr, ps->store), F_GRAD, SIM_SHARDED);
            sim_drop(s, out);
        }
    }
    sim_drop(s, last); /* foreach_reduce returns */
    ps->rs_held = in;
}

/* the next unit in backward order: the PRE marker before tape index k */
static int next_unit(const sim *s, size_t k, const sim_node **out);

/* backward prefetch (FSDP1 BACKWARD_PRE, FSDP2 always): the next unit's
 * all-gather is issued at this unit's pre-backward */
static void prefetch(par_state *ps, size_t k)
{
    sim *s = ps->c->s;
    const sim_node *m;
    if (fsdp2(ps) ? 0 : !ps->rm->fsdp.backward_prefetch)
        return;
    size_t j = (size_t)next_unit(s, k, &m);
    if (!m || alive(s, m->aux[2]))
        return;
    int32_t f = ag_issue(ps, unit_bytes(ps, (uint32_t)m->aux[0], (uint64_t)m->aux[1]));
    if (fsdp2(ps))
        ps->pf_f = f;
    else
        ps->pf_p = f;
    ps->pf_k = j + 1;
}

static int post_prefetch(const par_state *ps)
{
    return !fsdp2(ps) && ps->rm->fsdp.backward_prefetch_post;
}

/* The adapter units (lora_A rows) of layer l of module m: each of its lora_A /
 * lora_B pairs under peft_units. */
static uint64_t layer_adapters(const par_state *ps, uint32_t m, uint64_t l)
{
    const sim *s = ps->c->s;
    uint64_t n = 0;
    for (size_t r = 0; r < s->nrows; r++) {
        const sim_row *R = &s->rows[r];
        size_t k = strlen(R->name);
        if (R->module == m && in_layers(R) && l < R->count && k > 7 &&
            !strcmp(R->name + k - 7, ".lora_A"))
            n++;
    }
    return n;
}

/* peft_units: FSDP1's backward prefetch takes the handle before the current
 * one in post-forward order (_exec_order_utils.py
 * get_handle_to_backward_prefetch :88-106: handles_post_forward_order[index - 1]).  An
 * adapter's unit ends its forward inside its layer, so that order is: layer
 * l-1's adapters, layer l-1, layer l's adapters, layer l.  Layer l's
 * pre-backward prefetches its last adapter (counted with the layer here); the
 * frozen layer l-1 is prefetched at the pre-backward of layer l's first
 * adapter (q_proj's lora_A), the last of them in backward.  Returns whether
 * the prefetch waits for those adapters (hold_grad counts them down). */
static int defer_prefetch(par_state *ps, const sim_node *n)
{
    ps->ad_left = peft_units(ps) ? layer_adapters(ps, (uint32_t)n->aux[0], (uint64_t)n->aux[1]) : 0;
    return ps->ad_left != 0;
}

static void pre_backward(par_state *ps, const sim_node *n)
{
    sim *s = ps->c->s;
    uint64_t params = unit_bytes(ps, (uint32_t)n->aux[0], (uint64_t)n->aux[1]);
    size_t k = (size_t)n->aux[5];
    int32_t p = n->aux[2];
    if (!alive(s, p)) {
        if (ps->pf_k == k + 1) { /* prefetched: FSDP2 copies out, frees the flat output */
            p = fsdp2(ps) ? copy_out(ps, params) : ps->pf_p;
            drop(s, &ps->pf_f);
            ps->pf_p = -1;
            ps->pf_k = 0;
        } else {
            p = gather_backward(ps, params);
        }
    }
    if (n->aux[1] == OP_UNIT_BASE) { /* its layers' units run inside it */
        ps->base_p = p;
        ps->base_mark = (int32_t)s->nt;
        prefetch(ps, k);
        return;
    }
    ps->cur_p = p;
    ps->cur_mark = (int32_t)s->nt;
    ps->cur_k = k;
    if (!post_prefetch(ps) && !defer_prefetch(ps, n))
        prefetch(ps, k);
}

static void post_backward(par_state *ps, const sim_node *n)
{
    uint32_t mi = (uint32_t)n->aux[0];
    uint64_t l = (uint64_t)n->aux[1];
    if (l == OP_UNIT_BASE) {
        reduce_unit(ps, par_unit_params(ps, mi, l), par_unit_trainable(ps, mi, l), 0,
                    ps->base_mark, &ps->base_p);
        return;
    }
    int part = ps->rm->fsdp.wrap_size && l < MM_MAX_LAYERS &&
               par_unit_params(ps, mi, l) < sim_layer_get(ps->c->s, ps->c->s->layer_p, mi, l);
    ps->keep_layer = part ? l : UINT64_MAX; /* units inside the layer, not all of it */
    reduce_unit(ps, par_unit_params(ps, mi, l), par_unit_trainable(ps, mi, l),
                unit_wide(ps, mi, l), ps->cur_mark, &ps->cur_p);
    ps->keep_layer = UINT64_MAX;
    if (post_prefetch(ps)) /* BACKWARD_POST: _post_backward_hook's _prefetch_handle */
        prefetch(ps, ps->cur_k);
}

/* layers the loop folded: their post-backward shards, at once */
static void folded_backward(par_state *ps, const sim_node *n)
{
    sim *s = ps->c->s;
    uint64_t g = 0;
    uint32_t m = (uint32_t)n->aux[0];
    for (uint64_t l = (uint64_t)n->aux[1]; l < (uint64_t)n->aux[1] + (uint64_t)n->aux[4]; l++) {
        uint64_t tr = par_unit_trainable(ps, m, l);
        if (tr)
            g = sim_add(s, g, fsdp2(ps) ? in_pdt(ps, tr, unit_wide(ps, m, l), ps->store)
                                        : sim_mul(s, flat_grad_elems(ps, par_unit_params(ps, m, l),
                                                                     tr), ps->store));
    }
    if (g)
        sim_alloc(s, ps->r_grads, g, F_GRAD, SIM_SHARDED);
}

static void marker(sim *s, const sim_node *n, void *ctx)
{
    (void)s;
    if (n->aux[3] == MK_PRE)
        pre_backward(ctx, n);
    else if (n->aux[3] == MK_POST)
        post_backward(ctx, n);
    else
        folded_backward(ctx, n);
}

static int next_unit(const sim *s, size_t k, const sim_node **out)
{
    *out = NULL;
    for (size_t j = k; j-- > 0;)
        if (s->tape[j].marker == marker && s->tape[j].aux[3] == MK_PRE) {
            *out = &s->tape[j];
            return (int)j;
        }
    return -1;
}

/* FSDP1 forward_prefetch: the next unit's all-gather is issued at this
 * unit's pre-forward (_runtime_utils.py _pre_forward_unshard ->
 * _prefetch_handle(FORWARD)); the loop's next layer here */
static void forward_prefetch(par_state *ps, uint32_t m, uint64_t next)
{
    const resolved_module *ms = &ps->rm->modules[m];
    if (fsdp2(ps) || !ps->rm->fsdp.forward_prefetch)
        return;
    if (next >= ms->layers || !par_unit_params(ps, m, next))
        return;
    ps->ffp = ag_issue(ps, unit_bytes(ps, m, next));
}

/* fsdp.wrap_policy size: the base model's unit (parallel_wrap.c) around the
 * embedding, the layers and the final norm; the embedding's and the layers'
 * units nest in it, so it keeps its own gathered tensor and marks.  Its
 * post-backward (the hook on its flat parameter's AccumulateGrad,
 * _runtime_utils.py _register_post_backward_hook) runs after the embedding's
 * backward: the autograd engine takes ready nodes by sequence number, and the
 * split of the base's flat parameter into views (at its pre-forward) is older
 * than the embedding.  The rows agree (tests/truth/feat_wrap.py min_num_params
 * 300000 and 1000000: reducing it before the embedding's backward under-predicts
 * by 1.0 and 3.7 %).  Its post-backward marker goes on the tape first. */
static void base_unit(sim *s, const sim_layer_ev *e, par_state *ps)
{
    uint64_t b = unit_bytes(ps, e->module, e->layer);
    if (!b)
        return;
    if (e->what == SIM_LAYER_BEGIN) {
        ps->base_k = e->grad ? par_marker(s, ps->r_grads, marker, ps, e->module, e->layer,
                                          MK_POST, 1) + 1 : 0;
        ps->base_p = gather_forward(ps, b);
        return;
    }
    int32_t p = ps->base_p;
    if (ps->rm->fsdp.reshard_after_forward) /* FSDP1: a non-root unit reshards */
        drop(s, &p);
    ps->base_p = -1;
    if (!ps->base_k)
        return;
    size_t k = par_marker(s, ps->r_gather, marker, ps, e->module, e->layer, MK_PRE, 1);
    s->tape[k].aux[2] = p;
}

/* the layer loop: gather at the unit's pre-forward, reshard at its
 * post-forward (FSDP1 FULL_SHARD, FSDP2 reshard_after_forward); with
 * autograd recording, the markers of its pre- and post-backward.  Under
 * wrap_policy size the model's events name the embedding's and lm_head's
 * units too (OP_UNIT_*, decoder.c / ops_loss.c op_unit_event) */
static void layer_unit(sim *s, const sim_layer_ev *e, par_state *ps)
{
    if (e->what == SIM_LAYERS_FOLDED) {
        if (e->grad)
            par_marker(s, ps->r_grads, marker, ps, e->module, e->layer, MK_FOLDED, e->count);
        return;
    }
    uint64_t params = par_unit_params(ps, e->module, e->layer);
    if (!params)
        return;
    if (e->what == SIM_LAYER_BEGIN) {
        ps->fwd_k = e->grad ? par_marker(s, ps->r_grads, marker, ps, e->module, e->layer,
                                         MK_POST, 1) + 1 : 0;
        ps->fwd_p = ps->ffp >= 0 ? ps->ffp : gather_forward(ps, unit_bytes(ps, e->module, e->layer));
        ps->ffp = -1;
        forward_prefetch(ps, e->module, e->layer + 1);
        return;
    }
    int32_t p = ps->fwd_p;
    if (ps->rm->fsdp.reshard_after_forward)
        drop(s, &p);
    ps->fwd_p = -1;
    if (!ps->fwd_k)
        return;
    if (s->ntape == ps->fwd_k) { /* nothing recorded: backward never comes here */
        s->ntape--;
        return;
    }
    size_t k = par_marker(s, ps->r_gather, marker, ps, e->module, e->layer, MK_PRE, 1);
    s->tape[k].aux[2] = p;
}

static void on_layer(sim *s, const sim_layer_ev *e, void *ctx)
{
    par_state *ps = ctx;
    if (e->layer == OP_UNIT_BASE) {
        base_unit(s, e, ps);
        return;
    }
    layer_unit(s, e, ps);
}

static void hold_grad(sim *s, int32_t g, void *ctx)
{
    par_state *ps = ctx;
    if (!s->t[g].sharded)
        sim_hold(s, g); /* until the unit's post-backward */
    const sim_row *R = &s->rows[s->t[g].row];
    size_t k = strlen(R->name);
    /* a lora_A's weight gradient: its unit's backward (defer_prefetch) */
    if (ps->ad_left && k > 7 && !strcmp(R->name + k - 7, ".lora_A") && !--ps->ad_left)
        prefetch(ps, ps->cur_k);
}

/* fsdp.wrap_policy size: the units outside the layers (parallel_wrap.c), the
 * root what no unit holds (parallel.c counted it before the plan existed), and
 * the model's events for the embedding's, lm_head's and the base model's units */
static void size_setup(par_state *ps, lctx *c)
{
    sim *s = c->s;
    uint64_t p = 0, t = 0;
    wrap_plan(ps);
    const resolved_module *m = &ps->rm->modules[ps->llm];
    for (uint64_t l = 0; l < m->layers && l < MM_MAX_LAYERS; l++) {
        p = sim_add(s, p, par_unit_params(ps, ps->llm, l));
        t = sim_add(s, t, par_unit_trainable(ps, ps->llm, l));
    }
    p = sim_add(s, sim_add(s, p, ps->w_emb), sim_add(s, ps->w_head, ps->w_base));
    t = sim_add(s, sim_add(s, t, ps->w_emb_tr), sim_add(s, ps->w_head_tr, ps->w_base_tr));
    ps->root = ps->P_all > p ? ps->P_all - p : 0;
    ps->root_tr = ps->P_tr > t ? ps->P_tr - t : 0;
    c->unit_events = 1;
}

void fsdp_setup(par_state *ps, lctx *c)
{
    const fsdp_spec *f = &ps->rm->fsdp;
    ps->pdt = mm_dtype_bytes(f->param_dtype);
    ps->rdt = mm_dtype_bytes(f->reduce_dtype);
    ps->root_p = ps->ag_held = ps->rs_held = ps->pf_f = ps->pf_p = -1;
    ps->cur_p = ps->fwd_p = ps->ffp = -1;
    ps->cur_k = 0;
    ps->cur_mark = 0;
    ps->pf_k = ps->fwd_k = 0;
    ps->ad_left = 0;
    ps->w_esz = ps->root_w = 0;
    ps->base_p = -1;
    ps->base_mark = 0;
    ps->keep_layer = UINT64_MAX;
    ps->base_k = 0;
    wide_setup(ps);
    if (!fsdp2(ps) && f->wrap_size)
        size_setup(ps, c);
    /* peft_units: no frozen weight shares a flat parameter with a trainable one */
    c->frozen_rg = !fsdp2(ps) && f->use_orig_params && !peft_units(ps) ? fsdp1_frozen_rg : NULL;
    c->frozen_rg_ctx = ps;
}

/* the root's gathered elements: under peft_units its trainable leaves (a
 * connector's Linears, lm_head / embed_tokens adapters) are units of their
 * own, gathered only around their own forward and backward (FULL_SHARD
 * reshards a non-root unit after each, _runtime_utils.py _post_forward_reshard
 * / _post_backward_hook): not counted with the root's frozen flat parameter */
static uint64_t root_gathered(const par_state *ps)
{
    return peft_units(ps) && ps->root > ps->root_tr ? ps->root - ps->root_tr : ps->root;
}

void fsdp_forward_begin(par_state *ps)
{
    sim *s = ps->c->s;
    sim_label(s, "fsdp all-gather", ps->r_gather);
    ps->root_p = ps->root ? gather_forward(ps, in_pdt(ps, root_gathered(ps), ps->root_w, ps->pdt))
                          : -1;
    s->on_layer = on_layer;
    s->on_layer_ctx = ps;
}

/* FSDP2 reshards the root too (reshard_after_forward given for every
 * fully_shard call); FSDP1 keeps it for the backward */
void fsdp_forward_end(par_state *ps)
{
    sim *s = ps->c->s;
    s->on_layer = NULL;
    if (!fsdp2(ps))
        return;
    if (ps->rm->fsdp.reshard_after_forward)
        drop(s, &ps->root_p);
    drop(s, &ps->ag_held);
}

void fsdp_backward_begin(par_state *ps)
{
    sim *s = ps->c->s;
    sim_label(s, "fsdp all-gather", ps->r_gather);
    if (ps->root && !alive(s, ps->root_p))
        ps->root_p = gather_backward(ps, in_pdt(ps, root_gathered(ps), ps->root_w, ps->pdt));
    /* FSDP1: a root with no parameters of its own (wrap_policy size: every one in
     * a unit) has no handle, and its pre-backward prefetches nothing
     * (_runtime_utils.py _pre_backward_hook: _prefetch_handle(state, None) returns) */
    if (fsdp2(ps) || ps->root)
        prefetch(ps, s->ntape);
    s->on_wgrad = hold_grad;
    s->on_wgrad_ctx = ps;
}

/* The accumulated unsharded gradients of no_sync (parallel.c no_sync_bytes), held
 * from the step's start as one buffer.  The last micro-batch's post-backward
 * reduce-scatters and frees each unit's (FSDP1 _runtime_utils.py _reduce_grad
 * :846-847 takes flat_param.grad and sets it to None; FSDP2 _fsdp_param_group.py
 * post_backward :623-626 unsharded_accumulated_grad = None), so the buffer is a
 * bound on those unit-by-unit frees, dropped at the end of the backward.  Where:
 * FSDP1's peak is the end of the backward of a micro-batch under no_sync
 * (_post_backward_hook :743-746 returns before any reduce): the root's flat
 * gradient, assembled from its views (the cat of the split's backward), is added
 * into its accumulated .grad while every unit's accumulated gradient is alive and
 * no sharded gradient exists yet; held through the root's reduce here, the bound
 * exceeds that by the units' sharded gradients (1/N).  FSDP2 accumulates in place
 * into the unsharded .grad (AccumulateGrad; post_backward :607-612 reshards and
 * returns): no micro-batch under no_sync exceeds the last one, where the root's
 * reduce-scatter input is a copy of its accumulated gradients: dropped before. */
static void drop_no_sync_grads(par_state *ps)
{
    sim *s = ps->c->s;
    if (ps->partition >= 0 && !s->t[ps->partition].sharded) {
        sim_drop(s, ps->partition);
        ps->partition = -1;
    }
}

/* the root's post-backward (the final callback); every unit still gathered
 * is resharded (FSDP2 _root_post_backward_final_callback) */
void fsdp_backward_end(par_state *ps)
{
    sim *s = ps->c->s;
    s->on_wgrad = NULL;
    sim_label(s, "fsdp reduce-scatter", ps->r_grads);
    if (fsdp2(ps))
        drop_no_sync_grads(ps);
    reduce_unit(ps, ps->root, ps->root_tr, ps->root_w, ps->step_mark, &ps->root_p);
    drop_no_sync_grads(ps);
    drop(s, &ps->rs_held);
    drop(s, &ps->pf_f);
    drop(s, &ps->pf_p);
    drop(s, &ps->ffp);
    for (size_t i = 0; i < s->nt; i++)
        if (s->t[i].alive && s->t[i].row == ps->r_gather && s->t[i].base < 0)
            sim_drop(s, (int32_t)i);
}
