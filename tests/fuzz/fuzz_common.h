/* fuzz_common.h - shared by the libFuzzer harnesses: predict a loaded spec and
 * render it, so that the predictor and the JSON writer see every spec the
 * loaders accept.  Everything allocated is freed: leaks are findings. */
#ifndef MM_FUZZ_COMMON_H
#define MM_FUZZ_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mmguard.h"

/* Errors must be terminated strings that fit their buffer. */
static inline void fuzz_check_error(const mm_error *e)
{
    if (!memchr(e->msg, '\0', sizeof e->msg))
        abort();
}

/* Predict, render and free; also exercises mm_peak_for_dp and clone. */
static inline void fuzz_predict(const mm_spec *spec)
{
    mm_prediction p;
    mm_error e;
    memset(&p, 0, sizeof p);
    memset(&e, 0, sizeof e);
    if (mm_predict(spec, &p, &e) != 0) {
        fuzz_check_error(&e);
        if (e.msg[0] == '\0')
            abort(); /* a failure must say why */
        mm_prediction_free(&p);
        return;
    }
    /* the six factors must add up: allocated = the first five */
    if (p.peak_bytes < p.allocated_peak_bytes)
        abort();
    (void)mm_peak_for_dp(&p, 1);
    (void)mm_peak_for_dp(&p, 2);
    (void)mm_peak_for_dp(&p, 1024);
    char *js = mm_prediction_json(&p, 0);
    if (!js)
        abort();
    free(js);
    js = mm_prediction_json(&p, 1);
    free(js);
    char buf[32];
    mm_format_bytes(p.peak_bytes, buf, sizeof buf);
    mm_prediction_free(&p);
}

#endif
