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
#include "alloc_fold.h"
#include "util.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* What folding the replay needs (see fold_at): for each event the next one
 * that looks the same, for each tensor the event that allocates it, and a
 * mark at each of the last FOLD_SPAN + 1 period starts of a region. */
#define FOLD_SPAN 6 /* periods a repeating state may take (segments shared by layers) */
typedef struct fold {
    size_t *next_same;      /* next event with the same size, kind, class, phase, row */
    size_t *phase_end;      /* the first event after each of another phase */
    int64_t *born;          /* the step's event allocating each tensor, -1 none */
    uint8_t *again;         /* a free of a tensor the step freed before: a no-op */
    size_t next_try;        /* the first event to look for a period at again */
    mm_alloc_mark *ring[FOLD_SPAN + 1]; /* light marks at the last period starts */
    mm_alloc_mark *full;    /* the whole one a fold starts from */
    uint64_t *ptr;          /* the region's blocks, by event (0: a free) */
    int64_t *was;           /* the handle each free of the region gave back */
    size_t capev;
    mm_fold_pair *pairs;    /* the mark's tensors freed in the folded periods */
    size_t *pair_ev;        /* ... and the events that free them */
    size_t cappairs;
    int verbose;            /* MMGUARD_REPLAY_FOLD=verbose: say what was folded */
    int folded;             /* the last fold_at folded periods */
} fold;

/* MMGUARD_REPLAY_FOLD=check: the state after each fold (step, event reached,
 * hash of the allocator and of the tensors' blocks), compared with the
 * unfolded replay's at the same events */
typedef struct fold_check {
    struct fold_point { int step; size_t ev; uint64_t hash; } *p;
    size_t n, cap, next;
    int bad;
} fold_check;

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
    fold *fold;          /* NULL: every event replayed one by one */
    int stepno;          /* 1 or 2 */
    fold_check *check;   /* MMGUARD_REPLAY_FOLD=check: points to record (fold) or compare */
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

/* a request of (row, phase) for `bytes` got no block but h: the host ran out
 * of memory, or the card did (note_oom) */
static void no_block(replay *r, int64_t h, uint32_t row, uint8_t phase, uint64_t bytes)
{
    if (h == MM_ALLOC_NOMEM)
        r->failed = 1;
    else
        note_oom(r, row, phase, bytes);
}

static inline int64_t alloc_at(replay *r, uint32_t row, uint8_t phase, uint64_t bytes)
{
    int64_t h = mm_allocator_malloc(r->a, bytes);
    if (h < 0) /* rare: not a block */
        no_block(r, h, row, phase, bytes);
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

/* cuBLAS's workspaces: torch gives each (cuBLAS handle, stream) one, taken from
 * the caching allocator at the handle's first matmul and kept for the process
 * (aten/src/ATen/cuda/CublasHandlePool.cpp getCurrentCUDABlasHandle ->
 * cublas_handle_stream_to_workspace; size getChosenWorkspaceSize: 4096 KiB x 8
 * on sm90, 4096 KiB x 2 + 16 KiB x 8 elsewhere).  A training step has two
 * handles, the forward thread's and the autograd engine's device thread's:
 * the H200 traces of tests/gpu_data hold two 32 MiB blocks that are never
 * freed.  Held here from the setup on: nothing the step frees can reuse them,
 * and CUDA's context figure (nvidia-smi minus reserved) does not hold them. */
static void cublas_workspaces(replay *r)
{
    for (int k = 0; k < 2 && r->s->cublas_workspace && !r->failed; k++)
        alloc_at(r, 0, MM_PHASE_FORWARD, r->s->cublas_workspace);
}

/* one event of the log: a block for an allocation, back to the cache for a free */
static inline void event(replay *r, const sim_ev *e)
{
    if (e->is_free) {
        mm_allocator_release(r->a, r->h[e->id]);
        r->h[e->id] = -1;
    } else {
        r->h[e->id] = alloc_at(r, e->row, e->phase, e->bytes);
    }
}

/* the allocator's state and each live tensor's block (fold_check) */
static uint64_t replay_hash(const replay *r)
{
    uint64_t h = mm_alloc_state_hash(r->a);
    for (size_t i = 0; i <= r->s->nt; i++)
        if (r->h[i] >= 0)
            h += mm_alloc_hash_add(i, mm_allocator_block_ptr(r->a, r->h[i]));
    return h;
}

/* the folded replay reached event `ev` of its step by a fold: note the state */
static void check_note(replay *r, size_t ev)
{
    fold_check *c = r->check;
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        struct fold_point *q = realloc(c->p, cap * sizeof *q);
        if (!q) {
            r->failed = 1;
            return;
        }
        c->p = q;
        c->cap = cap;
    }
    c->p[c->n++] = (struct fold_point){r->stepno, ev, replay_hash(r)};
}

