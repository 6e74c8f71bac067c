/* fit.c - "what would fit": the largest micro-batch, whether gradient
 * checkpointing helps, the smallest ZeRO stage and data-parallel degree.
 * The peak is monotone in the micro-batch, so a bracketed search suffices. */
#include "spec.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of device-level peak per sample of micro-batch, estimated from one
 * prediction: the activations and temporaries at the peak scale with the
 * micro-batch, scaled like the allocated peak is to the device-level one.
 * Only a first guess for max_batch's search; 0 when there is nothing to go on. */
static double slope_hint(const mm_prediction *p)
{
    double act = (double)p->factors.activations + (double)p->factors.temporaries;
    if (!p->micro_batch_size || !p->allocated_peak_bytes || act <= 0)
        return 0;
    return act / p->micro_batch_size * ((double)p->peak_bytes / (double)p->allocated_peak_bytes);
}

/* The device-level peak of `s` at its own data-parallel degree (and, when
 * hint is not NULL, slope_hint); -1 when the prediction fails (sizes that
 * overflow), which callers count as not fitting. */
static int peak_with(const mm_spec *s, uint64_t *peak, double *hint)
{
    mm_prediction p;
    mm_error e;
    if (mm_predict(s, &p, &e))
        return -1;
    *peak = p.peak_bytes;
    if (hint)
        *hint = slope_hint(&p);
    mm_prediction_free(&p);
    return 0;
}

/* Largest micro-batch in [1, MM_MB_CAP] whose peak fits `usable`; 0 if none.
 * The peak is monotone and nearly linear in the micro-batch (activations
 * grow with it, model states do not), so secant guesses converge in a few
 * predictions: from the spec's own micro-batch (peak `pk0` and slope_hint
 * `hint0`, or 0 = not yet predicted) it extrapolates with the hint, then
 * through the last two samples, then interpolates inside the bracket
 * [largest fit, smallest misfit).  Guesses are clamped
 * strictly inside the bracket, and a step that fails to halve it is followed
 * by a bisection, so the worst case stays logarithmic. */
#define MM_MB_CAP 65536u
static uint32_t max_batch(mm_spec *s, uint64_t usable, uint64_t pk0, double hint0)
{
    uint64_t lo = 0, hi = 0;            /* largest fit, smallest misfit; 0 = none */
    uint64_t lo_pk = 0, hi_pk = 0;
    uint64_t x = s->training.micro_batch_size, pk = pk0, width = UINT64_MAX;
    double hint = hint0;
    int bisect = 0;

    if (x < 1)
        x = 1;
    if (x > MM_MB_CAP)
        x = MM_MB_CAP;
    if (x != s->training.micro_batch_size)
        pk = 0;
    for (int iter = 0; iter < 64; iter++) {
        int fits;
        if (!pk) {
            s->training.micro_batch_size = x;
            fits = peak_with(s, &pk, iter == 0 ? &hint : NULL) == 0 && pk <= usable;
        } else {
            fits = pk <= usable;
        }
        /* the previous sample on the same side, for a slope before a bracket */
        uint64_t px = fits ? lo : hi, px_pk = fits ? lo_pk : hi_pk;
        if (fits) {
            lo = x;
            lo_pk = pk;
        } else {
            hi = x;
            hi_pk = pk; /* 0 when the prediction failed: no slope from it */
        }
        if ((hi && hi == lo + 1) || (!hi && lo >= MM_MB_CAP) || hi == 1)
            break;
        uint64_t w = hi ? hi - lo : UINT64_MAX;
        bisect = !bisect && hi && w > width / 2;
        width = w;

        double g; /* the next guess */
        uint64_t a = 0, a_pk = 0, b = 0, b_pk = 0; /* two samples, a < b */
        if (lo && hi && hi_pk > lo_pk) {
            a = lo, a_pk = lo_pk, b = hi, b_pk = hi_pk;
        } else if (px && px_pk && pk && px != x) {
            a = px < x ? px : x, a_pk = px < x ? px_pk : pk;
            b = px < x ? x : px, b_pk = px < x ? pk : px_pk;
        }
        if (!bisect && b && b_pk > a_pk) {
            double slope = (double)(b_pk - a_pk) / (double)(b - a);
            g = (double)a + ((double)usable - (double)a_pk) / slope;
        } else if (iter == 0 && hint > 0 && pk) {
            g = (double)x + ((double)usable - (double)pk) / hint;
        } else if (hi) {
            g = (double)lo + (double)(hi - lo) / 2.0;
        } else {
            g = (double)lo * 2.0;
        }
        /* strictly inside the bracket */
        double gmin = (double)lo + 1.0, gmax = hi ? (double)hi - 1.0 : (double)MM_MB_CAP;
        if (!(g >= gmin)) /* also catches NaN */
            g = gmin;
        if (g > gmax)
            g = gmax;
        x = (uint64_t)g;
        pk = 0;
    }
    return (uint32_t)lo;
}

