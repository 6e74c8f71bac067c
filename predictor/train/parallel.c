/* parallel.c - model states per strategy and the step's hand-offs to the
 * strategy files (see parallel.h, docs/parallel.md).
 *   DDP: full parameters, gradients and states; reduce buckets when N > 1.
 *   ZeRO-1/2/3 (DeepSpeed): 16-bit parameters (sharded at stage 3), fp32
 *     master weights and Adam states sharded; CPU offload moves the fp32
 *     states (and at stage 3 the 16-bit partitions) to the host.
 *   FSDP1/FSDP2: parameters sharded in the model dtype, units gathered in
 *     param_dtype around their forward and backward (parallel_fsdp.c). */
#include "parallel.h"
#include "step.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* the root unit: every parameter outside a wrapped layer */
static void root_sizes(par_state *ps, const resolved_model *rm)
{
    uint64_t p = 0, t = 0;
    for (uint32_t m = 0; m < rm->n_modules; m++) {
        uint64_t n = rm->modules[m].layers;
        for (uint64_t l = 0; l < n && l < MM_MAX_LAYERS; l++) {
            p += par_unit_params(ps, m, l);
            t += par_unit_trainable(ps, m, l);
        }
    }
    ps->root = ps->P_all > p ? ps->P_all - p : 0;
    ps->root_tr = ps->P_tr > t ? ps->P_tr - t : 0;
}

static void setup(par_state *ps, lctx *c, const resolved_model *rm, uint32_t llm)
{
    sim *s = c->s;
    const training_spec *t = &rm->training;
    memset(ps, 0, sizeof *ps);
    ps->rm = rm;
    ps->c = c;
    ps->kind = rm->parallel;
    ps->llm = llm;
    ps->partition = ps->bucket = ps->ddp_first = ps->ddp_cur = -1;
    for (size_t r = 0; r < s->nrows; r++) {
        ps->P_all = sim_add(s, ps->P_all, s->rows[r].params);
        ps->P_tr = sim_add(s, ps->P_tr, s->rows[r].trainable);
    }
    root_sizes(ps, rm);
    ps->P_grad = ps->P_tr;
    if (ps->kind == PAR_ZERO) {
        ps->P_grad = 0;
        for (size_t r = 0; r < s->nrows; r++)
            ps->P_grad = sim_add(s, ps->P_grad, par_requires_grad(ps, &s->rows[r]));
    }
    if (par_is_fsdp(ps))
        ps->store = rm->store;
    else
        ps->store = c->amp ? 4 : c->dt;
    ps->sdt = c->amp || t->zero_stage >= 1 ? 4 : par_is_fsdp(ps) ? ps->store : c->dt;
    ps->r_gather = sim_row_get(s, llm, "runtime.gathered_params", "runtime");
    ps->r_bucket = sim_row_get(s, llm, "runtime.reduce_buckets", "runtime");
    ps->r_part = sim_row_get(s, llm, "runtime.grad_partition", "runtime");
    ps->r_grads = sim_row_get(s, llm, "runtime.reduced_grads", "runtime");
    ps->r_step = sim_row_get(s, llm, "optimizer.step", "runtime");
    ps->z_xl = -1;
    if (par_is_fsdp(ps))
        fsdp_setup(ps, c);
    else if (ps->kind == PAR_ZERO && t->zero_stage < 3)
        zero_layout(ps, t->zero_stage == 2 && rm->deepspeed.round_robin_gradients, &ps->zl);
}

/* ZeRO-3's buffers for the whole run: the gradient partitions in the model
 * dtype (stage3.py grad_partitions_flat_buffer; data_types.grad_accum_dtype
 * unset = the model dtype, engine.py) and the IPG bucket when
 * contiguous_gradients (stage3.py:782) */
static void zero3_buffers(par_state *ps, lctx *c)
{
    sim *s = c->s;
    const deepspeed_spec *d = &ps->rm->deepspeed;
    zero3_setup(ps);
    if (ps->P_grad && !d->offload_optimizer)
        ps->partition = sim_alloc(s, ps->r_part, sim_mul(s, ps->P_grad, c->dt), F_GRAD,
                                  SIM_SHARDED);
    if (d->contiguous_gradients)
        ps->bucket = sim_alloc(s, ps->r_bucket, sim_mul(s, zero_bucket(ps), c->dt), F_GRAD, 0);
}

/* bytes a pinned host buffer of x bytes takes beyond x: tensor.pin_memory() goes
 * through torch's CachingHostAllocator, which rounds every block up to a power of
 * two (ATen/core/CachingHostAllocator.h:300-305; pinned_max_round_threshold is
 * unlimited unless PYTORCH_CUDA_ALLOC_CONF sets it, c10/core/AllocatorConfig.h:361) */
