/* step.h - one steady-state training step on the timeline: model states per
 * parallel strategy (DDP, DeepSpeed ZeRO 1-3, FSDP1/FSDP2), the forward,
 * backward and optimizer phases, and what stays on the host (offload). */
#ifndef MM_STEP_H
#define MM_STEP_H

#include "prog.h"

typedef struct step_cfg {
    const sim *rows_from;  /* rows and parameter counts of an earlier run, or NULL */
    uint64_t dp;           /* evaluate sharded bytes at this N */
    int symbolic;          /* collect the data-parallel envelope */
    uint64_t snap_at;      /* snapshot the breakdown at this event */
    int track_peak;        /* keep what sim_peak_snapshot needs (the breakdown at the peak) */
    uint64_t largest_param; /* with rows_from */
    int nofold;            /* every layer run (the allocator model needs them all) */
    int log;               /* keep the allocation log (sim.ev) */
} step_cfg;

/* Run one step of the resolved model on `s`.  0, or -1 with err set. */
int step_run(const resolved_model *rm, sim *s, const step_cfg *cfg, mm_error *err);

#endif
