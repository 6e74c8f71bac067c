/* stack.c - a module's run of transformer layers: gradient checkpointing per
 * layer (torch.utils.checkpoint, reentrant or not, every n-th layer, the
 * saved inputs optionally on the host) and the folding of identical layers.
 *
 * Folding: in a run of identical layer groups (a group is one period of the
 * layer pattern: 1 for uniform models, 6 for Gemma 3's 5 sliding + 1 global)
 * every event's live bytes are a per-group base, which changes by the same
 * amount from one group to the next, plus the same profile.  The maximum over
 * the middle groups is therefore always reached in an end group: simulating
 * groups 0, 1 and the last in full, and standing in for the M groups between
 * with a ballast (what each group leaves alive in forward; in backward swapped
 * for the groups' weight gradients), gives the same peak exactly.  A unit test
 * compares folded and unfolded runs.
 *
 * The counting pass folds the same groups: a folded group registers what group
 * 1 registered (its rows' parameters and instances, its per-layer table
 * entries), which is what running it would register. */
#include "ops.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

#define MAX_PERIOD 8

/* HF gradient_checkpointing_enable(every_n_layers): counted over every
 * GradientCheckpointingLayer in module order (vision blocks before decoder layers) */
static int ckpt_here(const lctx *c, uint64_t l)
{
    const ckpt_spec *k = &c->rm->training.ckpt;
    if (!c->ckpt || !c->grad || c->counting || c->recompute || c->m->no_ckpt)
        return 0;
    /* in module order (resolve.c: the tower's layers before the LLM's) */
    uint64_t base = c->rm->modules[c->mi].ckpt_base;
    return (base + l) % (k->every_n_layers ? k->every_n_layers : 1) == 0;
}

/* layer_class's bits above the LK_* ones (resolve.h) */
#define LC_CKPT (1u << 6)  /* checkpointed here */
#define LC_MERGE (1u << 7) /* DeepStack features added after it */

/* what distinguishes one layer's memory from another's */
static uint32_t layer_class(const lctx *c, uint64_t l)
{
    const module_spec *m = c->m;
    /* the per-layer lists, bits 0-5 (LK_SLIDING .. LK_TAP) */
    uint32_t k = resolved_layer_kind(c->rm, c->mi, l);
    if (ckpt_here(c, l))
        k |= LC_CKPT;
    if (m->kind == MOD_DECODER && l < c->ntaps && m->merge != MERGE_CROSS_ATTENTION)
        k |= LC_MERGE; /* DeepStack features are added after this layer */
    return k;
}

/* the loop does more than run the layers of period p from `start` (DeepStack
 * taps and merges, stack_run): the counting pass runs every layer */
static int counting_side_effects(const lctx *c, uint64_t start, uint64_t p)
{
    for (uint64_t l = start; l < start + p; l++)
        if (layer_class(c, l) & (LK_DEEPSTACK | LK_TAP | LC_MERGE))
            return 1;
    return 0;
}

typedef struct fold_plan {
    uint64_t start, period, groups; /* groups of `period` layers from `start` */
    int on;
} fold_plan;

/* the smallest period whose groups repeat from some layer to the end of the
 * run, with at least 5 groups (fewer saves nothing) */
static void plan_fold(const lctx *c, uint64_t first, uint64_t count, fold_plan *f)
{
    memset(f, 0, sizeof *f);
    if (c->nofold || count < 5)
        return;
    uint64_t end = first + count;
    for (uint64_t p = 1; p <= MAX_PERIOD && p * 5 <= count; p++) {
        uint64_t a = end - p; /* walk back while the class repeats with period p */
        while (a > first && layer_class(c, a - 1) == layer_class(c, a - 1 + p))
            a--;
        uint64_t g = (end - a) / p;
        if (g >= 5) {
            f->start = end - g * p;
            f->period = p;
            f->groups = g;
            f->on = !c->counting || !counting_side_effects(c, f->start, p);
            return;
        }
    }
}

/* ---- the counting pass's fold ---------------------------------------------------------- */

enum { CF_N = 5 }; /* what a row adds per instance: params, trainable, trainable_count,
                      count, qbytes (op_param, op_linear) */

static void row_vals(const sim_row *R, uint64_t *v)
{
    v[0] = R->params;
    v[1] = R->trainable;
    v[2] = R->trainable_count;
    v[3] = R->count;
    v[4] = R->qbytes;
}