static uint64_t pow2_slack(uint64_t x)
{
    uint64_t p = 1;
    while (p < x && p <= UINT64_MAX / 2)
        p *= 2;
    return p > x ? p - x : 0;
}

/* deepspeed.pin_memory with offload_optimizer: the buffers DeepSpeed 0.19.8 pins
 * (get_accelerator().pin_memory) are rounded up.  ZeRO-1/2: the rank's fp32 master
 * partition (stage_1_and_2.py:560-565) and its fp32 .grad (:940-941), one flat
 * group each as the host model counts them.  ZeRO-3: the gradient partitions'
 * flat buffer in the model dtype (stage3.py:791-795). */
static uint64_t pinned_slack(par_state *ps, sim *s, const resolved_model *rm)
{
    const deepspeed_spec *d = &rm->deepspeed;
    uint64_t N = s->dp ? s->dp : 1;
    if (ps->kind != PAR_ZERO || !d->offload_optimizer || !d->pin_memory || !ps->P_tr)
        return 0;
    if (rm->training.zero_stage == 3)
        return pow2_slack(mm_ceil_div(sim_mul(s, ps->P_grad, ps->store), N));
    return sim_mul(s, pow2_slack(mm_ceil_div(sim_mul(s, ps->P_tr, 4), N)), 2);
}

/* what goes to the host with CPU offload, per rank */
static void host_states(par_state *ps, sim *s, const resolved_model *rm, uint64_t states)
{
    uint64_t N = s->dp ? s->dp : 1;
    const deepspeed_spec *d = &rm->deepspeed;
    uint64_t h = 0;
    if (ps->kind == PAR_ZERO && d->offload_optimizer) /* fp32 master, fp32 grads, states */
        h = sim_add(s, h, mm_ceil_div(sim_add(s, sim_mul(s, ps->P_tr, 8), states), N));
    if (ps->kind == PAR_ZERO && d->offload_param)
        h = sim_add(s, h, mm_ceil_div(sim_mul(s, ps->P_all, ps->store), N));
    if (par_is_fsdp(ps) && rm->fsdp.cpu_offload)
        h = sim_add(s, h, mm_ceil_div(sim_add(s, sim_add(s, sim_mul(s, ps->P_all, ps->store),
                                                         sim_mul(s, ps->P_grad, ps->store)),
                                              states), N));
    s->host_bytes = sim_add(s, s->host_bytes, sim_add(s, h, pinned_slack(ps, s, rm)));
}

/* one row's parameters, optimizer states and persistent gradients */
static uint64_t row_model_states(par_state *ps, lctx *c, uint32_t r, int offl_opt, int offl_par)
{
    sim *s = c->s;
    const training_spec *t = &ps->rm->training;
    int zero = ps->kind == PAR_ZERO ? t->zero_stage : 0, fsdp = par_is_fsdp(ps);
    int paged = t->optimizer == OPT_PAGED_ADAMW || t->optimizer == OPT_PAGED_ADAMW_8BIT;
    sim_row *R = &s->rows[r];
    uint64_t bytes = R->qbytes ? R->qbytes : sim_mul(s, R->params, R->pesz ? R->pesz : ps->store);
    if (R->params && !offl_par)
        sim_alloc(s, r, bytes, F_PARAM, zero == 3 || fsdp);
    sim_row rg = *R; /* DeepSpeed's flat partitions cover every requires_grad parameter */
    if (zero)
        rg.trainable = par_requires_grad(ps, R);
    if (!rg.trainable)
        return 0;
    uint64_t st = row_states(ps, s, &rg, t->optimizer);
    if (zero) /* fp32 master weights */
        st = sim_add(s, st, sim_mul(s, rg.trainable, 4));
    if (paged)
        s->outside_bytes = sim_add(s, s->outside_bytes, zero || fsdp ? mm_ceil_div(st, s->dp) : st);
    else if (st && !offl_opt)
        sim_alloc(s, r, st, F_OPT, zero >= 1 || fsdp);
    if (t->grad_accum > 1 && zero <= 1 && !fsdp) /* .grad alive across micro-steps */
        sim_alloc(s, r, sim_mul(s, R->trainable, c->gdt), F_GRAD, 0);
    return st;
}

/* FSDP1's chunks hold unequal shares of the trainable parameters: the busiest
 * rank's optimizer states beyond an even share (parallel_fsdp.c) */
static void fsdp1_uneven_states(par_state *ps, sim *s, int offl_opt)
{
    const training_spec *t = &ps->rm->training;
    if (ps->kind != PAR_FSDP1 || offl_opt || t->optimizer == OPT_PAGED_ADAMW ||
        t->optimizer == OPT_PAGED_ADAMW_8BIT)
        return;
    sim_row x = {.count = 1, .trainable_count = 1};
    x.trainable = fsdp1_state_excess(ps);
    uint64_t st = x.trainable ? row_states(ps, s, &x, t->optimizer) : 0;
    if (st)
        sim_alloc(s, ps->r_step, st, F_OPT, SIM_FIXED);
}

