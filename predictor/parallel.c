/* parallel.c - model states and runtime buffers per strategy (see
 * parallel.h).  Per rank, N-way data parallel; "sharded" tensors are divided
 * by N on the timeline (sim.c), so one run serves every N.
 *   DDP: full parameters, gradients and states; gradient buckets (a second
 *     copy of the gradients) when N > 1 (torch DistributedDataParallel,
 *     gradient_as_bucket_view=False).
 *   ZeRO-1/2/3 (DeepSpeed, bf16/fp16): 16-bit parameters (sharded at stage 3),
 *     fp32 master weights and Adam states sharded; stage 2/3 reduce gradients
 *     through buckets into a sharded partition (DeepSpeed's estimators:
 *     ZeRO-2 2P + 18P/N, ZeRO-3 18P/N); CPU offload moves the fp32 states (and
 *     at stage 3 the 16-bit partitions) to the host.
 *   FSDP1: a flat parameter per wrapped unit (each transformer layer, the rest
 *     in the root), sharded in the load dtype; units gathered in param_dtype for
 *     their forward and backward (the root for the whole step), the current and
 *     a prefetched one; with use_orig_params a unit that mixes frozen and
 *     trainable parameters gets a gradient for all of it.
 *   FSDP2: the same per parameter (DTensor shards): no mixed-unit penalty. */
#include "parallel.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int is_fsdp(const par_state *ps)
{
    return ps->kind == PAR_FSDP1 || ps->kind == PAR_FSDP2;
}

/* bytes of optimizer state per trainable parameter, in state dtype sdt */
static uint64_t state_bytes(optimizer_kind o, uint64_t sdt)
{
    switch (o) {
    case OPT_ADAMW:
    case OPT_ADAM:
    case OPT_PAGED_ADAMW: return 2 * sdt;      /* exp_avg, exp_avg_sq */
    case OPT_SGD: return 0;
    case OPT_SGD_MOMENTUM: return sdt;          /* momentum_buffer */
    case OPT_ADAMW_8BIT:
    case OPT_PAGED_ADAMW_8BIT: return 2;        /* two uint8 states (+ absmax, below) */
    case OPT_ADAFACTOR: return 0;
    }
    return 0;
}

/* Adafactor (transformers.optimization.Adafactor, beta1 None): a factored
 * second moment for matrices (a row and a column vector, fp32), a full one for
 * vectors */
static uint64_t adafactor_bytes(sim *s, const sim_row *R)
{
    uint64_t n = R->count ? R->count : 1;
    if (R->mat_rows && R->mat_cols)
        return sim_mul3(s, R->mat_rows + R->mat_cols, 4, R->trainable_count ? R->trainable_count : n);
    return sim_mul(s, R->trainable, 4);
}

static uint64_t row_states(par_state *ps, sim *s, const sim_row *R, optimizer_kind o)
{
    uint64_t sdt = R->pesz > ps->sdt ? R->pesz : ps->sdt; /* zeros_like(param) */
    uint64_t st = o == OPT_ADAFACTOR ? adafactor_bytes(s, R)
                                     : sim_mul(s, R->trainable, state_bytes(o, sdt));
    if (o == OPT_ADAMW_8BIT || o == OPT_PAGED_ADAMW_8BIT) /* fp32 absmax per 256 values, x2 */
        st = sim_add(s, st, sim_mul(s, (R->trainable + 255) / 256, 8));
    return st;
}

/* unit sizes: the largest layer (rows repeated per layer) and the root (the rest) */
static void unit_sizes(par_state *ps, sim *s, const mm_spec *sp)
{
    ps->largest_layer = ps->root = 0;
    uint64_t grad = 0;
    for (size_t mi = 0; mi < sp->n_modules; mi++) {
        uint64_t per = 0, layers = 0, root = 0;
        int tr_layers = 0, tr_root = 0;
        for (size_t r = 0; r < s->nrows; r++) {
            const sim_row *R = &s->rows[r];
            if (R->module != mi || !R->params)
                continue;
            if (R->count > 1) {
                per = sim_add(s, per, R->params / R->count);
                layers = sim_add(s, layers, R->params);
                tr_layers |= R->trainable > 0;
            } else {
                root = sim_add(s, root, R->params);
                tr_root |= R->trainable > 0;
            }
        }
        if (per > ps->largest_layer)
            ps->largest_layer = per;
        ps->root = sim_add(s, ps->root, root);
        grad = sim_add(s, grad, sim_add(s, tr_layers ? layers : 0, tr_root ? root : 0));
    }
    /* FSDP1 use_orig_params: a unit with any trainable parameter has a gradient
     * for its whole flat parameter */
    ps->P_grad = ps->kind == PAR_FSDP1 ? grad : ps->P_tr;
}