/* the unfolded replay ran event ev - 1 of its step: the same state as the
 * folded one's there? */
static void check_compare(replay *r, size_t ev)
{
    fold_check *c = r->check;
    while (c->next < c->n && c->p[c->next].step == r->stepno && c->p[c->next].ev == ev) {
        if (c->p[c->next].hash != replay_hash(r)) {
            fprintf(stderr, "mmguard: replay fold check: the state differs after step %d event %zu\n",
                    r->stepno, ev);
            c->bad = 1;
        }
        c->next++;
    }
}

/* ---- folding repeated periods (alloc_fold.h) ------------------------------------------ */

#define FOLD_RETRY 4  /* periods before a span whose verification failed is tried again
                         (a state may settle into its period after a few) */
#define FOLD_STRIDE 16 /* events between two looks for a period where none was found */
#define FOLD_PENDING(x) (-3 - (int64_t)(x))

/* Events e and g = e + p do the same: the same request or free, and a free
 * frees the tensor allocated p events after the first's (one allocated before
 * `start`: one allocated before start + p). */
static int alike(const replay *r, size_t start, size_t e, size_t p)
{
    const sim_ev *a = &r->ev[e], *b = &r->ev[e + p];
    if (a->bytes != b->bytes || a->is_free != b->is_free || a->cls != b->cls ||
        a->phase != b->phase || a->row != b->row)
        return 0;
    if (!a->is_free)
        return 1;
    if (r->fold->again[e] != r->fold->again[e + p])
        return 0;
    if (r->fold->again[e])
        return 1;
    int64_t x = r->fold->born[a->id], y = r->fold->born[b->id];
    if (x > (int64_t)e)
        return 0; /* freed before its step allocates it: an earlier step's */
    return x >= (int64_t)start ? y == x + (int64_t)p : y < (int64_t)(start + p);
}

/* A region from event i: K >= 3 periods of P events, each like the one before,
 * all of one phase. */
static int find_period(const replay *r, size_t i, size_t *P, size_t *K)
{
    const fold *f = r->fold;
    size_t j = f->next_same[i];
    for (int c = 0; c < 8 && j != SIZE_MAX; c++, j = f->next_same[j]) {
        size_t p = j - i, k = 1, ok = 1;
        if (i + 3 * p > f->phase_end[i])
            break; /* a region keeps to one phase */
        while (ok && i + (k + 1) * p <= f->phase_end[i]) {
            for (size_t e = i + (k - 1) * p; e < i + k * p && ok; e++)
                ok = alike(r, i, e, p);
            k += ok;
        }
        if (k >= 3) {
            *P = p;
            *K = k;
            return 1;
        }
    }
    return 0;
}

/* the tensors that folded periods [b1, b1 + n Q) allocated and did not free:
 * their blocks, those of the first period's (ptr0) shifted once per period */
static int skip_handles(replay *r, const uint64_t *ptr0, size_t b1, size_t Q, size_t n,
                        uint64_t shift, const mm_alloc_mark *m)
{
    size_t end = b1 + n * Q;
    for (size_t e = b1; e < end; e++)
        r->h[r->ev[e].id] = r->ev[e].is_free ? -1 : FOLD_PENDING(e - b1);
    for (size_t e = b1; e < end; e++) {
        const sim_ev *v = &r->ev[e];
        if (v->is_free || r->h[v->id] != FOLD_PENDING(e - b1))
            continue;
        uint64_t j = (e - b1) / Q + 1, p0 = ptr0[(e - b1) % Q];
        int64_t k = mm_alloc_fold_block_at(m, mm_alloc_fold_still(m, p0) ? p0 : p0 + j * shift);
        if (k < 0)
            return -1;
        r->h[v->id] = k;
    }
    return 0;
}

