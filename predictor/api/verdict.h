/* verdict.h - does a job run on a card?  The step's allocation log replayed
 * through the caching-allocator model at the capacity the card really leaves
 * it (internal; the public types are mmguard.h's mm_verdict). */
#ifndef MM_VERDICT_H
#define MM_VERDICT_H

#include "mmguard.h"
#include "resolve.h"

struct sim;

/* The capacity the caching allocator may reserve on a card whose usable bytes
 * (its memory less the admin's margin and reserve) are `usable`, at N GPUs:
 * less the CUDA context, NCCL's buffers (N > 1) and the spec's extra slack.
 * 0 when those alone take everything. */
uint64_t verdict_capacity(const mm_overheads *o, uint64_t usable, uint64_t allocated,
                          uint32_t n);

/* The CUDA context, NCCL (n > 1) and the spec's extra slack: the bytes on
 * the card outside the caching allocator at an allocated peak. */
uint64_t verdict_outside(const mm_overheads *o, uint64_t allocated, uint32_t n);

/* mm_verdict_for(sp, gpu_bytes, usable, 0, v)'s kind, retries, reserved
 * peak, capacity and context bytes, for searches that ask many candidates
 * (fit.c): one replay at the capacity, none when the live tensors alone
 * exceed it (then oom_event says so and oom_request is 0).  reserved_uncapped
 * is known only when it fits (else 0).  0, or -1 with err (a spec the model
 * refuses, e.g. sizes that overflow).  `rows`, or NULL: a finished step of the
 * same spec at another micro-batch, whose rows and parameter counts (which
 * the micro-batch does not change) spare the step its counting pass (step.h
 * rows_from).  `rm`: sp resolved (spec/resolve.h), or NULL: resolved here. */
int verdict_quick(const mm_spec *sp, const resolved_model *rm, uint64_t gpu_bytes,
                  uint64_t usable, const struct sim *rows, mm_verdict *v, mm_error *err);

/* Whether the verdict of verdict_quick(sp, gpu_bytes, usable) is FITS, for
 * searches that ask only that (flush=reject: a flush does not count): the
 * allocated peak above the capacity fails without a replay, and where the
 * uncapped replay does not read the card's size it is stopped as soon as
 * its reserved peak passes the capacity (reserve_replay_until).  1 fits, 0
 * not, -1 with err as verdict_quick. */
int verdict_fits_clean(const mm_spec *sp, uint64_t gpu_bytes, uint64_t usable, mm_error *err);
/* the same with rm and rows as verdict_quick's */
int verdict_fits_clean_rows(const mm_spec *sp, const resolved_model *rm, uint64_t gpu_bytes,
                            uint64_t usable, const struct sim *rows, mm_error *err);

#endif