static void setup(par_state *ps, lctx *c, const mm_spec *sp, uint32_t llm)
{
    sim *s = c->s;
    const training_spec *t = &sp->training;
    memset(ps, 0, sizeof *ps);
    ps->sp = sp;
    ps->kind = sp->fsdp.version ? (sp->fsdp.version == 2 ? PAR_FSDP2 : PAR_FSDP1)
                                : t->zero_stage ? PAR_ZERO : PAR_DDP;
    ps->llm = llm;
    ps->partition = ps->gathered = ps->bucket = ps->root_buf = -1;
    for (size_t r = 0; r < s->nrows; r++) {
        ps->P_all = sim_add(s, ps->P_all, s->rows[r].params);
        ps->P_tr = sim_add(s, ps->P_tr, s->rows[r].trainable);
    }
    unit_sizes(ps, s, sp);
    if (is_fsdp(ps))
        ps->store = sp->fsdp.fp32_loaded ? 4 : c->dt;
    else
        ps->store = c->amp ? 4 : c->dt;
    ps->sdt = c->amp || t->zero_stage >= 1 || (is_fsdp(ps) && sp->fsdp.fp32_loaded) ? 4 : c->dt;
    ps->r_gather = sim_row_get(s, llm, "runtime.gathered_params", "runtime");
    ps->r_bucket = sim_row_get(s, llm, "runtime.reduce_buckets", "runtime");
    ps->r_part = sim_row_get(s, llm, "runtime.grad_partition", "runtime");
    ps->r_step = sim_row_get(s, llm, "optimizer.step", "runtime");
}

/* what goes to the host with CPU offload, per rank */
static void host_states(par_state *ps, sim *s, const mm_spec *sp, uint64_t states)
{
    uint64_t N = s->dp ? s->dp : 1;
    const deepspeed_spec *d = &sp->deepspeed;
    uint64_t h = 0;
    if (ps->kind == PAR_ZERO && d->offload_optimizer) /* fp32 master, fp32 grads, states */
        h = sim_add(s, h, mm_ceil_div(sim_add(s, sim_mul(s, ps->P_tr, 8), states), N));
    if (ps->kind == PAR_ZERO && d->offload_param)
        h = sim_add(s, h, mm_ceil_div(sim_mul(s, ps->P_all, ps->store), N));
    if (is_fsdp(ps) && sp->fsdp.cpu_offload)
        h = sim_add(s, h, mm_ceil_div(sim_add(s, sim_add(s, sim_mul(s, ps->P_all, ps->store),
                                                         sim_mul(s, ps->P_grad, ps->store)),
                                              states), N));
    s->host_bytes = sim_add(s, s->host_bytes, h);
}

void par_model_states(par_state *ps, lctx *c, const mm_spec *sp, uint32_t llm)
{
    sim *s = c->s;
    const training_spec *t = &sp->training;
    setup(ps, c, sp, llm);
    sim_set_phase(s, MM_PHASE_FORWARD);
    sim_label(s, "model states", 0);
    int zero = ps->kind == PAR_ZERO ? t->zero_stage : 0, fsdp = is_fsdp(ps);
    int offl_opt = (zero && sp->deepspeed.offload_optimizer) || (fsdp && sp->fsdp.cpu_offload);
    int offl_par = (zero == 3 && sp->deepspeed.offload_param) || (fsdp && sp->fsdp.cpu_offload);
    int paged = t->optimizer == OPT_PAGED_ADAMW || t->optimizer == OPT_PAGED_ADAMW_8BIT;
    uint64_t all_states = 0;
    size_t nrows = s->nrows;
    for (size_t r = 0; r < nrows; r++) {
        sim_row *R = &s->rows[r];
        uint64_t bytes = R->qbytes ? R->qbytes : sim_mul(s, R->params, R->pesz ? R->pesz : ps->store);
        if (R->params && !offl_par)
            sim_alloc(s, (uint32_t)r, bytes, F_PARAM, zero == 3 || fsdp);
        if (!R->trainable)
            continue;
        uint64_t st = row_states(ps, s, R, t->optimizer);
        if (zero) /* fp32 master weights */
            st = sim_add(s, st, sim_mul(s, R->trainable, 4));
        all_states = sim_add(s, all_states, st);
        if (paged)
            s->outside_bytes = sim_add(s, s->outside_bytes,
                                       zero || fsdp ? mm_ceil_div(st, s->dp) : st);
        else if (st && !offl_opt)
            sim_alloc(s, (uint32_t)r, st, F_OPT, zero >= 1 || fsdp);
        if (t->grad_accum > 1 && zero <= 1 && !fsdp) /* .grad alive across micro-steps */
            sim_alloc(s, (uint32_t)r, sim_mul(s, R->trainable, c->gdt), F_GRAD, 0);
        if (ps->kind == PAR_DDP) /* DDP gradient buckets (a full copy), only when N > 1 */
            sim_alloc(s, (uint32_t)r, sim_mul(s, R->trainable, c->gdt), F_GRAD, SIM_MULTI);
    }
    host_states(ps, s, sp, all_states);
    uint64_t gb = zero == 3 ? 4 : fsdp ? ps->store : c->dt;
    if (t->grad_accum > 1 && (zero >= 2 || fsdp) && ps->P_grad && !offl_opt)
        ps->partition = sim_alloc(s, ps->r_part, sim_mul(s, ps->P_grad, gb), F_GRAD, 1);
}