/* Gradient accumulation under FSDP the HF Trainer / Accelerate way: every
 * micro-batch but the last runs under no_sync (transformers trainer.py,
 * _inner_training_loop: sync_context = accelerator.no_sync unless
 * sync_each_batch; accelerate accelerator.py no_sync: FSDP2
 * set_requires_gradient_sync(False), else model.no_sync()).  The unsharded
 * gradients then stay alive between micro-batches: FSDP1 keeps the flat
 * parameter's unsharded .grad in the compute dtype (fsdp/_runtime_utils.py,
 * _post_backward_hook returns before the reduce-scatter when not
 * _sync_gradients); FSDP2 keeps each unsharded .grad, upcast to reduce_dtype
 * when a MixedPrecisionPolicy sets one that differs
 * (_fsdp_param.py to_accumulated_grad_if_needed).  Bytes per trainable
 * parameter, unsharded. */
static uint64_t no_sync_bytes(const par_state *ps)
{
    const fsdp_spec *f = &ps->rm->fsdp;
    if (ps->kind == PAR_FSDP2 && f->mixed_precision && ps->rdt != ps->pdt)
        return ps->rdt;
    return ps->pdt;
}

void par_model_states(par_state *ps, lctx *c, const resolved_model *rm, uint32_t llm)
{
    sim *s = c->s;
    const training_spec *t = &rm->training;
    setup(ps, c, rm, llm);
    sim_set_phase(s, MM_PHASE_FORWARD);
    sim_label(s, "model states", 0);
    int zero = ps->kind == PAR_ZERO ? t->zero_stage : 0, fsdp = par_is_fsdp(ps);
    int offl_opt = (zero && rm->deepspeed.offload_optimizer) || (fsdp && rm->fsdp.cpu_offload);
    int offl_par = (zero == 3 && rm->deepspeed.offload_param) || (fsdp && rm->fsdp.cpu_offload);
    uint64_t all_states = 0;
    size_t nrows = s->nrows;
    for (size_t r = 0; r < nrows; r++)
        all_states = sim_add(s, all_states, row_model_states(ps, c, (uint32_t)r, offl_opt, offl_par));
    host_states(ps, s, rm, all_states);
    fsdp1_uneven_states(ps, s, offl_opt);
    if (ps->kind == PAR_DDP)
        ddp_buckets(ps, c);
    if (zero == 3)
        zero3_buffers(ps, c);
    uint64_t gb = fsdp ? ps->store : c->dt, ga = fsdp ? fsdp_accum_grad_elems(ps) : ps->P_grad;
    if (t->grad_accum > 1 && fsdp && !rm->fsdp.sync_each_micro_batch && ps->P_grad && !offl_opt)
        ps->partition = sim_alloc(s, ps->r_part, sim_mul(s, ga, no_sync_bytes(ps)), F_GRAD, 0);
    else if (t->grad_accum > 1 && (zero == 2 || fsdp) && ps->P_grad && !offl_opt)
        ps->partition = sim_alloc(s, ps->r_part, sim_mul(s, ga, gb), F_GRAD, 1);
    ps->step_mark = (int32_t)s->nt;
}

/* ---- the step's hand-offs ---------------------------------------------------------- */

void par_forward_begin(par_state *ps, lctx *c)
{
    (void)c;
    if (par_is_fsdp(ps))
        fsdp_forward_begin(ps);
    else if (ps->kind == PAR_ZERO && ps->rm->training.zero_stage == 3)
        zero3_forward_begin(ps);
}

void par_forward_end(par_state *ps, lctx *c)
{
    if (ps->kind == PAR_DDP)
        ddp_forward_end(ps, c);
    else if (par_is_fsdp(ps))
        fsdp_forward_end(ps);
    else if (ps->kind == PAR_ZERO && ps->rm->training.zero_stage == 3)
        zero3_forward_end(ps);
}

void par_backward_begin(par_state *ps, lctx *c)
{
    if (ps->kind == PAR_DDP)
        ddp_backward_begin(ps, c);
    else if (par_is_fsdp(ps))
        fsdp_backward_begin(ps);
    else
        zero_backward_begin(ps);
}

void par_backward_end(par_state *ps, lctx *c)
{
    c->s->on_wgrad = NULL;
    if (par_is_fsdp(ps))
        fsdp_backward_end(ps);
    else if (ps->kind == PAR_ZERO)
        zero_backward_end(ps);
}
