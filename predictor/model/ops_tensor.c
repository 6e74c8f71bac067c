/* ops_tensor.c - the bookkeeping every op formula shares (ops.c, ops_attn.c,
 * ops_lora.c, ops_loss.c): rows, parameters, tensors and views, backward nodes
 * and what they save, gradients, labels, the elementwise ops, and autocast's
 * cached weight casts.  Below every op file, so the op files use it and not
 * each other. */
#include "ops.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- bookkeeping ------------------------------------------------------------------ */

/* trainable here: the module is, and this layer's output reaches the loss.
 * In the simulated step also a frozen weight the train layer says needs a
 * gradient (frozen_rg: FSDP1 use_orig_params, parallel_fsdp.c); the counting
 * pass keeps it frozen (no optimizer state). */
/* the weights of this module part are parameters with requires_grad */
static int params_require_grad(const lctx *c)
{
    return (c->m->trainable || c->force_tw) && !c->force_frozen;
}

int op_trainable(const lctx *c)
{
    if (c->dead || c->unused)
        return 0;
    if (params_require_grad(c))
        return 1;
    return !c->counting && c->frozen_rg && c->frozen_rg(c, c->cur_row);
}

uint32_t op_row(lctx *c, const char *name, const char *kind)
{
    c->cur_row = sim_row_get(c->s, c->mi, name, kind);
    return c->cur_row;
}

/* register parameters of a row (counting pass): rows of the repeated layers
 * count their instances */
void op_param(lctx *c, uint32_t r, uint64_t n, int trainable)
{
    if (!c->counting || !n)
        return;
    sim_row *R = &c->s->rows[r];
    R->params = sim_add(c->s, R->params, n);
    if (trainable) {
        R->trainable = sim_add(c->s, R->trainable, n);
        R->trainable_count++;
    }
    R->count++;
    if (n > c->largest_param)
        c->largest_param = n;
    uint64_t gb = R->pesz && !c->amp ? R->pesz : c->gdt; /* the .grad's dtype */
    if (!c->per_layer)
        return;
    sim *s = c->s;
    uint64_t *tp = sim_layer_slot(s, s->layer_tp, c->mi, c->layer);
    uint64_t *g = sim_layer_slot(s, s->layer_gb, c->mi, c->layer);
    uint64_t *p = sim_layer_slot(s, s->layer_p, c->mi, c->layer);
    if (trainable && tp)
        *tp = sim_add(s, *tp, n);
    if (trainable && g)
        *g = sim_add(s, *g, sim_mul(s, n, gb));
    if (p)
        *p = sim_add(s, *p, n);
}

uint64_t op_mul(lctx *c, uint64_t a, uint64_t b)
{
    return sim_mul(c->s, a, b);
}

uint64_t op_mul3(lctx *c, uint64_t a, uint64_t b, uint64_t cc)
{
    return sim_mul3(c->s, a, b, cc);
}

int32_t op_new(lctx *c, uint32_t r, uint64_t elems, uint64_t bytes_per)
{
    if (c->counting)
        return -1;
    int32_t id = sim_alloc(c->s, r, sim_mul(c->s, elems, bytes_per), F_TEMP, 0);
    if (id >= 0)
        c->s->t[id].esz = (uint8_t)bytes_per;
    return id;
}

int32_t op_view(lctx *c, uint32_t r, int32_t base, uint64_t vbytes)
{
    if (c->counting || base < 0)
        return -1;
    return sim_view(c->s, r, base, vbytes);
}

static uint64_t esz(const lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].esz ? c->s->t[id].esz : c->dt;
}

/* Record a backward node when autograd would: grad mode and some input needs
 * a gradient (or the op owns trainable weights). */
sim_node *op_node(lctx *c, uint32_t r, int32_t out, int32_t in0, int32_t in1, int32_t in2,
                  int trainable_w)
{
    if (c->counting || !c->grad)
        return NULL;
    /* no arrays here: this runs for every op, and an array costs a stack guard */
    int rg0 = op_rg(c, in0), rg1 = op_rg(c, in1), rg2 = op_rg(c, in2);
    if (!(trainable_w | rg0 | rg1 | rg2))
        return NULL;
    sim_node *n = sim_node_new(c->s, r, out);
    if (!n)
        return NULL;
    _Static_assert(SIM_MAX_IN >= 3, "op_node records up to 3 inputs");
    /* every input fits.  An input that is the output (in
     * place) needs the gradient the node gave it. */
    if (rg0 || (out >= 0 && in0 == out))
        n->in[n->nin++] = in0;
    if (rg1 || (out >= 0 && in1 == out))
        n->in[n->nin++] = in1;
    if (rg2 || (out >= 0 && in2 == out))
        n->in[n->nin++] = in2;
    return n;
}