/* DeepSpeed ZeRO-3 params below stage3_param_persistence_threshold stay
 * gathered (auto: 10 x hidden, transformers' deepspeed integration) */
static uint64_t persistent_small(const par_state *ps, sim *s, uint64_t thr)
{
    uint64_t n = 0;
    for (size_t r = 0; r < s->nrows; r++) {
        const sim_row *R = &s->rows[r];
        uint64_t per = R->params / (R->count ? R->count : 1);
        if (R->params && per < thr)
            n = sim_add(s, n, R->params);
    }
    (void)ps;
    return n;
}

static uint64_t decoder_hidden(const mm_spec *sp)
{
    const module_spec *d = mm_spec_module(sp, MOD_DECODER);
    return d ? d->hidden_size : 0;
}

void par_forward_begin(par_state *ps, lctx *c)
{
    sim *s = c->s;
    const mm_spec *sp = ps->sp;
    const deepspeed_spec *d = &sp->deepspeed;
    uint64_t h = decoder_hidden(sp);
    if (ps->kind == PAR_ZERO && sp->training.zero_stage == 3) {
        /* the layer being run plus what stage3_prefetch_bucket_size lets it
         * fetch ahead, capped by stage3_max_live_parameters; the persistent
         * small parameters are always there */
        uint64_t pre = d->prefetch_bucket_size ? d->prefetch_bucket_size
                                               : (uint64_t)(0.9 * (double)h * (double)h);
        uint64_t live = sim_add(s, ps->largest_layer, pre < ps->largest_layer ? pre : ps->largest_layer);
        if (live > d->max_live_parameters && d->max_live_parameters >= ps->largest_layer)
            live = d->max_live_parameters;
        uint64_t thr = d->param_persistence_threshold ? d->param_persistence_threshold : 10 * h;
        live = sim_add(s, live, persistent_small(ps, s, thr));
        ps->gathered = sim_alloc(s, ps->r_gather, sim_mul(s, live, c->dt), F_PARAM, 0);
    } else if (is_fsdp(ps)) {
        const fsdp_spec *f = &sp->fsdp;
        uint64_t pdt = mm_dtype_bytes(f->param_dtype);
        /* the root unit stays gathered; each layer unit is gathered for its
         * forward with the next prefetched (limit_all_gathers allows two in
         * flight); without resharding after forward every unit stays */
        ps->root_buf = sim_alloc(s, ps->r_gather, sim_mul(s, ps->root, pdt), F_PARAM, 0);
        uint64_t units = f->limit_all_gathers ? 2 : 3;
        uint64_t g = sim_mul(s, ps->largest_layer, units);
        if (!f->reshard_after_forward)
            g = ps->P_all > ps->root ? ps->P_all - ps->root : 0;
        ps->gathered = sim_alloc(s, ps->r_gather, sim_mul(s, g, pdt), F_PARAM, 0);
    }
}

void par_backward_begin(par_state *ps, lctx *c)
{
    sim *s = c->s;
    const mm_spec *sp = ps->sp;
    const deepspeed_spec *d = &sp->deepspeed;
    int zero = ps->kind == PAR_ZERO ? sp->training.zero_stage : 0;
    int offl = (zero && d->offload_optimizer) || (is_fsdp(ps) && sp->fsdp.cpu_offload);
    if (!ps->P_grad)
        return;
    if (zero >= 2) {
        uint64_t rb = d->reduce_bucket_size ? d->reduce_bucket_size
                                            : sim_mul(s, decoder_hidden(sp), decoder_hidden(sp));
        sim_label(s, "deepspeed reduce buckets", ps->r_bucket);
        ps->bucket = sim_alloc(s, ps->r_bucket, sim_mul3(s, rb, c->dt, d->overlap_comm ? 2 : 1),
                               F_GRAD, 0);
    }
    /* ZeRO-2 reduces into a 16-bit partition, ZeRO-3 into an fp32 one the
     * optimizer uses as is; FSDP into sharded grads in the storage dtype.
     * ZeRO-2 without contiguous_gradients keeps them per tensor (sim: sharded
     * weight gradients that persist), offload keeps them on the host */
    int contiguous = zero != 2 || d->contiguous_gradients;
    if (sp->training.grad_accum == 1 && (zero >= 2 || is_fsdp(ps)) && !offl && contiguous) {
        uint64_t gb = zero == 3 ? 4 : is_fsdp(ps) ? ps->store : c->dt;
        ps->partition = sim_alloc(s, ps->r_part, sim_mul(s, ps->P_grad, gb), F_GRAD, 1);
    }
}

