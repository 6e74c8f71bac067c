/* parallel_opt.c - the optimizer step's temporaries per strategy, and
 * zero_grad (see parallel.h, docs/parallel.md). */
#include "parallel.h"
#include "util.h"

#include <stdlib.h>

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

/* Gradient clipping outside DeepSpeed, before optimizer.step().  The HF Trainer
 * clips when max_grad_norm > 0 (transformers 5.17 trainer.py:1863-1864) and from
 * transformers 5 computes the same norm with max_norm = inf when it does not
 * (trainer.py:1865, _get_grad_norm:2672-2679), so the temporaries exist either way
 * there; before 5 only when clipping.  torch.nn.utils.clip_grad_norm_
 * (torch/nn/utils/clip_grad.py:84-116): one 0-dim norm per gradient
 * (_foreach_norm :95, or vector_norm per tensor :101-103), all alive while
 * torch.stack (:105-107) copies them into one vector that vector_norm reduces to
 * total_norm; FSDP1's clip_grad_norm_ does the same with fp32 norms
 * (fully_sharded_data_parallel.py _get_grad_norm:2116-2120).  Then clip_coef =
 * max_norm / (total_norm + 1e-6) and its clamp (clip_grad.py:164-168) beside
 * total_norm, _foreach_mul_ in place (:173); total_norm is returned and the
 * Trainer keeps it through the step (trainer.py:1864-1868).  Every 0-dim tensor is
 * one 512-byte block; the norms are allocated 2048 to a 1 MiB piece (how 512-byte
 * blocks fill the small pool's 2 MiB segments).  One gradient per trainable
 * parameter tensor: a row instance with a trainable weight (a bias is counted with
 * its weight: at most one more block each).  The stack is counted at 4 bytes a norm,
 * the widest norm dtype. */
static int32_t clip_temporaries(par_state *ps, lctx *c)
{
    sim *s = c->s;
    const resolved_model *rm = ps->rm;
    if (!(rm->training.max_grad_norm > 0) && rm->framework.tf_major < 5)
        return -1;
    uint64_t n = 0;
    for (size_t r = 0; r < s->nrows; r++)
        if (s->rows[r].trainable)
            n = sim_add(s, n, s->rows[r].trainable_count);
    if (!n)
        return -1;
    int32_t ids[64];
    size_t k = 0;
    for (uint64_t left = n; left && k < 64; k++) {
        uint64_t m = k == 63 ? left : (left < 2048 ? left : 2048);
        ids[k] = sim_alloc(s, ps->r_step, sim_mul(s, m, 512), F_TEMP, 0);
        left -= m;
    }
    int32_t stack = sim_alloc(s, ps->r_step, sim_mul(s, n, 4), F_TEMP, 0);
    int32_t total = sim_alloc(s, ps->r_step, 512, F_TEMP, 0);
    sim_drop(s, stack);
    for (size_t i = 0; i < k; i++)
        sim_drop(s, ids[i]);
    sim_transient(s, ps->r_step, 3 * 512); /* total_norm + 1e-6, clip_coef, its clamp */
    return total;
}

/* the step of a strategy that is not DeepSpeed's (parallel_zero.c has those) */
static void torch_step(par_state *ps, lctx *c)
{
    sim *s = c->s;
    const training_spec *t = &ps->rm->training;
    int32_t norm = clip_temporaries(ps, c);
    int adam = t->optimizer == OPT_ADAMW || t->optimizer == OPT_ADAM;
    if (par_is_fsdp(ps) && adam && t->impl == IMPL_FOREACH) {
        sim_transient_sharded(s, ps->r_step, sim_mul(s, ps->P_tr, ps->sdt));
    } else if (adam && t->impl == IMPL_FOREACH) {
        foreach_sqrt(s, ps->r_step, ps->sdt);
    } else if (adam && t->impl == IMPL_FOR_LOOP) { /* denom per parameter */
        sim_transient(s, ps->r_step, sim_mul3(s, c->largest_param, ps->sdt, 2));
    } else if (t->optimizer == OPT_ADAFACTOR) {
        /* HF Adafactor: fp32 grad copy, update and param copy per parameter */
        sim_transient(s, ps->r_step, sim_mul3(s, c->largest_param, 4, 3));
    }
    sim_drop(s, norm);
}

void par_optimizer(par_state *ps, lctx *c)
{
    sim *s = c->s;
    const training_spec *t = &ps->rm->training;
    int offl = (ps->kind == PAR_ZERO && ps->rm->deepspeed.offload_optimizer) ||
               (par_is_fsdp(ps) && ps->rm->fsdp.cpu_offload);
    sim_label(s, "optimizer step", ps->r_step);
    if (ps->P_tr && !t->optimizer_in_backward && !offl) {
        if (ps->kind == PAR_ZERO)
            zero_step(ps, c);
        else
            torch_step(ps, c);
    }
    /* zero_grad(set_to_none=True) */
    for (size_t i = 0; i < s->nt; i++)
        if (s->t[i].alive && s->t[i].cls == F_GRAD && (int32_t)i != ps->partition &&
            s->t[i].base < 0 && s->t[i].sharded != SIM_MULTI)
            sim_drop(s, (int32_t)i);
    sim_drop(s, ps->partition);
    ps->partition = -1;
}
