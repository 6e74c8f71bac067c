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
    const sim_ev *ev;    /* the log with sizes at the degree replayed */
    size_t nev, step_ev; /* its events; the first of the step proper */
    mm_allocator *a;
    int64_t *h;          /* handle of each sim tensor in the current step */
    int pairs;           /* optimizer states come two per parameter (Adam) */
    int failed;
    int in_setup;        /* laying out the model states, before step 1 */
    int capped;          /* a capacity: an OOM ends the replay (without one, only the
                            invented address space can run out, and the replay goes on) */
    uint64_t stop_above; /* end the steps once their reserved peak exceeds it */
    reserve_result *out;
} replay;

/* The request of a (row, phase) found no room even after the cache was freed:
 * what the OutOfMemoryError would say (allocated, reserved, the request). */
static void note_oom(replay *r, uint32_t row, uint8_t phase, uint64_t bytes)
{
    const mm_alloc_stats *st = mm_allocator_stats(r->a);
    reserve_result *o = r->out;
    if (!r->capped)
        return;
    r->failed = 1;
    if (o->oom)
        return;
    o->oom = 1;
    o->oom_setup = r->in_setup;
    o->oom_row = row;
    o->oom_phase = phase;
    o->oom_request = bytes;
    o->oom_allocated = st->allocated;
    o->oom_reserved = st->reserved;
    o->oom_largest_free = mm_allocator_largest_free(r->a);
}

static int64_t alloc_at(replay *r, uint32_t row, uint8_t phase, uint64_t bytes)
{
    int64_t h = mm_allocator_malloc(r->a, bytes);
    if (h == MM_ALLOC_NOMEM)
        r->failed = 1;
    else if (h == MM_ALLOC_OOM)
        note_oom(r, row, phase, bytes);
    return h;
}

static void alloc_piece(void *ctx, uint32_t row, uint64_t bytes)
{
    replay *r = ctx;
    if (!r->failed)
        alloc_at(r, row, MM_PHASE_OPTIMIZER, bytes);
}

/* Adam's exp_avg and exp_avg_sq of one parameter (torch/optim/adamw.py,
 * _init_group: zeros_like(p) twice, parameter by parameter) */
static void alloc_pair(void *ctx, uint32_t row, uint64_t bytes)
{
    alloc_piece(ctx, row, bytes / 2);
    alloc_piece(ctx, row, bytes - bytes / 2);
}

/* The log as the sim writes it at N = n: sharded sizes / n, DDP buckets
 * only when n > 1 (the order of events does not depend on N).  The log
 * itself when it was written at n; else a copy (*copy, to free). */
static int log_at(replay *r, uint64_t n, sim_ev **copy)
{
    const sim *s = r->s;
    *copy = NULL;
    r->ev = s->ev, r->nev = s->nev, r->step_ev = s->step_ev;
    if (n == s->dp)
        return 0;
    sim_ev *v = malloc((s->nev + 1) * sizeof *v);
    if (!v)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < s->nev; i++) {
        const sim_tensor *t = &s->t[s->ev[i].id];
        uint64_t b = t->sharded == SIM_MULTI     ? (n > 1 ? t->bytes : 0)
                     : t->sharded == SIM_SHARDED ? mm_ceil_div(t->bytes, n)
                                                 : t->bytes;
        if (i == s->step_ev)
            r->step_ev = k;
        if (b) { /* a tensor that does not exist at n is not logged there */
            v[k] = s->ev[i];
            v[k++].bytes = b;
        }
    }
    if (s->step_ev >= s->nev)
        r->step_ev = k;
    r->ev = *copy = v;
    r->nev = k;
    return 0;
}

