/* parallel_ddp.c - torch DistributedDataParallel (see parallel.h, docs/parallel.md).
 *
 * The Reducer (torch/csrc/distributed/c10d/reducer.cpp, initialize_buckets)
 * allocates one flat tensor per bucket for every parameter that requires a
 * gradient, at construction; they live as long as DDP.  Buckets are filled
 * in the order gradients become ready (the reverse of the forward), closed
 * when they reach the cap: bucket_cap_mb, the first one 1 MiB when the cap is
 * left at its default (torch/nn/parallel/distributed.py,
 * _BucketCapacityConfig).  Gradients are copied into their bucket
 * (mark_variable_ready_dense); with gradient_as_bucket_view the .grad then
 * becomes a view of the bucket and the tensor autograd made is freed, else it
 * stays and the bucket is a second copy.  Buckets exist only when N > 1
 * (SIM_MULTI): a single process is not wrapped. */
#include "parallel.h"
#include "util.h"

#include <stdlib.h>

typedef struct sizes {
    sim *s;
    uint64_t *v;
    size_t n, cap;
} sizes;

static void add_size(void *ctx, uint32_t row, uint64_t bytes)
{
    sizes *z = ctx;
    (void)row;
    if (z->n == z->cap) {
        size_t cap = z->cap ? z->cap * 2 : 256;
        uint64_t *p = realloc(z->v, cap * sizeof *p);
        if (!p) {
            z->s->oom = 1;
            return;
        }
        z->v = p;
        z->cap = cap;
    }
    z->v[z->n++] = bytes;
}

/* compute_bucket_assignment_by_size (reducer.cpp): a bucket is closed as soon
 * as it holds at least its limit; the limits are [first, cap, cap, ...] */
static void alloc_buckets(par_state *ps, sim *s, const sizes *z, uint64_t first, uint64_t cap)
{
    uint64_t acc = 0, limit = first;
    ps->ddp_first = -1;
    ps->ddp_n = 0;
    for (size_t i = z->n; i-- > 0;) { /* ready order: the last parameters first */
        acc = sim_add(s, acc, z->v[i]);
        if (acc < limit && i > 0)
            continue;
        int32_t id = sim_alloc(s, ps->r_bucket, acc, F_GRAD, SIM_MULTI);
        if (ps->ddp_first < 0)
            ps->ddp_first = id;
        ps->ddp_n++;
        acc = 0;
        limit = cap;
    }
}

void ddp_buckets(par_state *ps, lctx *c)
{
    sim *s = c->s;
    const ddp_spec *d = &ps->rm->ddp;
    uint64_t *rb = calloc(s->nrows + 1, sizeof *rb);
    sizes z = {.s = s};
    if (!rb) {
        s->oom = 1;
        return;
    }
    for (size_t r = 0; r < s->nrows; r++)
        rb[r] = sim_mul(s, s->rows[r].trainable, c->gdt);
    sim_each_piece(s, rb, 1, add_size, &z);
    uint64_t cap = sim_mul(s, d->bucket_cap_mb, 1u << 20);
    sim_label(s, "ddp reduce buckets", ps->r_bucket);
    if (!s->oom)
        alloc_buckets(ps, s, &z, d->first_bucket_small ? 1u << 20 : cap, cap);
    free(z.v);
    free(rb);
}

/* gradient_as_bucket_view: the gradient autograd made is copied into the
 * bucket and freed; the .grad is the bucket from then on.  Timeline: the
 * gradient stays (it is what N = 1 keeps) and the bucket it lands in shrinks
 * by its size, so N > 1 holds the buckets plus one gradient in flight. */
static void ddp_take(sim *s, int32_t g, void *ctx)
{
    par_state *ps = ctx;
    uint64_t left = s->t[g].bytes;
    while (left && ps->ddp_cur >= 0) {
        uint64_t have = s->t[ps->ddp_cur].bytes;
        uint64_t take = left < have ? left : have;
        sim_drop(s, ps->ddp_cur);
        left -= take;
        if (have > take) {
            ps->ddp_cur = sim_alloc(s, ps->r_bucket, have - take, F_GRAD, SIM_MULTI);
            continue;
        }
        ps->ddp_next++;
        ps->ddp_cur = ps->ddp_next < ps->ddp_n ? ps->ddp_first + (int32_t)ps->ddp_next : -1;
    }
}

void ddp_backward_begin(par_state *ps, lctx *c)
{
    if (!ps->rm->ddp.gradient_as_bucket_view || ps->ddp_first < 0 || !ps->ddp_n)
        return;
    ps->ddp_next = 0;
    ps->ddp_cur = ps->ddp_first;
    c->s->on_wgrad = ddp_take;
    c->s->on_wgrad_ctx = ps;
}

/* find_unused_parameters: DDP's forward ends by passing the outputs through
 * _DDPSink, which clones every output tensor (distributed.py _post_forward,
 * _DDPSink.forward: inp.clone()); the model's own outputs are then free */
void ddp_forward_end(par_state *ps, lctx *c)
{
    sim *s = c->s;
    if (!ps->rm->ddp.find_unused_parameters || s->dp <= 1)
        return;
    sim_label(s, "ddp output clone", ps->r_bucket);
    for (int i = 0; i < 4; i++) {
        int32_t o = c->late_drop[i];
        if (o < 0 || !s->t[o].alive)
            continue;
        int32_t k = sim_alloc(s, s->t[o].row, sim_grad_bytes(s, o), F_TEMP, SIM_MULTI);
        if (k >= 0)
            s->t[k].esz = s->t[o].esz;
        sim_drop(s, o);
        c->late_drop[i] = k;
    }
}
