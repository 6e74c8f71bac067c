/* fit.c - "what would fit": the largest micro-batch, whether gradient
 * checkpointing helps, the smallest ZeRO stage and data-parallel degree.
 * The peak is monotone in the micro-batch, so a binary search suffices. */
#include "spec.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int peak_with(mm_spec *s, uint64_t *peak, mm_error *err)
{
    mm_prediction p;
    if (mm_predict(s, &p, err))
        return -1;
    *peak = p.peak_bytes;
    mm_prediction_free(&p);
    return 0;
}

/* largest micro-batch in [1, hi] with peak <= usable; 0 if none.  Sizes that
 * overflow count as not fitting. */
static uint32_t max_batch(const mm_spec *base, int ckpt, uint64_t usable)
{
    mm_spec *s = mm_spec_clone(base);
    if (!s)
        return 0;
    s->training.gradient_checkpointing = ckpt;
    uint64_t lo = 0, hi = 1;
    mm_error e;
    uint64_t pk;
    /* exponential search for an upper bound */
    for (;;) {
        s->training.micro_batch_size = hi;
        if (peak_with(s, &pk, &e) || pk > usable)
            break;
        lo = hi;
        if (hi >= (1u << 16))
            break;
        hi *= 2;
    }
    if (lo == hi) {
        mm_spec_free(s);
        return (uint32_t)lo;
    }
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        s->training.micro_batch_size = mid;
        if (!peak_with(s, &pk, &e) && pk <= usable)
            lo = mid;
        else
            hi = mid;
    }
    mm_spec_free(s);
    return (uint32_t)lo;
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
    mm_prediction_free(&p);
    out->max_micro_batch = max_batch(spec, spec->training.gradient_checkpointing, usable);
    if (!spec->training.gradient_checkpointing) {
        out->max_micro_batch_ckpt = max_batch(spec, 1, usable);
        out->checkpointing_helps = out->max_micro_batch_ckpt >= spec->training.micro_batch_size &&
                                   !out->fits;
    } else {
        out->max_micro_batch_ckpt = out->max_micro_batch;
    }
    /* smallest ZeRO stage at the spec's N */
    out->min_zero_stage = -1;
    mm_spec *s = mm_spec_clone(spec);
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
        uint64_t pk;
        mm_error e;
        if (!peak_with(s, &pk, &e) && pk <= usable) {
            out->min_zero_stage = z;
            break;
        }
    }
    /* smallest N at max(zero, 1), first with the spec's checkpointing; if no N
     * fits and it was off, with it on: ZeRO shards model states, never activations */
    int from = spec->training.zero_stage >= 1 ? spec->training.zero_stage : 1;
    int only_from = spec->training.zero_stage >= 1;
    int stage = -1;
    s->training.gradient_checkpointing = spec->training.gradient_checkpointing;
    uint32_t n = smallest_dp(s, from, only_from, usable, &stage);
    if (!n && !spec->training.gradient_checkpointing) {
        s->training.gradient_checkpointing = 1;
        n = smallest_dp(s, from, only_from, usable, &stage);
        out->min_data_parallel_ckpt = n != 0;
    }
    out->min_data_parallel = n;
    out->min_data_parallel_zero = n ? stage : -1;
    mm_spec_free(s);
    return 0;
}
