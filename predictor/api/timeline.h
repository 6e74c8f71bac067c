/* timeline.h - the predicted step as a picture's data (issue 25): live bytes
 * over the step's allocation events, by factor and by module, and what the
 * caching allocator model reserves.  Read-only: it runs the step with the
 * event log on (step_run, as dp.c does) and samples it; it changes nothing
 * in the engine.  `mmguard predict --html` draws it (cli_html.c). */
#ifndef MM_TIMELINE_H
#define MM_TIMELINE_H

#include <stddef.h>
#include <stdint.h>

#include "mmguard.h"

#define MM_TL_FACTORS 5         /* parameters, gradients, optimizer, activations, temporaries */
#define MM_TL_MODULES (MM_MAX_MODULES + 1)   /* the spec's modules, then "other" */
#define MM_TL_POINTS 600        /* samples at most (the event of the largest total in each bucket) */

typedef struct mm_tl_point {
    uint64_t event;                     /* index in the step's events */
    uint64_t factor[MM_TL_FACTORS];     /* live bytes per factor */
    uint64_t module[MM_TL_MODULES];     /* live bytes per module */
    uint64_t reserved;                  /* the allocator model's reserved bytes */
    uint8_t phase;                      /* mm_phase */
} mm_tl_point;

typedef struct mm_timeline {
    size_t n;
    mm_tl_point pts[MM_TL_POINTS];
    uint64_t events;                    /* allocation events of the step */
    uint64_t peak_live;                 /* the largest live total over the events */
    uint64_t peak_event;                /* its event index */
    size_t peak_point;                  /* the sample that holds it */
    uint64_t reserved_peak;
    size_t n_modules;
    char module_names[MM_TL_MODULES][MM_MAX_NAME];
    uint32_t data_parallel;
} mm_timeline;

extern const char *const mm_tl_factor_names[MM_TL_FACTORS];

/* Run the spec's step at its data-parallel degree and sample it into tl
 * (caller-allocated: it is large).  0 ok, -1 with err. */
int mm_timeline_build(const mm_spec *sp, mm_timeline *tl, mm_error *err);

#endif
