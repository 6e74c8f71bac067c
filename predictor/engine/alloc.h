/* alloc.h - a model of PyTorch's CUDA caching allocator (internal API).
 *
 * Why this exists: what a training job holds on the GPU is not the bytes its
 * tensors use (torch.cuda.max_memory_allocated) but the segments the caching
 * allocator got from the driver (max_memory_reserved): block rounding, 2 MiB /
 * 20 MiB segments, blocks that cannot be split or reused.  Replaying the
 * predicted sequence of allocations and frees through this model gives the
 * reserved peak.  It follows c10/cuda/CUDACachingAllocator.cpp and
 * c10/core/AllocatorConfig.cpp of PyTorch 2.x (main as of 2025, checked against
 * allocator traces recorded with torch 2.11 on an H100: tests/gpu_data/traces);
 * function names in comments are that file's.  One device, one stream, no CUDA
 * graphs, no IPC, no record_stream(): what a training step on one GPU does.
 */
#ifndef MM_ALLOC_H
#define MM_ALLOC_H

#include <stdint.h>
#include "mmguard.h"

typedef struct mm_allocator mm_allocator;

/* capacity: bytes the allocator may get from the driver before cudaMalloc
 * fails (GPU memory minus context and other processes); 0 = unlimited.
 * device_total: the GPU's total memory (memory fraction, expandable segments'
 * address space); 0 = 80 GiB.  NULL when out of memory. */
mm_allocator *mm_allocator_new(const mm_alloc_conf *conf, uint64_t capacity,
                               uint64_t device_total);
void mm_allocator_free(mm_allocator *a);
/* A block for `size` bytes (torch's orig_size): a handle >= 0, MM_ALLOC_OOM
 * when the model's device is full even after freeing the cache, or
 * MM_ALLOC_NOMEM when the host ran out of memory. */
#define MM_ALLOC_OOM (-1)
#define MM_ALLOC_NOMEM (-2)
int64_t mm_allocator_malloc(mm_allocator *a, uint64_t size);
/* Return a handle's block to the cache (DeviceCachingAllocator::free). */
void mm_allocator_release(mm_allocator *a, int64_t handle);
/* One event of a log to replay: a request for `bytes` (is_free 0) whose
 * handle goes to handles[id], or the release of handles[id] (then set to -1).
 * row, phase and cls are the caller's, carried along (the sim's log is an
 * array of these: sim_ev, sim.h). */
typedef struct mm_alloc_ev {
    uint64_t bytes;
    int32_t id;
    uint32_t row;
    uint8_t is_free, phase, cls;
} mm_alloc_ev;
/* ev[0 .. n) in turn, as mm_allocator_malloc and _release would (without a
 * call per event), until *stop is set (a segment callback may set it) or a
 * request gets no block (its handle, < 0, in handles[id]: the caller says
 * why).  The events run. */
size_t mm_allocator_run(mm_allocator *a, const mm_alloc_ev *ev, size_t n, int64_t *handles,
                        const int *stop);
/* torch.cuda.empty_cache(): every unsplit cached segment back to the driver. */
void mm_allocator_empty_cache(mm_allocator *a);
/* torch.cuda.reset_peak_memory_stats() */
void mm_allocator_reset_peaks(mm_allocator *a);
/* (not const: inactive_split is derived here when malloc and free did not
 * keep it) */
const mm_alloc_stats *mm_allocator_stats(mm_allocator *a);
/* The largest free block the cache holds (what a request could still get
 * without a new segment): the OutOfMemoryError's "reserved but unallocated"
 * is their sum, this is its largest piece. */
uint64_t mm_allocator_largest_free(const mm_allocator *a);
/* Called with every segment the model gets from the driver (got = 1: cudaMalloc
 * or expandable pages mapped) or gives back (got = 0): the replay compares them
 * with a real trace's segment events. */
typedef void (*mm_segment_cb)(void *ctx, int got, uint64_t bytes);
void mm_allocator_on_segment(mm_allocator *a, mm_segment_cb cb, void *ctx);
/* The address the next cudaMalloc returns (a replay knows it from the trace).
 * Addresses decide ties between free blocks of equal size, so a replay with
 * the real ones takes the very blocks the real allocator took; without a hint
 * the model hands out decreasing addresses, as the driver did in every trace. */
void mm_allocator_next_address(mm_allocator *a, uint64_t addr);
/* the rounded block size torch gives a request (round_size) */
uint64_t mm_alloc_round_size(const mm_alloc_conf *conf, uint64_t size);

#endif