void op_save(lctx *c, sim_node *n, int32_t id)
{
    if (n)
        sim_save(c->s, n, id);
}

/* a weight gradient of `elems` parameters in the gradient dtype */
void op_wgrad(lctx *c, sim_node *n, uint64_t elems)
{
    op_wgrad_e(c, n, elems, c->gdt);
}

void op_wgrad_e(lctx *c, sim_node *n, uint64_t elems, uint64_t gdt)
{
    if (!n)
        return;
    n->wgrad_bytes = sim_add(c->s, n->wgrad_bytes, sim_mul(c->s, elems, gdt));
    if (c->amp && gdt != c->dt) /* autocast: a bf16 grad, then AccumulateGrad to fp32 */
        n->bwd_tmp = sim_add(c->s, n->bwd_tmp, sim_mul(c->s, elems, c->dt));
    /* ZeRO-2/3 and FSDP reduce it into a bucket; with gradient accumulation it is
     * added into the .grad of the previous micro-step: a temporary either way */
    n->wgrad_transient = (uint8_t)(c->zero >= 2 || c->grads_accumulate);
    if (c->grads_sharded) { /* made full, reduced, its 1/N slice kept */
        n->bwd_tmp = sim_add(c->s, n->bwd_tmp, sim_mul(c->s, elems, gdt));
        n->wgrad_sharded = 1;
        n->wgrad_transient = 0;
    }
}

void op_label(lctx *c, const char *l, uint32_t r)
{
    if (!c->counting)
        sim_label(c->s, l, r);
}

/* ---- elementwise ------------------------------------------------------------------ */

int32_t op_plain(lctx *c, uint32_t r, int32_t a, int32_t b, uint64_t elems, uint64_t bytes)
{
    int32_t y = op_new(c, r, elems, bytes);
    op_node(c, r, y, a, b, -1, 0);
    return y;
}

/* AddBackward hands the same gradient to both inputs: no new bytes */
int32_t op_add(lctx *c, uint32_t r, int32_t a, int32_t b, uint64_t elems, uint64_t bytes)
{
    uint64_t e = bytes ? bytes : (esz(c, a) > esz(c, b) ? esz(c, a) : esz(c, b));
    int32_t y = op_new(c, r, elems, e);
    sim_node *n = op_node(c, r, y, a, b, -1, 0);
    if (n)
        n->grad_views = 1;
    return y;
}

/* MulBackward0 keeps each operand for the other's gradient */
int32_t op_mul_saved(lctx *c, uint32_t r, int32_t a, int32_t b, uint64_t elems, uint64_t bytes)
{
    int32_t y = op_new(c, r, elems, bytes);
    sim_node *n = op_node(c, r, y, a, b, -1, 0);
    if (n) {
        if (op_rg(c, a))
            op_save(c, n, b);
        if (op_rg(c, b))
            op_save(c, n, a);
    }
    return y;
}

/* ---- autocast's weight casts --------------------------------------------------------- */

/* another reference to id that lives until the forward ends (autocast's cast
 * cache, the KV cache of the model output) */
void op_hold_forward(lctx *c, int32_t id)
{
    if (id < 0 || c->counting)
        return;
    if (c->n_amp == c->cap_amp) {
        size_t cap = c->cap_amp ? c->cap_amp * 2 : 256;
        int32_t *p = realloc(c->amp_cache, cap * sizeof *p);
        if (!p) {
            c->s->oom = 1;
            return;
        }
        c->amp_cache = p;
        c->cap_amp = cap;
    }
    op_hold(c, id);
    c->amp_cache[c->n_amp++] = id;
}

