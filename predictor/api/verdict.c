/* verdict.c - does the step run on a card: fits, fits with cache flushes, or
 * out of memory (mmguard.h, mm_verdict).  API layer: uses the step (step.h),
 * its allocation log (dp.h) and the allocator replay (reserve.h).
 *
 * Why: the prediction's reserved peak is the caching allocator's on a card
 * without limit.  A real allocator never holds more than the card: when
 * cudaMalloc fails, DeviceCachingAllocator::malloc (c10/cuda/
 * CUDACachingAllocator.cpp, torch 2.11-2.13) runs garbage_collect_cached_blocks
 * (only with a memory fraction and garbage_collection_threshold),
 * release_available_cached_blocks, then release_cached_blocks and alloc_block
 * again (counted in num_alloc_retries), and raises OutOfMemoryError only when
 * that fails too.  alloc.c follows that path; here the step is replayed with
 * the capacity the card leaves the allocator, so the verdict comes from the
 * allocator's own algorithm, not from a margin on the uncapped peak.
 *
 * Paged optimizer states (bitsandbytes' paged_adamw*, cudaMallocManaged) are
 * not the caching allocator's: the driver evicts them to host memory under
 * pressure, so they are reported but do not enter the verdict. */
#include "verdict.h"
#include "dp.h"
#include "predict.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define SEG_ALIGN (2ull * 1024 * 1024) /* every segment and page is a multiple of 2 MiB */

typedef struct judge {
    const mm_spec *sp;
    const resolved_model *rm; /* sp resolved: the caller's, or &own */
    resolved_model own;
    int owns;
    sim s;          /* the folded step at N, when its log is simulated at another degree */
    steplog L;      /* its allocation log */
    const sim *st;  /* the step at N the verdict reads (allocated peak, paged bytes, row
                       names): &s, or &L.s when the log is simulated at N itself */
    uint32_t n;
    uint64_t gpu;
} judge;

const char *mm_spec_alloc_conf(const mm_spec *sp)
{
    return sp->device.alloc_conf;
}

const char *mm_verdict_name(mm_verdict_kind k)
{
    switch (k) {
    case MM_VERDICT_FITS: return "fits";
    case MM_VERDICT_FLUSHES: return "fits with cache flushes";
    case MM_VERDICT_OOM: return "out of memory";
    default: return "?";
    }
}

static uint64_t outside_allocator(const mm_overheads *o, uint64_t allocated, uint32_t n)
{
    long double x = (long double)allocated * (long double)o->alloc_frac;
    uint64_t v = x >= 1.8e19L ? UINT64_MAX : (uint64_t)ceill(x);
    v = mm_sat_add(v, o->alloc_fixed);
    v = mm_sat_add(v, o->cuda_context);
    return n > 1 ? mm_sat_add(v, o->nccl) : v;
}

uint64_t verdict_capacity(const mm_overheads *o, uint64_t usable, uint64_t allocated, uint32_t n)
{
    uint64_t out = outside_allocator(o, allocated, n);
    return usable > out ? usable - out : 0;
}

static int replay_at(const judge *j, uint64_t cap, reserve_result *r, mm_error *err)
{
    if (reserve_replay_cap(&j->L.s, j->n, &j->L.conf, j->L.per_param, j->L.pairs, cap, j->gpu,
                           r)) {
        mm_err(err, "out of memory");
        return -1;
    }
    return 0;
}

/* the smallest multiple of 2 MiB in (lo, hi] at which `ok` holds, hi when
 * none below it does: a bisection, which assumes the replay monotone in
 * capacity */
static int bisect(const judge *j, uint64_t lo, uint64_t hi, int no_retry, uint64_t *at,
                  mm_error *err)
{
    uint64_t a = lo / SEG_ALIGN, b = mm_ceil_div(hi, SEG_ALIGN);
    while (a + 1 < b) {
        uint64_t mid = a + (b - a) / 2;
        reserve_result r;
        if (replay_at(j, mid * SEG_ALIGN, &r, err))
            return -1;
        if (!r.oom && (!no_retry || !r.retries))
            b = mid;
        else
            a = mid;
    }
    *at = b * SEG_ALIGN < hi ? b * SEG_ALIGN : hi;
    return 0;
}

/* It is not, quite: a larger capacity can let the allocator take a new
 * segment where a smaller one made it flush, and fragment differently (seen
 * within 6 MiB of the boundary on mixtral-8x7b-lora).  So the bisection's
 * answer is checked upwards, VERIFY capacities 2 MiB apart; a failure above
 * it starts the search again from there, so the boundary reported is one
 * above which no nearby capacity fails. */
