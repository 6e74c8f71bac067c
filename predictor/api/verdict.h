/* verdict.h - does a job run on a card?  The step's allocation log replayed
 * through the caching-allocator model at the capacity the card really leaves
 * it (internal; the public types are mmguard.h's mm_verdict). */
#ifndef MM_VERDICT_H
#define MM_VERDICT_H

#include "mmguard.h"

/* The capacity the caching allocator may reserve on a card whose usable bytes
 * (its memory less the admin's margin and reserve) are `usable`, at N GPUs:
 * less the CUDA context, NCCL's buffers (N > 1) and the spec's extra slack.
 * 0 when those alone take everything. */
uint64_t verdict_capacity(const mm_overheads *o, uint64_t usable, uint64_t allocated,
                          uint32_t n);

#endif
