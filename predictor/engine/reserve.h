/* reserve.h - the reserved peak of a training step: its allocation log
 * (sim.ev) replayed through the caching-allocator model (alloc.c). */
#ifndef MM_RESERVE_H
#define MM_RESERVE_H

#include "alloc.h"
#include "sim.h"

typedef struct reserve_result {
    uint64_t reserved_peak;   /* max_memory_reserved() over steps 1 and 2 */
    uint64_t allocated_peak;  /* max_memory_allocated(): block sizes, rounded */
    /* at a capacity (reserve_replay_cap): */
    uint64_t retries;         /* num_alloc_retries over both steps: cache freed, cudaMalloc again */
    uint64_t retries_step;    /* those of the second, steady-state step */
    int oom;                  /* a request found no room even with the cache freed */
    int oom_setup;            /* ... while the model states were laid out, before step 1 */
    uint8_t oom_phase;        /* mm_phase of the failing request */
    uint32_t oom_row;         /* its sim row */
    uint64_t oom_request;     /* its size (bytes asked for) */
    uint64_t oom_allocated;   /* live blocks then (memory_allocated) */
    uint64_t oom_reserved;    /* segments then, after the cache was freed */
    uint64_t oom_largest_free;/* the largest free block the cache still held */
    int stopped;              /* reserve_replay_until: the reserved peak passed its bound */
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
/* With MMGUARD_REPLAY_FOLD=1 in the environment ("verbose": say each fold on
 * stderr; "check": also replay again unfolded and say on stderr where the
 * allocator's state after a fold differs; "0" or unset: off) the replays
 * fast-forward the repeated periods of the log whose allocator state
 * provably repeats (alloc_fold.h), with the same results (tests/fold/fold.py
 * holds them to it).  Off by default: on the shipped presets the search for
 * such periods costs more than the fold saves (LLaVA-1.5-7B fine-tune
 * 14.4 M instructions folded against 7.2 M, Qwen2.5-VL-72B ZeRO-3 49.1 M
 * against 23.6 M: their checkpointed layers leave states that are not the
 * last one's shifted - the backward's transients spill into other blocks
 * until the cache holds enough 688 MiB segments - docs/allocator.md). */
/* The same on a card: the allocator may reserve at most `capacity` bytes (the
 * card less the CUDA context, NCCL and the admin's margin); `device_total` is
 * the card's memory (a memory fraction's base; 0 = 80 GiB).  When a request
 * finds no room the model frees its cache and retries as
 * DeviceCachingAllocator::malloc does (alloc.c); if it still finds none the
 * replay stops there and out->oom says where.  0 ok (out->oom tells), -1 the
 * host ran out of memory. */
int reserve_replay_cap(const sim *s, uint64_t n, const mm_alloc_conf *conf, int per_param_states,
                       int pairs, uint64_t capacity, uint64_t device_total, reserve_result *out);
/* reserve_replay, ended as soon as the steps' reserved peak exceeds
 * `stop_above` (out->stopped; the peak only grows, so the whole replay's
 * would exceed it too): for a search that needs only "above or not".
 * Without a stop (UINT64_MAX) the same as reserve_replay. */
int reserve_replay_until(const sim *s, uint64_t n, const mm_alloc_conf *conf,
                         int per_param_states, int pairs, uint64_t stop_above,
                         reserve_result *out);

#endif