#define VERIFY 32
static int search(const judge *j, uint64_t lo, uint64_t hi, int no_retry, uint64_t *at,
                  mm_error *err)
{
    for (int round = 0; round < 16; round++) {
        if (bisect(j, lo, hi, no_retry, at, err))
            return -1;
        uint64_t bad = 0;
        for (uint64_t c = *at + SEG_ALIGN, k = 0; k < VERIFY && c < hi && !bad;
             c += SEG_ALIGN, k++) {
            reserve_result r;
            if (replay_at(j, c, &r, err))
                return -1;
            if (r.oom || (no_retry && r.retries))
                bad = c;
        }
        if (!bad)
            return 0;
        lo = bad;
    }
    *at = hi; /* never settled: the uncapped peak, which always runs */
    return 0;
}

static void oom_event(const judge *j, const reserve_result *r, mm_verdict *v)
{
    const sim *s = j->st;
    const char *mod = "", *row = "";
    if (r->oom_row < s->nrows) {
        mod = j->sp->modules[s->rows[r->oom_row].module].name;
        row = s->rows[r->oom_row].name;
    }
    snprintf(v->oom_event, sizeof v->oom_event, "%s %s %s",
             r->oom_setup ? "setup" : mm_phase_name((mm_phase)r->oom_phase), mod, row);
    v->oom_request = r->oom_request;
    v->oom_allocated = r->oom_allocated;
    v->oom_reserved = r->oom_reserved;
    v->oom_largest_free = r->oom_largest_free;
}

static void judge_init(judge *j, const mm_spec *sp, uint64_t gpu)
{
    memset(j, 0, sizeof *j);
    j->sp = sp;
    j->gpu = gpu;
    j->n = mm_spec_data_parallel(sp);
    j->st = &j->s;
}

/* whether the log is simulated at the spec's N itself (a per-degree spec, or
 * N >= 2): then its run is the step at N, and one run serves both */
static int judge_logs_at_n(const judge *j)
{
    uint64_t n = j->n ? j->n : 1;
    return steplog_degree(j->sp, n, 0) == n;
}

/* The step at the spec's N (its allocated peak), the folded run, with the
 * rows of `rows` (NULL: its own counting pass); with `logged` instead its log,
 * in one run, where that is simulated at N: every layer simulated, whose
 * allocated peak, paged bytes and largest parameter are the folded run's
 * (folding the layers is exact: tests/unit/test_predict.c folding_is_exact;
 * tests/fold/fold.py --ref holds every verdict to the two runs') */
static int judge_step(judge *j, const mm_spec *sp, const resolved_model *rm, uint64_t gpu,
                      int logged, const sim *rows, mm_error *err)
{
    judge_init(j, sp, gpu);
    if (!rm && resolve_model(sp, &j->own, err))
        return -1;
    j->owns = !rm;
    j->rm = rm ? rm : &j->own;
    if (logged && judge_logs_at_n(j)) {
        j->st = &j->L.s;
        return steplog_run(sp, j->rm, NULL, 0, j->n ? j->n : 1, 0, &j->L, err);
    }
    step_cfg cfg = {.dp = j->n ? j->n : 1, .rows_from = rows,
                    .largest_param = rows ? rows->largest_param : 0};
    return step_run(j->rm, &j->s, &cfg, err);
}

/* the log, unless judge_step made it */
static int judge_log(judge *j, mm_error *err)
{
    if (j->st == &j->L.s)
        return 0;
    return steplog_run(j->sp, j->rm, &j->s, j->s.largest_param, j->n ? j->n : 1, 0, &j->L, err);
}

static int judge_open(judge *j, const mm_spec *sp, uint64_t gpu, mm_error *err)
{
    return judge_step(j, sp, NULL, gpu, 1, NULL, err) ? -1 : judge_log(j, err);
}

static void judge_close(judge *j)
{
    if (j->owns)
        resolved_free(&j->own);
    steplog_free(&j->L);
    sim_free(&j->s);
}

/* the usable bytes where the verdict changes: runs at all, runs without a flush */
static int boundaries(const judge *j, const reserve_result *free_run, mm_verdict *v,
                      mm_error *err)
{
    uint64_t lo = free_run->allocated_peak ? free_run->allocated_peak - 1 : 0;
    uint64_t runs, clean;
    if (search(j, lo, v->reserved_uncapped, 0, &runs, err) ||
        search(j, runs > 0 ? runs - 1 : 0, v->reserved_uncapped, 1, &clean, err))
        return -1;
    v->min_usable_runs = mm_sat_add(runs, v->context_bytes);
    v->min_usable_no_flush = mm_sat_add(clean, v->context_bytes);
    return 0;
}