/* the rows before group 1 (per row CF_N values), NULL with oom set */
static uint64_t *count_mark(lctx *c)
{
    sim *s = c->s;
    uint64_t *v = malloc((s->nrows ? s->nrows : 1) * CF_N * sizeof *v);
    if (!v) {
        s->oom = 1;
        return NULL;
    }
    for (size_t r = 0; r < s->nrows; r++)
        row_vals(&s->rows[r], &v[r * CF_N]);
    return v;
}

/* layers [from, to), groups of `period`, registered as group 1 (from g1) was:
 * each row gets group 1's additions once per folded group, each folded layer
 * the table entries of its layer in group 1 (0 until now: no other layer
 * writes them).  mark (count_mark's, `nmark` rows) is freed. */
static void count_fold(lctx *c, uint64_t *mark, size_t nmark, uint64_t g1, uint64_t from,
                       uint64_t to, uint64_t period)
{
    sim *s = c->s;
    uint64_t M = (to - from) / period;
    for (size_t r = 0; mark && r < s->nrows; r++) {
        sim_row *R = &s->rows[r];
        uint64_t now[CF_N], d[CF_N];
        row_vals(R, now);
        for (int k = 0; k < CF_N; k++) /* a row group 1 made: all it holds */
            d[k] = now[k] - (r < nmark ? mark[r * CF_N + k] : 0);
        R->params = sim_add(s, R->params, sim_mul(s, d[0], M));
        R->trainable = sim_add(s, R->trainable, sim_mul(s, d[1], M));
        R->trainable_count += (uint32_t)(d[2] * M); /* ++ once per instance: mod 2^32 alike */
        R->count += (uint32_t)(d[3] * M);
        R->qbytes = sim_add(s, R->qbytes, sim_mul(s, d[4], M));
    }
    free(mark);
    uint64_t *tabs[3] = {s->layer_tp, s->layer_gb, s->layer_p};
    for (uint64_t l = from; l < to; l++)
        for (int k = 0; k < 3; k++) {
            uint64_t *dst = sim_layer_slot(s, tabs[k], c->mi, l);
            if (dst)
                *dst = sim_layer_get(s, tabs[k], c->mi, g1 + (l - from) % period);
        }
}

/* weight gradients the folded layers would leave (persistent .grad only) */
static uint64_t folded_wgrad(lctx *c, uint64_t from, uint64_t to)
{
    if (c->zero >= 2 || c->grads_accumulate || !c->s->layer_gb)
        return 0;
    uint64_t n = 0;
    for (uint64_t l = from; l < to && l < MM_MAX_LAYERS; l++)
        n = sim_add(c->s, n, sim_layer_get(c->s, c->s->layer_gb, c->mi, l));
    return n;
}

/* saved: the folded groups left tensors for backward (else the growth was a
 * held tuple of hidden states, released with it); hdelta: what one group left
 * on the host (activation offloading) */
static int32_t ballast(lctx *c, uint64_t delta, uint64_t hdelta, uint64_t from, uint64_t to,
                       uint64_t M, int saved)
{
    uint32_t r = op_row(c, "layers.folded", "folded");
    op_label(c, "folded layers", r);
    int32_t b = sim_alloc(c->s, r, op_mul(c, delta, M), F_TEMP, 0);
    if (b < 0 || !saved)
        return b;
    int32_t hb = sim_host_tensor(c->s, r, op_mul(c, hdelta, M));
    sim_node *n = sim_node_new(c->s, r, -1);
    if (n) {
        n->free_first = 1;
        int off = c->s->offload_acts;
        c->s->offload_acts = 0; /* the device part stays on the device */
        sim_save(c->s, n, b);
        c->s->offload_acts = off;
        sim_save_host(c->s, n, hb);
        n->bwd_tmp = hdelta; /* each group's tensors come back for its own backward */
        n->wgrad_bytes = folded_wgrad(c, from, to);
    }
    sim_drop(c->s, b); /* now held by the node alone */
    return -1;
}

