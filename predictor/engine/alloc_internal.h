/* alloc_internal.h - the caching-allocator model's own data (engine layer):
 * shared by alloc.c, which runs it, and alloc_fold.c, which fast-forwards it
 * over repeated periods of a replay.  Not for other files. */
#ifndef MM_ALLOC_INTERNAL_H
#define MM_ALLOC_INTERNAL_H

#include "alloc.h"

#define ADDR_BASE 0x7f0000000000ull

typedef struct blk {
    uint64_t ptr, size, req;
    int32_t prev, next;   /* neighbours in the segment, -1 none */
    int32_t seg;          /* expandable segment (0 small, 1 large), -1 cudaMalloc'ed */
    uint8_t small, allocated, mapped, in_use_slot;
    int64_t gc_base;
    uint64_t stamp;       /* a->clock when its content (ptr, size, req, allocated, mapped)
                             last changed while a fold's mark was open (a->rec), or
                             when it was made: what a fold compares (alloc_fold.c) */
} blk;

typedef struct ivec {
    int32_t *v;
    size_t n, cap;
} ivec;

/* a free block in its pool, with the key it is sorted by (kept beside the
 * index: the best-fit searches read the keys alone) */
typedef struct pkey {
    uint64_t size, ptr;
    int32_t i;
} pkey;

typedef struct kvec {
    pkey *v;
    size_t n, cap;
} kvec;

typedef struct pool {
    int small;
    kvec blocks;          /* free mapped blocks, by (size, ptr) */
    ivec unmapped;        /* expandable: unmapped ranges, by ptr */
    int64_t gc_calls;     /* get_free_blocks_call_count */
} pool;

typedef struct xseg {     /* one ExpandableSegment per pool (one stream) */
    int exists;
    uint64_t base, page, size;
} xseg;

struct mm_allocator {
    mm_alloc_conf conf;
    uint64_t capacity, device_total, allowed_max;
    uint64_t next_addr;   /* cudaMalloc: downwards from ADDR_BASE */
    uint64_t xs_addr;     /* expandable segments' address space: upwards from it */
    blk *b;
    size_t nb, capb;
    ivec freeslots;
    pool pools[2];        /* 0 small, 1 large */
    xseg xs[2];
    mm_alloc_stats st;
    int nomem;
    mm_segment_cb seg_cb;
    void *seg_ctx;
    uint64_t hint;        /* address of the next cudaMalloc, 0 = invent one */
    int round_plain;      /* no roundup_power2_divisions: sizes round to 512 bytes */
    uint64_t clock;       /* counts content changes of blocks (blk.stamp) */
    /* while a fold's mark is open: each best-fit search of the cache, the
     * rounded request, the size of the block found (UINT64_MAX none) and its address,
     * by pool (alloc_fold.c: a free block the searches never reach) */
    int rec;
    struct rec_search {
        uint64_t req, got, ptr; /* the rounded request; the block found's size, address */
        uint64_t cmin, cmax;    /* the other free blocks of its size: lowest, highest address */
        int small, others;      /* ... and whether there were any */
        int whole;              /* the block found and those others all whole (no neighbours) */
    } *recs;
    size_t nrecs, caprecs;
};

/* a block slot (a free one reused first) for a new block: its index, -1 out of
 * memory (a->nomem); and the slot of a block that is gone */
int32_t alloc_blk_new(mm_allocator *a, uint64_t ptr, uint64_t size, int small, int seg);
void alloc_blk_delete(mm_allocator *a, int32_t i);
/* note a search of pool p (a->rec): block `got` found at `at`, -1 none */
void alloc_rec_search(mm_allocator *a, const pool *p, uint64_t req, int32_t got, size_t at);

#endif