static int grow_pairs(fold *f, size_t np)
{
    if (np < f->cappairs)
        return 0;
    size_t cap = f->cappairs ? 2 * f->cappairs : 64;
    mm_fold_pair *q = realloc(f->pairs, cap * sizeof *q);
    if (q)
        f->pairs = q;
    size_t *w = realloc(f->pair_ev, cap * sizeof *w);
    if (w)
        f->pair_ev = w;
    if (!q || !w)
        return -1;
    f->cappairs = cap;
    return 0;
}

/* The tensors allocated before b0 that [b0, end) frees, with their handles
 * then and those now of the tensors freed Q events later: how many, -1 when
 * the last period frees one (its partner is outside), -2 out of memory.
 * `i`: the region's first event (was[] and ptr[] start there), `now`: the
 * event reached. */
static int64_t pair_frees(replay *r, size_t i, size_t b0, size_t now, size_t Q, size_t end)
{
    fold *f = r->fold;
    size_t np = 0;
    for (size_t e = b0; e < end; e++) {
        const sim_ev *v = &r->ev[e];
        if (!v->is_free || f->again[e] || f->born[v->id] >= (int64_t)b0)
            continue;
        if (e >= end - Q)
            continue; /* freed by the last folded period: the chain ends there */
        if (grow_pairs(f, np))
            return -2;
        f->pairs[np].at_mark = e < now ? f->was[e - i] : r->h[v->id];
        f->pairs[np].now = r->h[r->ev[e + Q].id];
        f->pairs[np].period = (e - b0) / Q;
        f->pair_ev[np++] = e;
    }
    return (int64_t)np;
}

/* The region at i ran to b1 = b0 + Q from the full mark at b0 (closed, its
 * maxima pmax): fold its next periods of Q events up to `end` when the
 * state at b1 is the mark's shifted.  The periods folded (0 none), -1
 * failure. */
static int64_t try_fold(replay *r, size_t i, size_t b0, size_t Q, size_t end,
                        const uint64_t pmax[4])
{
    fold *f = r->fold;
    size_t b1 = b0 + Q, n = (end - b1) / Q;
    uint64_t shift = 0;
    if (!n || !mm_alloc_fold_maybe(r->a, f->full))
        return 0;
    int64_t np = pair_frees(r, i, b0, b1, Q, b0 + (n + 1) * Q);
    if (np == -1)
        return 0;
    if (np < 0)
        return -1;
    int64_t got = mm_alloc_fold(r->a, f->full, pmax, f->pairs, (size_t)np, n, r->stop_above,
                                &shift);
    if (got > 0)
        f->folded = 1;
    if (got > 0 && f->verbose) /* what tests/fold/fold.py counts */
        fprintf(stderr, "mmguard: replay folded %lld periods of %zu events\n", (long long)got, Q);
    if (got > 0 && skip_handles(r, f->ptr + (b0 - i), b1, Q, (size_t)got, shift, f->full))
        return -1;
    return got;
}

/* run period [b, b + P) of the region at i, keeping what a fold needs */
static void run_period(replay *r, size_t i, size_t b, size_t P)
{
    fold *f = r->fold;
    for (size_t e = b; e < b + P && !r->failed; e++) {
        const sim_ev *v = &r->ev[e];
        if (v->is_free)
            f->was[e - i] = r->h[v->id];
        event(r, v);
        f->ptr[e - i] = v->is_free ? 0 : mm_allocator_block_ptr(r->a, r->h[v->id]);
    }
}

/* The state at period t of the region at i looks like the one c periods
 * before (its free blocks): mark it whole, run c periods more and fold the
 * rest when the state then is the mark's shifted.  The event reached. */
