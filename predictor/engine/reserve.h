/* reserve.h - the reserved peak of a training step: its allocation log
 * (sim.ev) replayed through the caching-allocator model (alloc.c). */
#ifndef MM_RESERVE_H
#define MM_RESERVE_H

#include "alloc.h"
#include "sim.h"

typedef struct reserve_result {
    uint64_t reserved_peak;   /* max_memory_reserved() over steps 1 and 2 */
    uint64_t allocated_peak;  /* max_memory_allocated(): block sizes, rounded */
} reserve_result;

/* `s` ran one step with log = 1, at any data-parallel degree N >= 2 (or at
 * N = 1 when n = 1): the sim's event order does not depend on N, only the
 * sizes do, and they are taken at `n` from the tensors (sharded ones / n, DDP
 * buckets only when n > 1), so one log serves every n.  The replay is what a training script does
 * on a fresh process: the model's parameters (one tensor each, model order),
 * the cache emptied and the peaks reset, then two steps, the first creating
 * the optimizer states lazily when its optimizer phase begins (as
 * torch.optim's _init_group does), each state split per parameter when
 * `per_param_states` (plain torch; ZeRO keeps flat partitions), two per
 * parameter when `pairs` (Adam's exp_avg, exp_avg_sq).  0 ok, -1 out of
 * memory. */
int reserve_replay(const sim *s, uint64_t n, const mm_alloc_conf *conf, int per_param_states,
                   int pairs, reserve_result *out);

#endif
