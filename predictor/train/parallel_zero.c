/* parallel_zero.c - DeepSpeed ZeRO stages 1 and 2 around the backward and
 * the optimizer step: the reduce bucket, the gradient partition, and the
 * step's flat fp32 copies; at stage 3 it hands the backward to
 * parallel_zero3.c (see parallel.h, docs/parallel.md; DeepSpeed 0.19.8
 * runtime/zero/).  The partition layouts are in parallel_zero_layout.c. */
#include "parallel.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* reduce_bucket_size in elements; 0 ("auto") is transformers' hidden^2 */
uint64_t zero_bucket(const par_state *ps)
{
    uint64_t b = ps->rm->deepspeed.reduce_bucket_size, h = resolved_decoder_hidden(ps->rm);
    return b ? b : h * h;
}

/* the IPG bucket(s): setup_buckets at the first gradient, double with
 * overlap_comm (stage_1_and_2.py:3256-3278); none without contiguous_gradients */
static void ipg_buffer(par_state *ps)
{
    sim *s = ps->c->s;
    const deepspeed_spec *d = &ps->rm->deepspeed;
    if (ps->bucket >= 0 || !d->contiguous_gradients)
        return;
    sim_label(s, "deepspeed reduce bucket", ps->r_bucket);
    ps->bucket = sim_alloc(s, ps->r_bucket, sim_mul3(s, zero_bucket(ps), ps->c->dt,
                                                      d->overlap_comm ? 2 : 1), F_GRAD, 0);
}

/* grads_in_partition: allocated at the first copy into it (copy_grads_in_partition) */
static void grad_partition(par_state *ps)
{
    sim *s = ps->c->s;
    if (ps->partition >= 0 || !ps->rm->deepspeed.contiguous_gradients || ps->rm->deepspeed.offload_optimizer)
        return;
    uint64_t N = s->dp ? s->dp : 1;
    sim_label(s, "deepspeed gradient partition", ps->r_part);
    ps->partition = sim_alloc(s, ps->r_part, sim_mul3(s, ps->zl.gip, N, ps->c->dt), F_GRAD,
                              SIM_SHARDED);
}

/* stage 2: each gradient goes into the IPG bucket as it is made; a full
 * bucket is reduced first; a gradient larger than the bucket is reduced from
 * itself at the next one (extra_large_param_to_reduce,
 * reduce_independent_p_g_buckets_and_remove_grads) */
static void z2_wgrad(sim *s, int32_t g, void *ctx)
{
    par_state *ps = ctx;
    uint64_t n = s->t[g].bytes / (ps->c->gdt ? ps->c->gdt : 1), B = zero_bucket(ps);
    int stage3 = ps->rm->training.zero_stage == 3; /* its buffers live for the whole run */
    if (!stage3)
        ipg_buffer(ps);
    if (ps->z_fill && ps->z_fill + n > B) { /* reduce_ipg_grads */
        if (!stage3)
            grad_partition(ps);
        sim_drop(s, ps->z_xl);
        ps->z_xl = -1;
        ps->z_fill = 0;
    }
    if (n > B && ps->rm->deepspeed.contiguous_gradients) {
        sim_hold(s, g);
        ps->z_xl = g;
    }
    ps->z_fill = sim_add(s, ps->z_fill, n);
}

void zero_backward_begin(par_state *ps)
{
    sim *s = ps->c->s;
    int stage = ps->rm->training.zero_stage;
    if (stage == 3)
        zero3_backward_begin(ps);
    if (stage >= 2 && ps->P_grad) {
        s->on_wgrad = z2_wgrad;
        s->on_wgrad_ctx = ps;
    }
}

/* stage 2: the epilogue reduces what is left; stage 1: the gradients were
 * kept whole through backward and are reduced now, bucket by bucket, into
 * the partition (reduce_gradients -> reduce_independent_p_g_buckets_...) */
void zero_backward_end(par_state *ps)
{
    sim *s = ps->c->s;
    int stage = ps->rm->training.zero_stage;
    if (stage == 3) {
        sim_drop(s, ps->z_xl);
        ps->z_xl = -1;
        zero3_backward_end(ps);
        return;
    }
    if (!ps->P_grad)
        return;
    ipg_buffer(ps);
    grad_partition(ps);
    sim_drop(s, ps->z_xl);
    ps->z_xl = -1;
    par_drop_grads(ps, ps->step_mark);
}

/* The step (stage_1_and_2.py step, scaled_global_norm, _optimizer_step):
 * the norm makes a float64 copy of each gradient piece of this rank
 * (get_grad_norm_direct: g.data.double().norm(2)); each group's pieces are
 * flattened (a copy when there is more than one) and cast to fp32 as the
 * master weights' .grad, the client optimizer steps on that one flat tensor
 * (torch AdamW foreach: one _foreach_sqrt temporary of its size), then the
 * buffers are released (_release_ipg_buffers). Stage 3 (stage3.py
 * _prepare_fp32_grad_for_sub_group) flattens the partition the same way. */
void zero_step(par_state *ps, lctx *c)
{
    sim *s = c->s;
    const training_spec *t = &ps->rm->training;
    uint64_t N = s->dp ? s->dp : 1, S = sim_mul(s, ps->zl.S, N);
    sim_transient_sharded(s, ps->r_step, sim_mul3(s, ps->zl.piece, N, 8));
    int32_t flat = ps->zl.pieces > 1 ? sim_alloc(s, ps->r_step, sim_mul(s, S, c->dt), F_TEMP,
                                                 SIM_SHARDED) : -1;
    int32_t f32 = -1;
    if (c->dt != 4) {
        f32 = sim_alloc(s, ps->r_step, sim_mul(s, S, 4), F_TEMP, SIM_SHARDED);
        sim_drop(s, flat);
        flat = -1;
    }
    /* clipping (deepspeed gradient_clipping = training.max_grad_norm > 0):
     * unscale_and_clip_grads (stage_1_and_2.py:3193-3214; stage3.py alike) makes
     * 0-dim tensors clip_norm / loss_scale, + 1e-6, / clip_grad, the clamp, the
     * combined scale and 1 / combined_scale: three alive at once, one 512-byte
     * block each; the flat fp32 gradients are scaled in place (mul_) */
    if (t->max_grad_norm > 0)
        sim_transient(s, ps->r_step, 3 * 512);
    int adam = t->optimizer == OPT_ADAMW || t->optimizer == OPT_ADAM;
    if (adam && t->impl == IMPL_FOREACH)
        sim_transient_sharded(s, ps->r_step, sim_mul(s, S, 4));
    else if (adam && t->impl == IMPL_FOR_LOOP)
        sim_transient(s, ps->r_step, sim_mul3(s, c->largest_param, 4, 2));
    sim_drop(s, f32);
    sim_drop(s, flat);
}