static size_t verify_fold(replay *r, size_t i, size_t P, size_t end, size_t t, size_t c)
{
    fold *f = r->fold;
    size_t b0 = i + t * P, Q = c * P;
    uint64_t pmax[4] = {0};
    if (mm_alloc_mark_open(r->a, f->full)) {
        r->failed = 1;
        return b0;
    }
    for (size_t k = 0; k < c; k++) {
        if (mm_alloc_mark_light(r->a, f->ring[(t + k) % (FOLD_SPAN + 1)]))
            r->failed = 1;
        run_period(r, i, b0 + k * P, P);
    }
    mm_alloc_mark_close(r->a, f->full, pmax);
    if (r->failed)
        return b0 + Q;
    int64_t n = try_fold(r, i, b0, Q, end, pmax);
    if (n < 0)
        r->failed = 1;
    return b0 + Q + (n > 0 ? (size_t)n * Q : 0);
}

/* At period t of a region: how many periods back (at most FOLD_SPAN, none
 * whose verification failed less than FOLD_RETRY periods ago: retry[c])
 * the state looked like this one (its light mark passes
 * mm_alloc_fold_maybe), 0 none. */
static size_t repeats_back(replay *r, size_t t, const size_t *retry)
{
    const size_t R = FOLD_SPAN + 1;
    for (size_t c = 1; c <= FOLD_SPAN && c <= t; c++)
        if (t >= retry[c] && mm_alloc_fold_maybe(r->a, r->fold->ring[(t - c) % R]))
            return c;
    return 0;
}

/* At event i: when a region of repeated periods starts here, run its periods
 * one by one with a light mark (free bytes and blocks) at each start, until
 * the state at one start looks like an earlier one's (at most FOLD_SPAN
 * periods back); then verify it over as many periods with a whole mark and
 * fold the rest.  The event to go on from (i: none run). */
static size_t fold_at(replay *r, size_t i)
{
    fold *f = r->fold;
    const size_t R = FOLD_SPAN + 1;
    size_t P, K;
    if (!find_period(r, i, &P, &K)) {
        f->next_try = i + FOLD_STRIDE;
        return i;
    }
    size_t end = i + K * P;
    f->next_try = end;
    if (K * P > f->capev) {
        uint64_t *q = realloc(f->ptr, K * P * sizeof *q);
        if (q)
            f->ptr = q;
        int64_t *w = realloc(f->was, K * P * sizeof *w);
        if (w)
            f->was = w;
        if (!q || !w) {
            r->failed = 1;
            return i;
        }
        f->capev = K * P;
    }
    size_t retry[FOLD_SPAN + 1] = {0}; /* when a span that failed may be tried again */
    size_t t = 0;
    while (t < K && !r->failed) {
        size_t c = repeats_back(r, t, retry);
        if (c && (end - (i + t * P)) / (c * P) >= 2) {
            size_t got = verify_fold(r, i, P, end, t, c);
            if (got != i + (t + c) * P || r->failed)
                return got;
            retry[c] = t + c + FOLD_RETRY; /* not folded: look on, for another span */
            t += c;
            continue;
        }
        if (mm_alloc_mark_light(r->a, f->ring[t % R]))
            r->failed = 1;
        for (size_t e = i + t * P; e < i + (t + 1) * P && !r->failed; e++)
            event(r, &r->ev[e]);
        t++;
    }
    return end;
}

/* events [i, end) of the log, until one fails; the event reached: the
 * allocator runs them (mm_allocator_run), and a request that got no block is
 * looked at here (no_block, as alloc_at does) */
static size_t run_events(replay *r, size_t i, size_t end)
{
    while (i < end && !r->failed) {
        size_t k = mm_allocator_run(r->a, &r->ev[i], end - i, r->h, &r->failed);
        if (!k)
            break; /* stopped */
        i += k;
        const sim_ev *e = &r->ev[i - 1];
        if (!e->is_free && r->h[e->id] < 0)
            no_block(r, r->h[e->id], e->row, e->phase, e->bytes);
    }
    return i;
}

/* a step's events one by one (no fold, no check): the optimizer states made
 * (when `states` is 0) before the first event of the optimizer phase, as
 * step() does, without its tests on every event.  Whether they were made. */
