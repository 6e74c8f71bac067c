/* fit.c - "what would fit": the largest micro-batch, whether gradient
 * checkpointing helps, the smallest ZeRO stage and data-parallel degree.
 *
 * Every answer is checked by predicting the very configuration it names.
 * What keeps that cheap: the allocated peak (a folded simulation) is a small
 * fraction of a prediction, the caching-allocator replay most of it, and
 * the peak never lies below the allocated one plus the constant overheads
 * ("lower").  So the searches first narrow on the lower bound and replay the
 * allocator only for the candidates the lower bound cannot rule out. */
#include "dp.h"
#include "predict.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of device-level peak per sample of micro-batch, estimated from one
 * prediction: the activations and temporaries at the peak scale with the
 * micro-batch, scaled like the allocated peak is to the device-level one.
 * Only a first guess for the searches; 0 when there is nothing to go on. */
static double slope_hint(const mm_prediction *p)
{
    double act = (double)p->factors.activations + (double)p->factors.temporaries;
    if (!p->micro_batch_size || !p->allocated_peak_bytes || act <= 0)
        return 0;
    return act / p->micro_batch_size * ((double)p->peak_bytes / (double)p->allocated_peak_bytes);
}

/* The device-level peak of `s` at micro-batch x (lower: its lower bound, no
 * allocator replay); UINT64_MAX when the prediction fails (sizes that
 * overflow), which never fits. */
static uint64_t probe(mm_spec *s, uint64_t x, int lower)
{
    mm_peak_only q;
    mm_error e;
    s->training.micro_batch_size = x;
    if (mm_predict_peak(s, &q, lower, &e))
        return UINT64_MAX;
    return lower ? q.lower : q.peak;
}

/* Whether `s` fits `usable` at micro-batch x: its peak when it does, else
 * UINT64_MAX (the replay ends once the peak is known to exceed usable). */
static uint64_t probe_fits(mm_spec *s, uint64_t x, uint64_t usable)
{
    mm_peak_only q;
    mm_error e;
    s->training.micro_batch_size = x;
    if (mm_predict_peak_fits(s, &q, usable, &e))
        return UINT64_MAX;
    return q.peak;
}

#define MM_MB_CAP 65536u

/* A bracket of the search: the largest x known to fit and the smallest known
 * not to (0 = none known), with their peaks (0 = unknown). */
typedef struct bracket {
    uint64_t lo, lo_pk, hi, hi_pk;
} bracket;

/* The next guess: through two samples (the bracket, else the last two on one
 * side), else the hint from x, else halving or doubling; strictly inside. */
static uint64_t next_guess(const bracket *b, uint64_t x, uint64_t pk, uint64_t px,
                           uint64_t px_pk, int bisect, double hint, uint64_t usable)
{
    double g;
    uint64_t a = 0, a_pk = 0, c = 0, c_pk = 0; /* two samples, a < c */
    if (b->lo && b->hi && b->hi_pk > b->lo_pk && b->hi_pk != UINT64_MAX) {
        a = b->lo, a_pk = b->lo_pk, c = b->hi, c_pk = b->hi_pk;
    } else if (px && px_pk && pk && px != x && pk != UINT64_MAX && px_pk != UINT64_MAX) {
        a = px < x ? px : x, a_pk = px < x ? px_pk : pk;
        c = px < x ? x : px, c_pk = px < x ? pk : px_pk;
    }
    if (!bisect && c && c_pk > a_pk) {
        double slope = (double)(c_pk - a_pk) / (double)(c - a);
        g = (double)a + ((double)usable - (double)a_pk) / slope;
    } else if (hint > 0 && pk && pk != UINT64_MAX) {
        g = (double)x + ((double)usable - (double)pk) / hint;
    } else if (b->hi) {
        g = (double)b->lo + (double)(b->hi - b->lo) / 2.0;
    } else {
        g = (double)b->lo * 2.0;
    }
    double gmin = (double)b->lo + 1.0, gmax = b->hi ? (double)b->hi - 1.0 : (double)MM_MB_CAP;
    if (!(g >= gmin)) /* also catches NaN */
        g = gmin;
    if (g > gmax)
        g = gmax;
    return (uint64_t)g;
}

/* Largest micro-batch in [1, MM_MB_CAP] whose peak (or lower bound) fits
 * `usable`, inside bracket b, starting at x (pk: its peak, 0 = not yet
 * predicted; hint: bytes per sample, used while the bracket is open).  The
 * peak is monotone and nearly linear in the micro-batch (activations grow
 * with it, model states do not), so secant guesses converge in a few
 * predictions; a step that fails to halve the bracket is followed by a
 * bisection, so the worst case stays logarithmic.  *b ends as the final
 * bracket. */
