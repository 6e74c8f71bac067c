/* fuzz_common.h - shared by the libFuzzer harnesses: predict a loaded spec and
 * render it, so that the predictor and the JSON writer see every spec the
 * loaders accept.  Everything allocated is freed: leaks are findings. */
#ifndef MM_FUZZ_COMMON_H
#define MM_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmguard.h"

/* A broken contract: say which, then abort (libFuzzer saves the input). */
#define FUZZ_FAIL(what)                                                                  \
    do {                                                                                 \
        fprintf(stderr, "FUZZ CONTRACT BROKEN at %s:%d: %s\n", __FILE__, __LINE__, what); \
        abort();                                                                         \
    } while (0)

/* Errors must be terminated strings that fit their buffer. */
static inline void fuzz_check_error(const mm_error *e)
{
    if (!memchr(e->msg, '\0', sizeof e->msg))
        FUZZ_FAIL("unterminated error message");
}

static inline uint64_t fuzz_sum(const mm_factors *f)
{
    uint64_t r = 0;
    const uint64_t v[] = {f->parameters, f->gradients, f->optimizer_states, f->activations,
                          f->temporaries};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (__builtin_add_overflow(r, v[i], &r))
            return UINT64_MAX;
    return r;
}

/* The breakdown must add up (mmguard.h): allocated = the five factors exactly;
 * parameter counts of layers and modules add up exactly; their factor rows add
 * up to within one byte per factor per row (ZeRO shards are rounded up row by
 * row when they do not divide evenly). */
static inline void fuzz_check_sums(const mm_prediction *p)
{
    if (fuzz_sum(&p->factors) != p->allocated_peak_bytes)
        FUZZ_FAIL("the five factors do not add up to allocated_peak_bytes");
    uint64_t mp = 0, mf = 0, rows = 0;
    for (size_t m = 0; m < p->n_modules; m++) {
        const mm_module_result *M = &p->modules[m];
        uint64_t lp = 0, lf = 0;
        for (size_t l = 0; l < M->n_layers; l++) {
            lp += M->layers[l].parameters_count;
            lf += fuzz_sum(&M->layers[l].factors);
            if (!memchr(M->layers[l].name, '\0', sizeof M->layers[l].name) ||
                !memchr(M->layers[l].kind, '\0', sizeof M->layers[l].kind))
                FUZZ_FAIL("unterminated layer name/kind");
        }
        uint64_t slack = 5 * (uint64_t)M->n_layers, mfs = fuzz_sum(&M->factors);
        if (lp != M->parameters_count || lf > mfs + slack || mfs > lf + slack)
            FUZZ_FAIL("a module's layer rows do not add up to the module");
        rows += M->n_layers;
        mp += M->parameters_count;
        mf += fuzz_sum(&M->factors);
    }
    if (mp != p->parameters_count || mf > p->allocated_peak_bytes + 5 * rows ||
        p->allocated_peak_bytes > mf + 5 * rows)
        FUZZ_FAIL("the modules do not add up to the totals");
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
            FUZZ_FAIL("mm_predict failed without a message");
        mm_prediction_free(&p);
        return;
    }
    /* the six factors must add up: allocated = the first five */
    if (p.peak_bytes < p.allocated_peak_bytes)
        FUZZ_FAIL("peak_bytes < allocated_peak_bytes");
    fuzz_check_sums(&p);
    (void)mm_peak_for_dp(&p, 1);
    (void)mm_peak_for_dp(&p, 2);
    (void)mm_peak_for_dp(&p, 1024);
    char *js = mm_prediction_json(&p, 0);
    if (!js)
        FUZZ_FAIL("mm_prediction_json returned NULL");
    free(js);
    js = mm_prediction_json(&p, 1);
    free(js);
    char buf[32];
    mm_format_bytes(p.peak_bytes, buf, sizeof buf);
    mm_prediction_free(&p);
}

/* One spec loader input: a load error must name the file; a loaded spec is
 * predicted and checked (the YAML and JSON harnesses differ only in fmt). */
static inline void fuzz_load_spec(const uint8_t *data, size_t size, const char *name, mm_format fmt)
{
    mm_error e;
    mm_spec *s = mm_spec_load_buffer((const char *)data, size, name, fmt, &e);
    if (!s) {
        fuzz_check_error(&e);
        if (!strstr(e.msg, name))
            FUZZ_FAIL("a load error does not name the file");
        return;
    }
    (void)mm_spec_name(s);
    (void)mm_spec_digest(s);
    fuzz_predict(s);
    mm_spec_free(s);
}

#endif