static int step_plain(replay *r, int states, int per_param)
{
    size_t i = r->step_ev, opt = r->nev; /* the optimizer phase's first event */
    for (size_t k = i; k < r->nev && !states; k++)
        if (r->ev[k].phase == MM_PHASE_OPTIMIZER) {
            opt = k;
            break;
        }
    i = run_events(r, i, opt);
    if (i == opt && opt < r->nev && !r->failed) { /* its event runs even when they failed */
        model_states(r, F_OPT, per_param);
        states = 1;
        event(r, &r->ev[i++]);
    }
    run_events(r, i, r->nev);
    return states;
}

static void step(replay *r, int first, int per_param)
{
    int states = !first;
    r->stepno = first ? 1 : 2;
    size_t i = r->step_ev;
    if (!r->fold && !r->check) {
        states = step_plain(r, states, per_param);
        i = r->nev;
    }
    if (r->fold)
        r->fold->next_try = i; /* each step looks for periods from its start */
    while (i < r->nev && !r->failed) {
        const sim_ev *e = &r->ev[i];
        if (!states && e->phase == MM_PHASE_OPTIMIZER) {
            model_states(r, F_OPT, per_param);
            states = 1;
        }
        if (r->fold && i >= r->fold->next_try) {
            size_t j = fold_at(r, i);
            if (j != i) {
                if (r->check && r->fold->folded)
                    check_note(r, j);
                r->fold->folded = 0;
                i = j;
                continue;
            }
        }
        event(r, e);
        i++;
        if (r->check && !r->fold) /* the unfolded replay of a check */
            check_compare(r, i);
    }
    if (!states && !r->failed)
        model_states(r, F_OPT, per_param);
}

static uint64_t ev_token(const sim_ev *e)
{
    uint64_t h = e->bytes * 0x9E3779B97F4A7C15ull;
    h ^= ((uint64_t)e->row << 24 | (uint64_t)e->phase << 16 | (uint64_t)e->cls << 8 | e->is_free) *
         0xC2B2AE3D27D4EB4Full;
    return (h ^ (h >> 29)) | 1;
}

static void fold_free(fold *f)
{
    if (!f)
        return;
    free(f->next_same);
    free(f->phase_end);
    free(f->born);
    free(f->again);
    for (int k = 0; k <= FOLD_SPAN; k++)
        mm_alloc_mark_free(f->ring[k]);
    mm_alloc_mark_free(f->full);
    free(f->ptr);
    free(f->was);
    free(f->pairs);
    free(f->pair_ev);
    free(f);
}

/* next_same and phase_end over the step's events (a table of tokens, walked
 * backwards; a token stands for an event only to propose periods, which
 * alike() then checks) */
static int link_same(fold *f, const replay *r)
{
    size_t cap = 256;
    while (cap < r->nev - r->step_ev + (r->nev - r->step_ev) / 2 + 16)
        cap *= 2;
    uint32_t *key = calloc(cap, sizeof *key);
    size_t *val = malloc(cap * sizeof *val);
    if (!key || !val) {
        free(key);
        free(val);
        return -1;
    }
    for (size_t i = r->nev; i-- > r->step_ev;) {
        uint32_t t = (uint32_t)(ev_token(&r->ev[i]) >> 32) | 1;
        size_t s = (size_t)t & (cap - 1);
        while (key[s] && key[s] != t)
            s = (s + 1) & (cap - 1);
        f->next_same[i] = key[s] ? val[s] : SIZE_MAX;
        key[s] = t;
        val[s] = i;
        int same = i + 1 < r->nev && r->ev[i + 1].phase == r->ev[i].phase;
        f->phase_end[i] = same ? f->phase_end[i + 1] : i + 1;
    }
    free(key);
    free(val);
    return 0;
}

/* What a fold needs of the log; NULL when a tensor is allocated twice in a
 * step (then nothing is folded) or out of memory (*nomem). */
