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
    int32_t fprev, fnext; /* in its pool (pooled): the free blocks before and after it
                             in BlockComparatorSize's order, -1 none */
    uint8_t small, allocated, mapped, in_use_slot, pooled;
    uint16_t cls;         /* in its pool: its size class (pool_class) */
    int64_t gc_base;
    uint64_t stamp;       /* a->clock when its content (ptr, size, req, allocated, mapped)
                             last changed while a fold's mark was open (a->rec), or
                             when it was made: what a fold compares (alloc_fold.c) */
} blk;

typedef struct ivec {
    int32_t *v;
    size_t n, cap;
} ivec;

/* A pool's free mapped blocks in BlockComparatorSize's order (size, then
 * address; the one stream's key left out), cut into size classes - 16 per
 * power of two, as a TLSF allocator's: each class a list of its blocks in that
 * order (linked through blk.fprev / blk.fnext, -1 at the class's ends) with
 * its first and last block, and a bit in two bitmaps when it has any.  The
 * pool's order is the classes' lists one after the other (pool_next,
 * pool_prev: the next class with blocks is a few bit operations away), so a
 * block that opens a class needs no neighbour from another one.  Best fit
 * starts at the first block of the first class not below the request's and
 * steps past the smaller ones of that class; a block goes in at its class's
 * end or after a walk of its class, and out in constant time.  Searching a
 * vector of every free block sorted by (size, address), and moving it on every
 * change, was most of a replay's cost. */
#define POOL_SUB_BITS 4                     /* 16 classes per power of two */
#define POOL_CLASSES (64 << POOL_SUB_BITS)
typedef struct pool {
    int small;
    size_t nfree;         /* free mapped blocks (in the list) */
    uint64_t top;         /* bit k: a class of power of two k has blocks */
    uint16_t sub[64];     /* bit j of sub[k]: class k * 16 + j has blocks */
    int32_t first[POOL_CLASSES], last[POOL_CLASSES]; /* each class's, when it has any */
    ivec unmapped;        /* expandable: unmapped ranges, by ptr */
    int64_t gc_calls;     /* get_free_blocks_call_count */
} pool;

/* the class of blocks of `size` bytes: its power of two and the next four
 * bits below the highest (classes ascend with sizes) */
static inline unsigned pool_class(uint64_t size)
{
    if (size < (1u << POOL_SUB_BITS))
        size = 1u << POOL_SUB_BITS;
    unsigned top = 63u - (unsigned)__builtin_clzll(size);
    unsigned sub = (unsigned)(size >> (top - POOL_SUB_BITS)) & ((1u << POOL_SUB_BITS) - 1);
    return top << POOL_SUB_BITS | sub;
}

/* the first class >= c with blocks, -1 none */
static inline int pool_class_from(const pool *p, unsigned c)
{
    if (c >= POOL_CLASSES)
        return -1;
    unsigned top = c >> POOL_SUB_BITS;
    unsigned m = p->sub[top] & (0xffffu << (c & ((1u << POOL_SUB_BITS) - 1)));
    if (m)
        return (int)(top << POOL_SUB_BITS | (unsigned)__builtin_ctz(m));
    uint64_t t = top < 63 ? p->top & (~0ull << (top + 1)) : 0;
    if (!t)
        return -1;
    top = (unsigned)__builtin_ctzll(t);
    return (int)(top << POOL_SUB_BITS | (unsigned)__builtin_ctz(p->sub[top]));
}

/* the last class <= c with blocks, -1 none */
static inline int pool_class_upto(const pool *p, int c)
{
    if (c < 0)
        return -1;
    unsigned top = (unsigned)c >> POOL_SUB_BITS;
    unsigned m = p->sub[top] & (0xffffu >> (15 - ((unsigned)c & ((1u << POOL_SUB_BITS) - 1))));
    if (m)
        return (int)(top << POOL_SUB_BITS | (31u - (unsigned)__builtin_clz(m)));
    uint64_t t = top ? p->top & ((1ull << top) - 1) : 0;
    if (!t)
        return -1;
    top = 63u - (unsigned)__builtin_clzll(t);
    return (int)(top << POOL_SUB_BITS | (31u - (unsigned)__builtin_clz(p->sub[top])));
}

/* the pool's first free block (smallest, lowest address), -1 none */
static inline int32_t pool_first(const pool *p)
{
    int c = pool_class_from(p, 0);
    return c < 0 ? -1 : p->first[c];
}

/* its last (largest, highest address), -1 none */
static inline int32_t pool_last(const pool *p)
{
    int c = pool_class_upto(p, POOL_CLASSES - 1);
    return c < 0 ? -1 : p->last[c];
}

/* the free block after block i (in pool p) in the pool's order, -1 none */
static inline int32_t pool_next(const blk *b, const pool *p, int32_t i)
{
    if (b[i].fnext >= 0)
        return b[i].fnext;
    int c = pool_class_from(p, b[i].cls + 1u);
    return c < 0 ? -1 : p->first[c];
}

/* ... and the one before it, -1 none */
static inline int32_t pool_prev(const blk *b, const pool *p, int32_t i)
{
    if (b[i].fprev >= 0)
        return b[i].fprev;
    int c = pool_class_upto(p, (int)b[i].cls - 1);
    return c < 0 ? -1 : p->last[c];
}

/* the first free block not below (size, 0), -1 none: the first of the
 * first class with blocks from size's on, past those below size (the
 * next class's first when the whole class is below it) */
static inline int32_t pool_first_fit(const blk *b, const pool *p, uint64_t size)
{
    int c = pool_class_from(p, pool_class(size));
    if (c < 0)
        return -1;
    int32_t i = p->first[c];
    while (b[i].size < size) {
        i = b[i].fnext;
        if (i < 0) {
            c = pool_class_from(p, (unsigned)c + 1);
            return c < 0 ? -1 : p->first[c];
        }
    }
    return i;
}

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
    int gc;               /* garbage collection: a memory fraction and a threshold */
    uint64_t clock;       /* counts content changes of blocks (blk.stamp) */
    /* no garbage collection, expandable segments or max_split_size (plain_conf),
     * and no fold's mark open (!rec): malloc and free skip what those need
     * with this one test, and keep no st.inactive_split (derived when asked:
     * alloc_inactive_split, mm_allocator_stats) */
    int plain_conf, plain;
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

/* a fold's mark opens (on = 1: a->rec, stamps and searches recorded) or
 * closes: a->plain follows, and a->st.inactive_split is made current when
 * malloc and free are to keep it again */
void alloc_set_rec(mm_allocator *a, int on);
/* inactive_split_bytes now: a->st.inactive_split, or derived from the free
 * blocks while a->plain (malloc and free leave it alone then) */
uint64_t alloc_inactive_split(const mm_allocator *a);

/* a block slot (a free one reused first) for a new block: its index, -1 out of
 * memory (a->nomem); and the slot of a block that is gone */
int32_t alloc_blk_new(mm_allocator *a, uint64_t ptr, uint64_t size, int small, int seg);
void alloc_blk_delete(mm_allocator *a, int32_t i);
/* note a search of pool p (a->rec): block `got` found, -1 none */
void alloc_rec_search(mm_allocator *a, const pool *p, uint64_t req, int32_t got);
/* an empty pool (its blocks' blk.pooled left to the caller); block i into its
 * place in pool p, its gc age (blk.gc_base) untouched */
void alloc_pool_clear(pool *p);
void alloc_pool_link(mm_allocator *a, pool *p, int32_t i);

#endif