/* autocast's cast of a weight: trainable fp32 leaves are cached until the
 * autocast region ends (autocast_mode.cpp cached_cast: requires_grad leaf).
 * The test is the parameter's requires_grad, not whether its layer's output
 * reaches the loss: a tower layer past the selected feature layer (run, its
 * output dropped) still leaves its weights' casts in the cache. */
int32_t op_weight_cast(lctx *c, uint32_t r, uint64_t np, int trainable)
{
    if (!c->amp || c->wdt == c->dt)
        return -1;
    int32_t w = op_new(c, r, np, c->dt);
    int leaf_rg = params_require_grad(c) && !c->unused;
    /* autocast_mode.cpp cached_cast caches only `arg.is_leaf() && !arg.is_view()`:
     * a frozen weight that needs a gradient through frozen_rg is a view of FSDP1's
     * flat parameter, never cached (FSDP1's trainable weights are views too: left
     * as they were, unmeasured) */
    if (w >= 0 && (trainable || (c->dead && leaf_rg)) && !c->recompute && !(c->frozen_rg && !c->m->trainable))
        op_hold_forward(c, w);
    return w;
}

/* ---- selective activation checkpointing (op policy) ------------------------------- */

/* torchtitan (TOML configs, e.g. @ 9810191bb^) torchtitan/distributed/activation_checkpoint.py
 * _apply_op_sac: the policy returns MUST_SAVE for the ops of _op_sac_save_list
 * (models/llama3/infra/parallelize.py l.36-51: aten.mm, the SDPA flash /
 * efficient / cuDNN kernels, reduce_scatter, max, ...) except every second
 * aten.mm (l.110-117: the count is bumped first, even counts recompute), and
 * PREFER_RECOMPUTE for the rest.  torch.utils.checkpoint's
 * _CachingTorchDispatchMode keeps a MUST_SAVE output from the forward; in the
 * re-run _CachedTorchDispatchMode pops it instead of running the op. */
static int sac_push(sac_cache *q, int32_t id)
{
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 256;
        int32_t *p = realloc(q->ids, cap * sizeof *p);
        if (!p)
            return -1;
        q->ids = p;
        q->cap = cap;
    }
    q->ids[q->n++] = id;
    return 0;
}

void op_sac_begin(lctx *c, uint64_t layer, int recompute)
{
    sac_cache *q = c->sac;
    c->sac_mm = 0;
    if (!q || layer >= MM_MAX_LAYERS)
        return;
    size_t k = (size_t)c->mi * MM_MAX_LAYERS + layer;
    if (recompute) {
        c->sac_rec = q->at[k] != 0;
        c->sac_pos = q->at[k] ? q->at[k] - 1 : 0;
        return;
    }
    q->at[k] = (uint32_t)q->n + 1;
    c->sac_fwd = 1;
}

/* the forward's run ends with -1; a re-run lets go of what it did not take back
 * (a non-reentrant re-run stops at the last tensor autograd saved) */
void op_sac_end(lctx *c)
{
    sac_cache *q = c->sac;
    if (c->sac_fwd && q && sac_push(q, -1))
        c->s->oom = 1;
    for (; c->sac_rec && q && c->sac_pos < q->n && q->ids[c->sac_pos] != -1; c->sac_pos++)
        op_drop(c, q->ids[c->sac_pos]);
    c->sac_fwd = c->sac_rec = 0;
}

int32_t op_sac_new(lctx *c, uint32_t r, uint64_t elems, uint64_t bytes_per)
{
    sac_cache *q = c->sac;
    if (c->sac_rec && q && c->sac_pos < q->n && q->ids[c->sac_pos] != -1)
        op_drop(c, q->ids[c->sac_pos++]); /* the cached output comes back: this one */
    int32_t id = op_new(c, r, elems, bytes_per);
    if (c->sac_fwd && q && id >= 0) {
        op_hold(c, id);
        if (sac_push(q, id))
            c->s->oom = 1;
    }
    return id;
}

int32_t op_mm_new(lctx *c, uint32_t r, uint64_t elems, uint64_t bytes_per)
{
    if (!c->sac_fwd && !c->sac_rec)
        return op_new(c, r, elems, bytes_per);
    c->sac_mm++;
    return c->sac_mm % 2 ? op_sac_new(c, r, elems, bytes_per) : op_new(c, r, elems, bytes_per);
}