/* what the replay at the card's capacity says */
static void replay_verdict(const judge *j, const reserve_result *r, mm_verdict *v)
{
    v->reserved_peak = r->reserved_peak;
    v->retries = r->retries;
    v->retries_step = r->retries_step;
    v->kind = r->oom ? MM_VERDICT_OOM : r->retries ? MM_VERDICT_FLUSHES : MM_VERDICT_FITS;
    if (r->oom)
        oom_event(j, r, v);
}

/* the card's figures that need no replay */
static void card_figures(const judge *j, uint64_t gpu_bytes, uint64_t usable, mm_verdict *v)
{
    mm_overheads o = predict_overheads(j->sp);
    memset(v, 0, sizeof *v);
    v->n = j->n;
    v->gpu_bytes = gpu_bytes;
    v->usable_bytes = usable;
    v->allocated_peak = j->st->peak;
    v->paged_bytes = j->st->outside_bytes;
    v->context_bytes = outside_allocator(&o, j->st->peak, j->n);
    v->capacity = verdict_capacity(&o, usable, j->st->peak, j->n);
}

/* the verdict on one card from an opened judge and its uncapped replay */
static int judge_card(judge *j, const reserve_result *free_run, uint64_t gpu_bytes,
                      uint64_t usable, int want_bounds, mm_verdict *v, mm_error *err)
{
    reserve_result r;
    j->gpu = gpu_bytes;
    card_figures(j, gpu_bytes, usable, v);
    v->reserved_uncapped = free_run->reserved_peak > j->st->peak ? free_run->reserved_peak
                                                                 : j->st->peak;
    /* a capacity holding the uncapped peak never fails a cudaMalloc: the replay
     * at it is the uncapped one (tests/alloc/capacity.py), not run twice */
    if (v->capacity >= free_run->reserved_peak && !free_run->oom && !free_run->retries)
        r = *free_run;
    else if (replay_at(j, v->capacity ? v->capacity : 1, &r, err))
        return -1;
    replay_verdict(j, &r, v);
    return want_bounds ? boundaries(j, free_run, v, err) : 0;
}

/* one simulated step serves every card, one uncapped replay every card of
 * the same memory (a memory fraction and expandable segments depend on it) */
static int verdicts(const mm_spec *sp, size_t n_cards, const uint64_t *gpu_bytes,
                    const uint64_t *usable, int want_bounds, mm_verdict *out, mm_error *err)
{
    judge j;
    reserve_result free_run;
    int rc = judge_open(&j, sp, n_cards ? gpu_bytes[0] : 0, err);
    for (size_t i = 0; !rc && i < n_cards; i++) {
        j.gpu = gpu_bytes[i];
        if (i == 0 || gpu_bytes[i] != gpu_bytes[i - 1])
            rc = replay_at(&j, 0, &free_run, err);
        if (!rc)
            rc = judge_card(&j, &free_run, gpu_bytes[i], usable[i], want_bounds, &out[i], err);
    }
    judge_close(&j);
    return rc;
}

int mm_verdict_for(const mm_spec *sp, uint64_t gpu_bytes, uint64_t usable, int want_bounds,
                   mm_verdict *v, mm_error *err)
{
    memset(v, 0, sizeof *v);
    return verdicts(sp, 1, &gpu_bytes, &usable, want_bounds, v, err);
}

/* the uncapped replay does not depend on the card when the allocator never
 * reads its size: no expandable segments (their address space is sized by
 * it), no memory fraction (alloc.c, mm_allocator_new and xseg_create) */
static int card_blind(const mm_alloc_conf *c)
{
    return !c->expandable_segments && !(c->memory_fraction > 0);
}

int mm_predict_verdict(const mm_spec *sp, uint64_t gpu_bytes, uint64_t usable,
                       mm_prediction *pred, mm_verdict *v, mm_error *err)
{
    predict_keep k;
    memset(v, 0, sizeof *v);
    if (mm_predict_keep(sp, pred, err, 0, &k))
        return -1;
    if (!sp->training.data_parallel) { /* the judge's degree would differ: judge alone */
        predict_keep_free(&k);
        int rc = mm_verdict_for(sp, gpu_bytes, usable, 0, v, err);
        if (rc)
            mm_prediction_free(pred);
        return rc;
    }
    /* the prediction's step at N, its log and its uncapped replay are the
     * judge's (judge_open simulates and logs the same step) */
    judge j;
    judge_init(&j, sp, gpu_bytes);
    j.s = k.rows;
    j.L = k.L;
    reserve_result free_run = k.free_run;
    int rc = card_blind(&k.L.conf) ? 0 : replay_at(&j, 0, &free_run, err);
    if (!rc)
        rc = judge_card(&j, &free_run, gpu_bytes, usable, 0, v, err);
    predict_keep_free(&k);
    if (rc)
        mm_prediction_free(pred);
    return rc;
}