static fold *fold_new(const replay *r, int *nomem)
{
    fold *f = calloc(1, sizeof *f);
    *nomem = 1;
    if (!f)
        return NULL;
    f->next_same = malloc((r->nev + 1) * sizeof *f->next_same);
    f->phase_end = malloc((r->nev + 1) * sizeof *f->phase_end);
    f->born = malloc((r->s->nt + 1) * sizeof *f->born);
    f->again = malloc(r->nev + 1);
    int marks = 1;
    for (int k = 0; k <= FOLD_SPAN; k++)
        marks &= (f->ring[k] = mm_alloc_mark_new()) != NULL;
    marks &= (f->full = mm_alloc_mark_new()) != NULL;
    if (!f->next_same || !f->phase_end || !f->born || !f->again || !marks ||
        link_same(f, r)) {
        fold_free(f);
        return NULL;
    }
    *nomem = 0;
    for (size_t i = r->step_ev; i < r->nev; i++)
        f->born[r->ev[i].id] = -1;
    for (size_t i = r->step_ev; i < r->nev; i++) {
        const sim_ev *e = &r->ev[i];
        if (!e->is_free && f->born[e->id] >= 0) {
            fold_free(f);
            return NULL;
        }
        if (!e->is_free)
            f->born[e->id] = (int64_t)i;
    }
    /* a second free of a tensor (since the step allocated it) frees nothing */
    uint8_t *freed = calloc(r->s->nt + 1, 1);
    if (!freed) {
        *nomem = 1;
        fold_free(f);
        return NULL;
    }
    for (size_t i = r->step_ev; i < r->nev; i++) {
        const sim_ev *e = &r->ev[i];
        f->again[i] = e->is_free && freed[e->id];
        freed[e->id] = e->is_free;
    }
    free(freed);
    f->next_try = r->step_ev;
    return f;
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

static int replay_once(replay *rp, uint64_t n, const mm_alloc_conf *conf, int per_param_states,
                       uint64_t capacity, uint64_t device_total, int fold_mode);

/* MMGUARD_REPLAY_FOLD: 0 off, 1 on, 2 verbose, 3 check (off: "0") */
static int fold_mode(void)
{
    const char *on = getenv("MMGUARD_REPLAY_FOLD");
    if (!on || !*on || !strcmp(on, "0"))
        return 0;
    return !strcmp(on, "verbose") ? 2 : !strcmp(on, "check") ? 3 : 1;
}

static int replay_run(replay *rp, uint64_t n, const mm_alloc_conf *conf, int per_param_states,
                      uint64_t capacity, uint64_t device_total)
{
    int mode = fold_mode();
    if (mode != 3)
        return replay_once(rp, n, conf, per_param_states, capacity, device_total, mode);
    /* the folded replay noting its state after each fold, then the unfolded
     * one comparing its own at the same events */
    fold_check c = {0};
    reserve_result plain;
    replay folded = *rp, unfolded = *rp;
    folded.check = unfolded.check = &c;
    unfolded.out = &plain;
    int rc = replay_once(&folded, n, conf, per_param_states, capacity, device_total, 2);
    int rc2 = replay_once(&unfolded, n, conf, per_param_states, capacity, device_total, 0);
    if (!c.bad && (rc != rc2 || memcmp(&plain, rp->out, sizeof plain)))
        fprintf(stderr, "mmguard: replay fold check: the results differ\n");
    else if (!c.bad && c.next != c.n)
        fprintf(stderr, "mmguard: replay fold check: %zu of %zu states not compared\n",
                c.n - c.next, c.n);
    free(c.p);
    return rc;
}

static int replay_once(replay *rp, uint64_t n, const mm_alloc_conf *conf, int per_param_states,
                       uint64_t capacity, uint64_t device_total, int mode)
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
    int nomem = 0;
    if (mode)
        r.fold = fold_new(&r, &nomem);
    if (nomem)
        r.failed = 1;
    if (r.fold)
        r.fold->verbose = mode == 2;
    model_states(&r, F_PARAM, 1);
    if (!r.failed)
        other_setup(&r);
    if (!r.failed)
        cublas_workspaces(&r);
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
    fold_free(r.fold);
    free(r.h);
    free(copy);
    return rc;
}