static uint32_t search(mm_spec *s, uint64_t usable, int lower, bracket *b, uint64_t x,
                       uint64_t pk, double hint)
{
    uint64_t width = UINT64_MAX;
    int bisect = 0;
    if ((b->hi && b->hi <= b->lo + 1) || b->hi == 1 || (!b->hi && b->lo >= MM_MB_CAP))
        return (uint32_t)b->lo;
    for (int iter = 0; iter < 64; iter++) {
        /* x right above the largest that fits: a miss ends the search, so
         * only whether it fits matters, not by how much */
        if (!pk)
            pk = !lower && x == b->lo + 1 ? probe_fits(s, x, usable) : probe(s, x, lower);
        int fits = pk <= usable;
        /* the previous sample on the same side, for a slope before a bracket */
        uint64_t px = fits ? b->lo : b->hi, px_pk = fits ? b->lo_pk : b->hi_pk;
        if (fits) {
            b->lo = x;
            b->lo_pk = pk;
        } else {
            b->hi = x;
            b->hi_pk = pk;
        }
        if ((b->hi && b->hi == b->lo + 1) || (!b->hi && b->lo >= MM_MB_CAP) || b->hi == 1)
            break;
        uint64_t w = b->hi ? b->hi - b->lo : UINT64_MAX;
        bisect = !bisect && b->hi && w > width / 2;
        width = w;
        x = next_guess(b, x, pk, px, px_pk, bisect, b->hi ? 0 : hint, usable);
        pk = 0;
    }
    return (uint32_t)b->lo;
}

/* From the spec's micro-batch (at_spec: its prediction, or NULL): first the
 * largest x whose lower bound fits - nothing above it can fit -, then the
 * largest whose peak fits, searched below it from a guess that adds the
 * spec's allocator slack to the lower bound's slope. */
static uint32_t max_batch(mm_spec *s, uint64_t usable, const mm_prediction *at_spec)
{
    uint64_t x0 = s->training.micro_batch_size;
    x0 = x0 < 1 ? 1 : x0 > MM_MB_CAP ? MM_MB_CAP : x0;
    uint64_t pk0 = 0, lo0 = 0, slack = 0;
    double hint = 0;
    if (at_spec && x0 == s->training.micro_batch_size) {
        lo0 = mm_sat_add(dp_device_level(&at_spec->overheads, at_spec->allocated_peak_bytes, 0,
                                         at_spec->data_parallel),
                         at_spec->paged_bytes);
        pk0 = at_spec->peak_bytes;
        slack = pk0 > lo0 ? pk0 - lo0 : 0;
        hint = slope_hint(at_spec);
    }
    bracket lb = {0};
    uint32_t xl = search(s, usable, 1, &lb, x0, lo0, hint);
    if (!xl)
        return 0;
    bracket fb = {.hi = lb.hi};
    uint64_t x = xl, pk = 0;
    if (pk0 && x0 <= xl) { /* the spec's own sample, on its side */
        if (pk0 <= usable)
            fb.lo = x0, fb.lo_pk = pk0;
        else
            fb.hi = x0, fb.hi_pk = pk0;
    }
    double per = xl > x0 && lb.lo_pk > lo0 && lo0 ? (double)(lb.lo_pk - lo0) / (double)(xl - x0)
                                                  : hint;
    if (per > 0 && lb.lo_pk) /* largest x with lower(x) + slack <= usable, linearly */
        x = (uint64_t)((double)xl - ((double)lb.lo_pk + (double)slack - (double)usable) / per);
    if (x <= fb.lo || (fb.hi && x >= fb.hi) || x > xl)
        x = fb.lo + 1 <= xl ? xl : fb.lo + 1;
    if (fb.hi && x >= fb.hi)
        return (uint32_t)fb.lo;
    if (x == x0 && pk0)
        pk = pk0;
    return search(s, usable, 0, &fb, x, pk, 0);
}

/* max_batch from the spec's own prediction (made here when not given: the
 * search's path, and with a peak that is not quite monotone its answer,
 * must not depend on who asks) */
static uint32_t max_batch_from(mm_spec *s, uint64_t usable, const mm_prediction *at_spec)
{
    mm_prediction own;
    mm_error e;
    if (at_spec)
        return max_batch(s, usable, at_spec);
    if (mm_predict(s, &own, &e))
        return max_batch(s, usable, NULL);
    uint32_t mb = max_batch(s, usable, &own);
    mm_prediction_free(&own);
    return mb;
}

uint32_t mm_max_micro_batch(const mm_spec *spec, uint64_t usable, const mm_prediction *at_spec)
{
    mm_spec *s = mm_spec_copy_decoded(spec);
    if (!s)
        return 0;
    uint32_t mb = max_batch_from(s, usable, at_spec);
    mm_spec_free(s);
    return mb;
}

