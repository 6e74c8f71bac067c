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

/* the step of a strategy that is not DeepSpeed's (parallel_zero.c has those) */
static void torch_step(par_state *ps, lctx *c)
{
    sim *s = c->s;
    const training_spec *t = &ps->sp->training;
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
}

void par_optimizer(par_state *ps, lctx *c)
{
    sim *s = c->s;
    const training_spec *t = &ps->sp->training;
    int offl = (ps->kind == PAR_ZERO && ps->sp->deepspeed.offload_optimizer) ||
               (par_is_fsdp(ps) && ps->sp->fsdp.cpu_offload);
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
