/* reserve.c - from allocated to reserved bytes (see reserve.h).
 *
 * Why: the caching allocator rounds, splits and caches blocks, so what a step
 * holds on the GPU (reserved) exceeds what its tensors use (allocated), by an
 * amount that depends on the order and sizes of every allocation - most in
 * checkpointed steps, where recomputed activations of one size land in blocks
 * cached for another.  The step's own log, replayed through alloc.c, gives it.
 * The cold start matters: the first step's optimizer states are created after
 * its backward, in blocks its activations freed, so the second step's
 * activations need new segments (verified on the H100 traces,
 * tests/gpu_data/traces). */
#include "reserve.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

typedef struct replay {
    const sim *s;
    uint64_t n;          /* data-parallel degree the sizes are taken at */
    mm_allocator *a;
    int64_t *h;          /* handle of each sim tensor in the current step */
    int pairs;           /* optimizer states come two per parameter (Adam) */
    int failed;
} replay;

static void alloc_piece(void *ctx, uint32_t row, uint64_t bytes)
{
    replay *r = ctx;
    (void)row;
    if (mm_allocator_malloc(r->a, bytes) == MM_ALLOC_NOMEM)
        r->failed = 1;
}

/* Adam's exp_avg and exp_avg_sq of one parameter (torch/optim/adamw.py,
 * _init_group: zeros_like(p) twice, parameter by parameter) */
static void alloc_pair(void *ctx, uint32_t row, uint64_t bytes)
{
    alloc_piece(ctx, row, bytes / 2);
    alloc_piece(ctx, row, bytes - bytes / 2);
}

/* bytes of event e on one of n ranks, as the sim logs them at N = n (0: the
 * tensor does not exist there, e.g. DDP buckets at n = 1) */
static uint64_t ev_bytes(const sim *s, const sim_ev *e, uint64_t n)
{
    const sim_tensor *t = &s->t[e->id];
    if (t->sharded == SIM_MULTI)
        return n > 1 ? t->bytes : 0;
    return t->sharded == SIM_SHARDED ? mm_ceil_div(t->bytes, n) : t->bytes;
}

/* the model states of the log's setup part, of class `cls`, per row */
static uint64_t *setup_bytes(const sim *s, uint64_t n, int cls, int *sharded_flat)
{
    uint64_t *rb = calloc(s->nrows + 1, sizeof *rb);
    if (!rb)
        return NULL;
    for (size_t i = 0; i < s->step_ev; i++) {
        const sim_ev *e = &s->ev[i];
        if (!e->is_free && e->cls == cls && e->row < s->nrows) {
            rb[e->row] = mm_sat_add(rb[e->row], ev_bytes(s, e, n));
            if (s->t[e->id].sharded == SIM_SHARDED)
                *sharded_flat = 1;
        }
    }
    return rb;
}

/* parameters or optimizer states, one tensor per parameter (Adam: exp_avg and
 * exp_avg_sq of a parameter one after the other), or flat when sharded */
static void model_states(replay *r, int cls, int per_param)
{
    int flat = 0;
    uint64_t *rb = setup_bytes(r->s, r->n, cls, &flat);
    if (!rb) {
        r->failed = 1;
        return;
    }
    if (flat || !per_param) {
        for (size_t k = 0; k < r->s->nrows; k++)
            if (rb[k])
                alloc_piece(r, (uint32_t)k, rb[k]);
    } else if (cls == F_OPT) {
        sim_each_piece(r->s, rb, 1, r->pairs ? alloc_pair : alloc_piece, r);
    } else {
        sim_each_piece(r->s, rb, 0, alloc_piece, r);
    }
    free(rb);
}

/* the other setup tensors (accumulated .grad, DDP buckets, ZeRO partitions) */
static void other_setup(replay *r)
{
    for (size_t i = 0; i < r->s->step_ev; i++) {
        const sim_ev *e = &r->s->ev[i];
        uint64_t b = ev_bytes(r->s, e, r->n);
        if (!e->is_free && e->cls != F_PARAM && e->cls != F_OPT && b)
            alloc_piece(r, e->row, b);
    }
}

static void step(replay *r, int first, int per_param)
{
    const sim *s = r->s;
    int states = !first;
    for (size_t i = s->step_ev; i < s->nev && !r->failed; i++) {
        const sim_ev *e = &s->ev[i];
        if (!states && e->phase == MM_PHASE_OPTIMIZER) {
            model_states(r, F_OPT, per_param);
            states = 1;
        }
        uint64_t b = ev_bytes(s, e, r->n);
        if (!b)
            continue;
        if (e->is_free) {
            mm_allocator_release(r->a, r->h[e->id]);
            r->h[e->id] = -1;
        } else {
            r->h[e->id] = mm_allocator_malloc(r->a, b);
            if (r->h[e->id] == MM_ALLOC_NOMEM)
                r->failed = 1;
        }
    }
    if (!states)
        model_states(r, F_OPT, per_param);
}

int reserve_replay(const sim *s, uint64_t n, const mm_alloc_conf *conf, int per_param_states,
                   int pairs, reserve_result *out)
{
    replay r = {.s = s, .n = n ? n : 1, .pairs = pairs};
    memset(out, 0, sizeof *out);
    r.a = mm_allocator_new(conf, 0, 0);
    r.h = malloc((s->nt + 1) * sizeof *r.h);
    if (!r.a || !r.h) {
        mm_allocator_free(r.a);
        free(r.h);
        return -1;
    }
    for (size_t i = 0; i <= s->nt; i++)
        r.h[i] = -1;
    model_states(&r, F_PARAM, 1);
    other_setup(&r);
    mm_allocator_empty_cache(r.a);
    mm_allocator_reset_peaks(r.a);
    step(&r, 1, per_param_states);
    step(&r, 0, per_param_states);
    const mm_alloc_stats *st = mm_allocator_stats(r.a);
    out->reserved_peak = st->reserved_peak;
    out->allocated_peak = st->allocated_peak;
    int rc = r.failed ? -1 : 0;
    mm_allocator_free(r.a);
    free(r.h);
    return rc;
}
