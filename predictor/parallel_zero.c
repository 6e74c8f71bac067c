/* parallel_zero.c - DeepSpeed ZeRO stages 1-3 (see parallel.h,
 * docs/parallel.md). */
#include "parallel.h"
#include "util.h"

static uint64_t decoder_hidden(const mm_spec *sp)
{
    const module_spec *d = mm_spec_module(sp, MOD_DECODER);
    return d ? d->hidden_size : 0;
}

/* DeepSpeed ZeRO-3 params below stage3_param_persistence_threshold stay
 * gathered (auto: 10 x hidden, transformers' deepspeed integration) */
static uint64_t persistent_small(sim *s, uint64_t thr)
{
    uint64_t n = 0;
    for (size_t r = 0; r < s->nrows; r++) {
        const sim_row *R = &s->rows[r];
        uint64_t per = R->params / (R->count ? R->count : 1);
        if (R->params && per < thr)
            n = sim_add(s, n, R->params);
    }
    return n;
}

static uint64_t largest_layer(const par_state *ps)
{
    uint64_t m = 0;
    for (uint32_t mi = 0; mi < ps->sp->n_modules; mi++)
        for (uint64_t l = 0; l < MM_MAX_LAYERS && l < ps->sp->modules[mi].num_hidden_layers; l++)
            if (par_unit_params(ps, mi, l) > m)
                m = par_unit_params(ps, mi, l);
    return m;
}

void zero_forward_begin(par_state *ps)
{
    lctx *c = ps->c;
    sim *s = c->s;
    const deepspeed_spec *d = &ps->sp->deepspeed;
    uint64_t h = decoder_hidden(ps->sp);
    ps->gathered = -1;
    if (ps->sp->training.zero_stage != 3)
        return;
    uint64_t ll = largest_layer(ps);
    uint64_t pre = d->prefetch_bucket_size ? d->prefetch_bucket_size
                                           : (uint64_t)(0.9 * (double)h * (double)h);
    uint64_t live = sim_add(s, ll, pre < ll ? pre : ll);
    if (live > d->max_live_parameters && d->max_live_parameters >= ll)
        live = d->max_live_parameters;
    uint64_t thr = d->param_persistence_threshold ? d->param_persistence_threshold : 10 * h;
    live = sim_add(s, live, persistent_small(s, thr));
    ps->gathered = sim_alloc(s, ps->r_gather, sim_mul(s, live, c->dt), F_PARAM, 0);
}

void zero_forward_end(par_state *ps)
{
    (void)ps;
}

void zero_backward_begin(par_state *ps)
{
    lctx *c = ps->c;
    sim *s = c->s;
    const mm_spec *sp = ps->sp;
    const deepspeed_spec *d = &sp->deepspeed;
    int zero = sp->training.zero_stage;
    int offl = d->offload_optimizer;
    if (!ps->P_grad)
        return;
    if (zero >= 2) {
        uint64_t rb = d->reduce_bucket_size ? d->reduce_bucket_size
                                            : sim_mul(s, decoder_hidden(sp), decoder_hidden(sp));
        sim_label(s, "deepspeed reduce buckets", ps->r_bucket);
        ps->bucket = sim_alloc(s, ps->r_bucket, sim_mul3(s, rb, c->dt, d->overlap_comm ? 2 : 1),
                               F_GRAD, 0);
    }
    int contiguous = zero != 2 || d->contiguous_gradients;
    if (sp->training.grad_accum == 1 && zero >= 2 && !offl && contiguous) {
        uint64_t gb = zero == 3 ? 4 : c->dt;
        ps->partition = sim_alloc(s, ps->r_part, sim_mul(s, ps->P_grad, gb), F_GRAD, 1);
    }
}

void zero_backward_end(par_state *ps)
{
    sim_drop(ps->c->s, ps->bucket);
    sim_drop(ps->c->s, ps->gathered);
    ps->bucket = ps->gathered = -1;
}

void zero_step(par_state *ps, lctx *c)
{
    sim *s = c->s;
    int zero = ps->sp->training.zero_stage;
    if (zero == 1 || zero == 2) /* the gradient partition converted to fp32 for the step */
        sim_transient_sharded(s, ps->r_step, sim_mul(s, ps->P_tr, 4));
}