/* the model states of the log's setup part, of class `cls`, per row */
static uint64_t *setup_bytes(const replay *r, int cls, int *sharded_flat)
{
    const sim *s = r->s;
    uint64_t *rb = calloc(s->nrows + 1, sizeof *rb);
    if (!rb)
        return NULL;
    for (size_t i = 0; i < r->step_ev; i++) {
        const sim_ev *e = &r->ev[i];
        if (!e->is_free && e->cls == cls && e->row < s->nrows) {
            rb[e->row] = mm_sat_add(rb[e->row], e->bytes);
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
    uint64_t *rb = setup_bytes(r, cls, &flat);
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
    for (size_t i = 0; i < r->step_ev && !r->failed; i++) {
        const sim_ev *e = &r->ev[i];
        if (!e->is_free && e->cls != F_PARAM && e->cls != F_OPT)
            alloc_at(r, e->row, e->phase, e->bytes);
    }
}

static void step(replay *r, int first, int per_param)
{
    int states = !first;
    for (size_t i = r->step_ev; i < r->nev && !r->failed; i++) {
        const sim_ev *e = &r->ev[i];
        if (!states && e->phase == MM_PHASE_OPTIMIZER) {
            model_states(r, F_OPT, per_param);
            states = 1;
        }
        if (e->is_free) {
            mm_allocator_release(r->a, r->h[e->id]);
            r->h[e->id] = -1;
        } else {
            r->h[e->id] = alloc_at(r, e->row, e->phase, e->bytes);
        }
    }
    if (!states && !r->failed)
        model_states(r, F_OPT, per_param);
}

static int replay_run(replay *rp, uint64_t n, const mm_alloc_conf *conf, int per_param_states,
                      uint64_t capacity, uint64_t device_total);

/* reserve_replay_until's watch, called before a segment is counted: once the
 * steps' reserved bytes pass the bound, so has their peak (checked here, on
 * the rare segment events, and not on every request) */
static void watch_segment(void *ctx, int got, uint64_t bytes)
{
    replay *r = ctx;
    if (got && !r->in_setup &&
        mm_sat_add(mm_allocator_stats(r->a)->reserved, bytes) > r->stop_above)
        r->failed = r->out->stopped = 1;
}

int reserve_replay(const sim *s, uint64_t n, const mm_alloc_conf *conf, int per_param_states,
                   int pairs, reserve_result *out)
{
    return reserve_replay_cap(s, n, conf, per_param_states, pairs, 0, 0, out);
}

int reserve_replay_cap(const sim *s, uint64_t n, const mm_alloc_conf *conf, int per_param_states,
                       int pairs, uint64_t capacity, uint64_t device_total, reserve_result *out)
{
    replay r = {.s = s, .pairs = pairs, .out = out, .in_setup = 1, .capped = capacity != 0,
                .stop_above = UINT64_MAX};
    return replay_run(&r, n, conf, per_param_states, capacity, device_total);
}

int reserve_replay_until(const sim *s, uint64_t n, const mm_alloc_conf *conf,
                         int per_param_states, int pairs, uint64_t stop_above,
                         reserve_result *out)
{
    replay r = {.s = s, .pairs = pairs, .out = out, .in_setup = 1, .stop_above = stop_above};
    return replay_run(&r, n, conf, per_param_states, 0, 0);
}

static int replay_run(replay *rp, uint64_t n, const mm_alloc_conf *conf, int per_param_states,
                      uint64_t capacity, uint64_t device_total)
{
    replay r = *rp;
    const sim *s = r.s;
    reserve_result *out = r.out;
    sim_ev *copy;
    memset(out, 0, sizeof *out);
    if (log_at(&r, n ? n : 1, &copy))
        return -1;
    r.a = mm_allocator_new(conf, capacity, device_total);
    r.h = malloc((s->nt + 1) * sizeof *r.h);
    if (!r.a || !r.h) {
        mm_allocator_free(r.a);
        free(r.h);
        free(copy);
        return -1;
    }
    if (r.stop_above != UINT64_MAX)
        mm_allocator_on_segment(r.a, watch_segment, &r);
    for (size_t i = 0; i <= s->nt; i++)
        r.h[i] = -1;
    model_states(&r, F_PARAM, 1);
    if (!r.failed)
        other_setup(&r);
    r.in_setup = 0;
    mm_allocator_empty_cache(r.a);
    mm_allocator_reset_peaks(r.a);
    if (!r.failed)
        step(&r, 1, per_param_states);
    uint64_t before = mm_allocator_stats(r.a)->num_alloc_retries;
    if (!r.failed)
        step(&r, 0, per_param_states);
    const mm_alloc_stats *st = mm_allocator_stats(r.a);
    out->reserved_peak = st->reserved_peak;
    out->allocated_peak = st->allocated_peak;
    out->retries = st->num_alloc_retries;
    out->retries_step = st->num_alloc_retries - before;
    int rc = r.failed && !out->oom && !out->stopped ? -1 : 0;
    mm_allocator_free(r.a);
    free(r.h);
    free(copy);
    return rc;
}
