/* dp.h - the per-GPU peak as a function of the data-parallel degree N
 * (internal; see dp.c). */
#ifndef MM_DP_H
#define MM_DP_H

#include "reserve.h"
#include "step.h"

/* The allocation log of one simulated step (every layer run), replayable
 * through the caching-allocator model at any N: the sim's events come in the
 * same order at every N, only their sizes depend on it (reserve.h). */
typedef struct steplog {
    sim s;
    mm_alloc_conf conf;
    int per_param, pairs;  /* reserve_replay's arguments for this spec */
    uint64_t n_log;        /* the degree the sim ran at (>= 2: DDP buckets logged) */
    int per_degree;        /* dp_per_degree(): each N gets its own sim */
    int n_dependent;       /* a sharded tensor (or paged states divided by N): the replay
                              and the paged bytes differ from one N to another; else they
                              are the same for every N >= 2 */
} steplog;

/* One step of the spec: step_run of rm, sp resolved (spec/resolve.h); or when
 * rm is NULL, sp resolved here, run and released.  0, or -1 with err set. */
int step_run_spec(const mm_spec *sp, const resolved_model *rm, sim *s, const step_cfg *cfg,
                  mm_error *err);
/* The degree steplog_run simulates `sp` at for (n, own_n): n itself with
 * own_n or for a per-degree spec, else max(n, 2). */
uint64_t steplog_degree(const mm_spec *sp, uint64_t n, int own_n);
/* Simulate `sp` with every layer at max(n, 2), rows from `rows_from` (an
 * earlier run of the same spec) when not NULL; own_n: at n itself (a log at
 * N = 1 lacks the DDP buckets and serves N = 1 only); rm: sp resolved, or NULL:
 * resolved for this step.  0, or -1 with err. */
int steplog_run(const mm_spec *sp, const resolved_model *rm, const sim *rows_from,
                uint64_t largest, uint64_t n, int own_n, steplog *L, mm_error *err);
/* The allocator model's reserved peak over two steps at degree n. */
int steplog_reserved(const steplog *L, uint64_t n, uint64_t *reserved, mm_error *err);
/* the whole replay result of the log at n (steplog_reserved keeps its reserved peak) */
int steplog_replay(const steplog *L, uint64_t n, reserve_result *r, mm_error *err);
void steplog_free(steplog *L);

/* Replay L at degree n and record it in p (every N >= 2 at once when N does
 * not change the replay).  `sp` is the spec L and p come from. */
int dp_cover_at(const mm_spec *sp, const resolved_model *rm, const steplog *L, mm_prediction *p,
                uint32_t n, mm_error *err);
/* ZeRO and FSDP lay their partitions out per N (DeepSpeed's padded flat
 * groups, round-robin gradient order and sub-groups; FSDP's padded flat
 * parameters, parallel_*.c), so one N's log does not give another N's sizes:
 * each degree is simulated on its own and its point keeps its allocated peak. */
int dp_per_degree(const mm_spec *sp);
/* Whether a dp point of p covers n. */
int dp_covered(const mm_prediction *p, uint32_t n);

/* Bytes on the GPU outside the caching allocator (paged optimizer states) at
 * degree n: a sim of `sp` at n stopped at its first event (the model states
 * are counted before it).  rows_from as for steplog_run. */
int dp_paged_at(const mm_spec *sp, const resolved_model *rm, const sim *rows_from,
                uint64_t largest, uint64_t n, uint64_t *paged, mm_error *err);

/* The dp terms of a prediction from the step's pareto points (fixed + N > 1
 * only, sharded): every point that is the maximum at some N >= 2.  Returns
 * the number written to out (<= MM_MAX_TERMS); *exact = 0 when more points
 * were needed and two were merged into their maximum (an over-estimate). */
size_t dp_envelope(const mm_dp_term *in, size_t n, mm_dp_term *out, int *exact);

/* allocated(n) of a prediction: allocated_dp1 at 1, the terms above. */
uint64_t dp_allocated(const mm_prediction *p, uint32_t n);
/* Device-level bytes: allocated (1 + frac) + fixed + slack + context (+ NCCL). */
uint64_t dp_device_level(const mm_overheads *o, uint64_t alloc, uint64_t slack, uint32_t n);
/* Record what a replay at the degrees [from, to] gave (merged with an equal
 * neighbour).  0, or -1 out of memory. */
int dp_add_point(mm_prediction *p, uint32_t from, uint32_t to, uint64_t reserved,
                 uint64_t paged, uint64_t allocated);

#endif