uint32_t mm_max_micro_batch(const mm_spec *spec, uint64_t usable, const mm_prediction *at_spec)
{
    mm_spec *s = mm_spec_copy_decoded(spec);
    if (!s)
        return 0;
    uint32_t mb = max_batch(s, usable, at_spec ? at_spec->peak_bytes : 0,
                            at_spec ? slope_hint(at_spec) : 0);
    mm_spec_free(s);
    return mb;
}

/* Smallest N (1..1024) at which `s` fits with a ZeRO stage from `from` up
 * (only `from` when only_from); its stage in *stage, 0 if none.  One
 * prediction per stage: its data-parallel terms give every N at once. */
static uint32_t smallest_dp(mm_spec *s, int from, int only_from, uint64_t usable, int *stage)
{
    for (int z = from; z <= 3; z++) {
        s->training.zero_stage = z;
        if (s->training.precision != PREC_FP32)
            s->training.master_weights = MASTER_FP32;
        spec_derive(s);
        s->training.data_parallel = 2;
        mm_prediction q;
        mm_error e;
        if (mm_predict(s, &q, &e) == 0) {
            for (uint32_t n = 1; n <= 1024; n++) {
                if (mm_peak_for_dp(&q, n) <= usable) {
                    mm_prediction_free(&q);
                    *stage = z;
                    return n;
                }
            }
            mm_prediction_free(&q);
        }
        if (only_from)
            break; /* only the spec's own stage when it already uses ZeRO */
    }
    return 0;
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
    if (!spec->training.ckpt.enabled) {
        mm_spec *c = mm_spec_copy_decoded(spec);
        if (!c) {
            mm_err(err, "out of memory");
            return -1;
        }
        c->training.ckpt.enabled = 1;
        out->max_micro_batch_ckpt = max_batch(c, usable, 0, 0);
        mm_spec_free(c);
        out->checkpointing_helps = out->max_micro_batch_ckpt >= spec->training.micro_batch_size &&
                                   !out->fits;
    } else {
        out->max_micro_batch_ckpt = out->max_micro_batch;
    }
    /* smallest ZeRO stage at the spec's N */
    out->min_zero_stage = -1;
    mm_spec *s = mm_spec_copy_decoded(spec);
    if (!s) {
        mm_err(err, "out of memory");
        return -1;
    }
    for (int z = 0; z <= 3; z++) {
        s->training.zero_stage = z;
        /* DeepSpeed (and the spec's own mixed precision) keeps fp32 master weights */
        s->training.master_weights =
            (z >= 1 || spec->training.zero_stage >= 1) && s->training.precision != PREC_FP32
                ? MASTER_FP32
                : spec->training.master_weights;
        spec_derive(s);
        uint64_t pk;
        if (!peak_with(s, &pk, NULL) && pk <= usable) {
            out->min_zero_stage = z;
            break;
        }
    }
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