int mm_verdict_cards(const mm_spec *sp, size_t n_cards, const uint64_t *gpu_bytes,
                     const uint64_t *usable, mm_verdict *out, mm_error *err)
{
    return verdicts(sp, n_cards, gpu_bytes, usable, 0, out, err);
}

uint64_t verdict_outside(const mm_overheads *o, uint64_t allocated, uint32_t n)
{
    return outside_allocator(o, allocated, n);
}

/* One replay, at the capacity only: a capacity that holds the uncapped peak
 * replays exactly as without a limit (tests/alloc/capacity.py), so the kind,
 * retries and reserved peak are mm_verdict_for's.  Live tensors above the
 * capacity need no replay: the allocator's reserved bytes hold every live
 * block and never exceed the capacity, so that replay runs out of memory
 * (capacity.py: OOM below the live peak; its boundaries never below live +
 * context). */
int verdict_quick(const mm_spec *sp, const resolved_model *rm, uint64_t gpu_bytes,
                  uint64_t usable, const sim *rows, mm_verdict *v, mm_error *err)
{
    judge j;
    reserve_result r;
    int rc = judge_step(&j, sp, rm, gpu_bytes, 0, rows, err);
    if (!rc) {
        card_figures(&j, gpu_bytes, usable, v);
        if (j.st->peak > v->capacity) {
            v->kind = MM_VERDICT_OOM;
            v->oom_allocated = j.st->peak;
            snprintf(v->oom_event, sizeof v->oom_event, "live tensors above the capacity");
        } else if (!(rc = judge_log(&j, err)) &&
                   !(rc = replay_at(&j, v->capacity ? v->capacity : 1, &r, err))) {
            replay_verdict(&j, &r, v);
            if (v->kind == MM_VERDICT_FITS)
                v->reserved_uncapped = r.reserved_peak > j.st->peak ? r.reserved_peak
                                                                    : j.st->peak;
        }
    }
    judge_close(&j);
    return rc;
}

/* Why stopping the uncapped replay at the capacity decides FITS exactly:
 * the capped replay (alloc.c) is the uncapped one until a cudaMalloc would
 * take the reserved bytes above the capacity - the allocator reads the
 * capacity nowhere else when it is card-blind (no memory fraction, no
 * expandable segments).  If the uncapped reserved peak stays at or below the
 * capacity no cudaMalloc fails: the verdict is FITS (judge_card takes the
 * uncapped replay for it on the same grounds).  If it passes the capacity,
 * that cudaMalloc fails in the capped replay: a retry or out of memory, never
 * FITS.  The setup before the steps only allocates the parameters, so its
 * reserved bytes never exceed the steps' peak. */
int verdict_fits_clean_rows(const mm_spec *sp, const resolved_model *rm, uint64_t gpu_bytes,
                            uint64_t usable, const sim *rows, mm_error *err)
{
    judge j;
    mm_verdict v;
    reserve_result r;
    int rc = judge_step(&j, sp, rm, gpu_bytes, 0, rows, err), fits = 0;
    if (!rc) {
        card_figures(&j, gpu_bytes, usable, &v);
        if (j.st->peak <= v.capacity && !(rc = judge_log(&j, err))) {
            if (!card_blind(&j.L.conf)) {
                rc = replay_at(&j, v.capacity ? v.capacity : 1, &r, err);
                fits = !rc && !r.oom && !r.retries;
            } else if (reserve_replay_until(&j.L.s, j.n, &j.L.conf, j.L.per_param, j.L.pairs,
                                            v.capacity, &r)) {
                mm_err(err, "out of memory");
                rc = -1;
            } else {
                fits = !r.stopped && !r.oom && !r.retries;
            }
        }
    }
    judge_close(&j);
    return rc ? -1 : fits;
}

int verdict_fits_clean(const mm_spec *sp, uint64_t gpu_bytes, uint64_t usable, mm_error *err)
{
    return verdict_fits_clean_rows(sp, NULL, gpu_bytes, usable, NULL, err);
}