/* one layer, checkpointed or not */
static int32_t run_layer(lctx *c, int32_t x, uint64_t l)
{
    if (!ckpt_here(c, l))
        return block_layer(c, x, l);
    const ckpt_spec *k = &c->rm->training.ckpt;
    c->grad = 0; /* the saved tensors are not kept (holders, or no_grad) */
    if (k->granularity == CKPT_SELECTIVE_OP) /* what the op policy saves is kept */
        op_sac_begin(c, l, 0);
    int32_t y = block_layer(c, x, l);
    op_sac_end(c);
    c->grad = 1;
    int needs = c->m->trainable || c->m->lora.enabled || op_rg(c, x);
    sim_node *n = op_node(c, op_row(c, "layers.checkpoint", "checkpoint"), y, x, -1, -1, needs);
    if (n) {
        n->ckpt = 1;
        n->ckpt_layer = (uint32_t)l;
        n->ckpt_prog = (const void *)c->m;
        if (k->offload) /* save_on_cpu(pin_memory=True): the input waits on the host */
            sim_save_host(c->s, n, x);
        else
            op_save(c, n, x);
        n->aux[0] = x;
        int32_t aux[4] = {c->cos, c->sin, c->mask, c->mask_sliding};
        for (int i = 0; i < 4; i++) {
            op_save(c, n, aux[i]);
            n->aux[i + 1] = aux[i];
        }
        op_save(c, n, c->cross_states);
        n->aux[5] = c->cross_states;
        op_save(c, n, c->mask_cross);
        n->aux[6] = c->mask_cross;
        op_save(c, n, c->pos_ids); /* a kwarg of the layer call, held until its re-run */
    }
    return y;
}

/* the parallel strategy's view of the loop (FSDP units, ZeRO-3 fetches) */
static void layer_ev(lctx *c, uint64_t l, uint64_t n, int what)
{
    sim *s = c->s;
    if (!s->on_layer || c->counting)
        return;
    sim_layer_ev e = {.module = c->mi, .layer = l, .count = n, .what = what, .grad = c->grad};
    s->on_layer(s, &e, s->on_layer_ctx);
}

int32_t stack_run(lctx *c, int32_t x, uint64_t first, uint64_t count, int32_t *keep)
{
    fold_plan f;
    plan_fold(c, first, count, &f);
    uint64_t g1 = f.start + f.period, g2 = f.start + 2 * f.period;
    uint64_t last = f.start + (f.groups - 1) * f.period, before = 0, hbefore = 0;
    size_t tape0 = 0, nmark = 0;
    size_t nk = 0, nds = 0;
    uint64_t *mark = NULL;
    c->fold_from = c->fold_to = 0;
    for (uint64_t l = first; l < first + count; l++) {
        if (f.on && l == g1) {
            before = sim_live_fixed(c->s);
            hbefore = c->s->host_act;
            tape0 = c->s->ntape;
            nmark = c->s->nrows;
            mark = c->counting ? count_mark(c) : NULL;
        }
        if (f.on && l == g2 && c->counting) {
            count_fold(c, mark, nmark, g1, g2, last, f.period);
            for (; keep && l < last; l++) /* what the layers return while counting */
                keep[nk++] = -1;
            l = last;
        } else if (f.on && l == g2) {
            uint64_t delta = sim_live_fixed(c->s) - before, M = f.groups - 3;
            /* whether a group recorded anything for backward, before the folded
             * layers' own marker (FSDP's, parallel_fsdp.c) lands on the tape */
            int saved = c->s->ntape > tape0;
            layer_ev(c, g2, last - g2, SIM_LAYERS_FOLDED);
            int32_t b = ballast(c, delta, c->s->host_act - hbefore, g2, last, M, saved);
            c->fold_from = g2;
            c->fold_to = last;
            if (keep)
                keep[nk++] = b; /* a held hidden-state tuple: the ballast stands in */
            else
                op_drop(c, b);
            l = last;
        }
        layer_ev(c, l, 1, SIM_LAYER_BEGIN);
        size_t nt0 = c->s->nt;
        int32_t y = run_layer(c, x, l);
        layer_ev(c, l, 1, SIM_LAYER_END);
        if (l == first && !c->counting) /* the layers after it make as many tensors again,
                                        the backward up to 3 times the forward's (step.c) */
            sim_reserve(c->s, 5 * (c->s->nt + (c->s->nt - nt0) * (count - 1)));
        if (keep)
            keep[nk++] = y;
        else
            op_drop(c, x);
        x = y;
        if (c->m->kind == MOD_DECODER && l < c->ntaps && c->m->merge != MERGE_CROSS_ATTENTION)
            x = deepstack_add(c, x, l);
        if (c->m->kind == MOD_VISION && (resolved_layer_kind(c->rm, c->mi, l) & LK_DEEPSTACK) && nds < MAX_TAPS)
            c->taps[nds++] = connector_deepstack(c, x);
    }
    return x;
}