void par_backward_end(par_state *ps, lctx *c)
{
    sim_drop(c->s, ps->bucket);
    sim_drop(c->s, ps->gathered);
    sim_drop(c->s, ps->root_buf);
    ps->bucket = ps->gathered = ps->root_buf = -1;
}

typedef struct piece_list {
    sim *s;
    uint32_t row;
    int32_t *ids;
    size_t n, cap;
} piece_list;

static void alloc_piece(void *ctx, uint32_t row, uint64_t bytes)
{
    piece_list *l = ctx;
    (void)row;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        int32_t *p = realloc(l->ids, cap * sizeof *p);
        if (!p) {
            l->s->oom = 1;
            return;
        }
        l->ids = p;
        l->cap = cap;
    }
    l->ids[l->n++] = sim_alloc(l->s, l->row, bytes, F_TEMP, 0);
}

/* torch._foreach_sqrt(exp_avg_sqs): one temporary per trainable parameter, all
 * alive together (torch/optim/adamw.py, _multi_tensor_adamw) */
static void foreach_sqrt(sim *s, uint32_t r_step, uint64_t sdt)
{
    uint64_t *rb = calloc(s->nrows + 1, sizeof *rb);
    piece_list l = {.s = s, .row = r_step};
    if (!rb) {
        s->oom = 1;
        return;
    }
    for (size_t r = 0; r < s->nrows; r++)
        rb[r] = sim_mul(s, s->rows[r].trainable, s->rows[r].pesz > sdt ? s->rows[r].pesz : sdt);
    sim_each_piece(s, rb, 1, alloc_piece, &l);
    for (size_t i = 0; i < l.n; i++)
        sim_drop(s, l.ids[i]);
    free(l.ids);
    free(rb);
}

void par_optimizer(par_state *ps, lctx *c)
{
    sim *s = c->s;
    const training_spec *t = &ps->sp->training;
    int zero = ps->kind == PAR_ZERO ? t->zero_stage : 0;
    int offl = (zero && ps->sp->deepspeed.offload_optimizer) ||
               (is_fsdp(ps) && ps->sp->fsdp.cpu_offload);
    sim_label(s, "optimizer step", ps->r_step);
    int adam = t->optimizer == OPT_ADAMW || t->optimizer == OPT_ADAM;
    if (ps->P_tr && !t->optimizer_in_backward && !offl) {
        if (zero == 1 || zero == 2) {
            /* DeepSpeed: the gradient partition converted to fp32 for the step */
            sim_transient_sharded(s, ps->r_step, sim_mul(s, ps->P_tr, 4));
        } else if (zero == 3) {
            /* the fp32 gradient partition is used as is (FusedAdam: no temporaries) */
        } else if (is_fsdp(ps) && adam && t->impl == IMPL_FOREACH) {
            sim_transient_sharded(s, ps->r_step, sim_mul(s, ps->P_tr, ps->sdt));
        } else if (adam && t->impl == IMPL_FOREACH) {
            foreach_sqrt(s, ps->r_step, ps->sdt);
        } else if (adam && t->impl == IMPL_FOR_LOOP) { /* denom per parameter */
            sim_transient(s, ps->r_step, sim_mul3(s, c->largest_param, ps->sdt, 2));
        } else if (t->optimizer == OPT_ADAFACTOR) {
            /* HF Adafactor: fp32 grad copy, update and param copy per parameter */
            sim_transient(s, ps->r_step, sim_mul3(s, c->largest_param, 4, 3));
        }
    }
    /* zero_grad(set_to_none=True) */
    for (size_t i = 0; i < s->nt; i++)
        if (s->t[i].alive && s->t[i].cls == F_GRAD && (int32_t)i != ps->partition &&
            s->t[i].base < 0)
            sim_drop(s, (int32_t)i);
    sim_drop(s, ps->partition);
    ps->partition = -1;
}