/* Smallest N (1..1024) at which `s` fits, by what a prediction at N gives:
 * one prediction at N = 2 gives the allocated peak at every N (its dp
 * terms); an N whose lower bound fits is checked with an allocator replay
 * of one simulated step at that N.  0 if none. */
static uint32_t first_fitting_dp(mm_spec *s, uint64_t usable)
{
    mm_prediction q;
    mm_error e;
    steplog L;
    int have_log = 0;
    uint32_t found = 0;
    s->training.data_parallel = 2;
    if (mm_predict(s, &q, &e))
        return 0;
    for (uint32_t n = 1; n <= 1024 && !found; n++) {
        uint64_t lower = dp_device_level(&q.overheads, dp_allocated(&q, n), 0, n);
        if (lower > usable)
            continue;
        if (!dp_covered(&q, n)) {
            if (!have_log && steplog_run(s, NULL, 0, 2, 0, &L, &e))
                break;
            have_log = 1;
            if (dp_cover_at(s, &L, &q, n, &e))
                break;
        }
        if (mm_peak_for_dp(&q, n) <= usable)
            found = n;
    }
    if (have_log)
        steplog_free(&L);
    mm_prediction_free(&q);
    return found;
}

/* Smallest N at which `s` fits with a ZeRO stage from `from` up (only `from`
 * when only_from); its stage in *stage, 0 if none. */
static uint32_t smallest_dp(mm_spec *s, int from, int only_from, uint64_t usable, int *stage)
{
    for (int z = from; z <= 3; z++) {
        s->training.zero_stage = z;
        if (s->training.precision != PREC_FP32)
            s->training.master_weights = MASTER_FP32;
        spec_derive(s);
        uint32_t n = first_fitting_dp(s, usable);
        if (n) {
            *stage = z;
            return n;
        }
        if (only_from)
            break; /* only the spec's own stage when it already uses ZeRO */
    }
    return 0;
}

/* the smallest ZeRO stage that fits at the spec's N, -1 none */
static int smallest_zero(mm_spec *s, const mm_spec *spec, uint64_t usable)
{
    for (int z = 0; z <= 3; z++) {
        s->training.zero_stage = z;
        /* DeepSpeed (and the spec's own mixed precision) keeps fp32 master weights */
        s->training.master_weights =
            (z >= 1 || spec->training.zero_stage >= 1) && s->training.precision != PREC_FP32
                ? MASTER_FP32
                : spec->training.master_weights;
        spec_derive(s);
        if (probe_fits(s, s->training.micro_batch_size, usable) <= usable)
            return z;
    }
    return -1;
}

int mm_fit(const mm_spec *spec, uint64_t usable, mm_fit_result *out, mm_error *err)
{
    memset(out, 0, sizeof *out);
    mm_prediction p;
    if (mm_predict(spec, &p, err))
        return -1;
    out->peak_bytes = p.peak_bytes;
    out->fits = p.peak_bytes <= usable;
    out->max_micro_batch = mm_max_micro_batch(spec, usable, &p);
    mm_prediction_free(&p);
    mm_spec *s = mm_spec_copy_decoded(spec);
    if (!s) {
        mm_err(err, "out of memory");
        return -1;
    }
    if (!spec->training.ckpt.enabled) {
        s->training.ckpt.enabled = 1;
        out->max_micro_batch_ckpt = max_batch_from(s, usable, NULL);
        out->checkpointing_helps = out->max_micro_batch_ckpt >= spec->training.micro_batch_size &&
                                   !out->fits;
        *s = *spec;
        s->doc = NULL;
    } else {
        out->max_micro_batch_ckpt = out->max_micro_batch;
    }
    out->min_zero_stage = smallest_zero(s, spec, usable);
    s->training.micro_batch_size = spec->training.micro_batch_size;
    /* smallest N at max(zero, 1), first with the spec's checkpointing; if no N
     * fits and it was off, with it on: ZeRO shards model states, never activations */
    int from = spec->training.zero_stage >= 1 ? spec->training.zero_stage : 1;
    int only_from = spec->training.zero_stage >= 1;
    int stage = -1;
    s->training.ckpt.enabled = spec->training.ckpt.enabled;
    uint32_t n = smallest_dp(s, from, only_from, usable, &stage);
    if (!n && !spec->training.ckpt.enabled) {
        s->training.ckpt.enabled = 1;
        n = smallest_dp(s, from, only_from, usable, &stage);
        out->min_data_parallel_ckpt = n != 0;
    }
    out->min_data_parallel = n;
    out->min_data_parallel_zero = n ? stage : -1;
    mm_spec_free(s);
    return 0;
}
