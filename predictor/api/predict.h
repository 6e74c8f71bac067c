/* predict.h - internal entry points of predict.c for the library and its
 * unit tests (not installed, not for the plugin). */
#ifndef MM_PREDICT_H
#define MM_PREDICT_H

#include "dp.h"
#include "mmguard.h"

#define MM_PREDICT_NOFOLD 1u  /* simulate every layer (tests check folding is exact) */
#define MM_PREDICT_OWN_LOG 2u /* the allocator replays a step simulated at the spec's own
                                 N, not one that serves every N (tests: the same numbers) */
/* the device-level constants of a spec: the defaults, or its `device:` block */
mm_overheads predict_overheads(const mm_spec *sp);

int mm_predict_ex(const mm_spec *sp, mm_prediction *out, mm_error *err, unsigned flags);

/* What a prediction leaves for a verdict on the same spec (verdict.c): the
 * step's allocation log, its uncapped replay (device_total: the default), and
 * the first run's rows with its allocated peak, paged bytes and largest
 * parameter.  Valid after mm_predict_keep returned 0; free with
 * predict_keep_free. */
typedef struct predict_keep {
    steplog L;
    reserve_result free_run;
    sim rows;
} predict_keep;
int mm_predict_keep(const mm_spec *sp, mm_prediction *out, mm_error *err, unsigned flags,
                    predict_keep *keep);
void predict_keep_free(predict_keep *k);

/* The allocated figures of mm_predict alone - allocated_peak_bytes, the peak's
 * phase and event, phase_peak, allocated_dp1 and the dp terms -, from its first
 * (folded, symbolic) run: no allocator replay, no dp points, no breakdown.
 * What a search over N needs to skip the degrees whose live tensors cannot fit.
 * With `rows` (else NULL), when it returns 0: that run's rows, parameter counts
 * (largest_param too) and per-layer tables, for later steps of the same spec
 * (step.h rows_from); free with sim_free. */
int mm_predict_allocated(const mm_spec *sp, mm_prediction *out, sim *rows, mm_error *err);

/* The device-level peak alone, as mm_predict's peak_bytes, without the
 * breakdown: what the searches of fit.c need. */
typedef struct mm_peak_only {
    uint64_t allocated;  /* allocated peak at the spec's N */
    uint64_t paged;      /* outside the caching allocator */
    uint64_t lower;      /* the peak with no allocator slack: never above peak */
    uint64_t peak;       /* peak_bytes (0 with lower_only: no allocator replay) */
} mm_peak_only;
int mm_predict_peak(const mm_spec *sp, mm_peak_only *out, int lower_only, mm_error *err);
/* The same with the allocator replay ended early once the peak is known to
 * exceed `usable`: then out->peak is UINT64_MAX, else exactly peak_bytes.
 * For searches that need only whether it fits. */
int mm_predict_peak_fits(const mm_spec *sp, mm_peak_only *out, uint64_t usable, mm_error *err);

#endif
