/* alloc.c - PyTorch's CUDA caching allocator, modelled (see alloc.h).
 *
 * Followed: c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator (PyTorch
 * main, 2025; the torch 2.11 traces in tests/gpu_data/traces replay exactly).
 * Blocks live in one array and are named by index; a pool's free blocks are
 * size classes, each a list in BlockComparatorSize's order (size, then
 * address), for the best-fit search (alloc_internal.h), and its unmapped
 * expandable ranges a vector sorted by address (BlockComparatorAddress).  The
 * one stream means the comparators' stream key is constant and left out.
 * Addresses are invented (unless a replay passes the real ones): segments
 * from cudaMalloc get decreasing addresses, as the driver handed them out in
 * the recorded traces; they only decide ties between equal sizes. */
#include "alloc.h"
#include "alloc_internal.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

#define MiB (1024ull * 1024ull)
#define kMinBlockSize 512ull          /* all sizes are rounded to at least 512 bytes */
#define kSmallSize (1ull * MiB)       /* largest "small" allocation */
#define kSmallBuffer (2ull * MiB)     /* "small" allocations are packed in 2 MiB blocks */
#define kLargeBuffer (20ull * MiB)    /* 1-10 MiB requests share 20 MiB segments */
#define kMinLargeAlloc (10ull * MiB)  /* allocations between 1 and 10 MiB may use kLargeBuffer */
#define kRoundLarge (2ull * MiB)      /* round up large allocations to 2 MiB */

/* ---- small containers ----------------------------------------------------------------- */

static int ivec_insert_at(mm_allocator *a, ivec *v, size_t at, int32_t x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->v, cap * sizeof *p);
        if (!p) {
            a->nomem = 1;
            return -1;
        }
        v->v = p;
        v->cap = cap;
    }
    if (at < v->n) /* not a push (the free-slot stack, gathered lists) */
        memmove(&v->v[at + 1], &v->v[at], (v->n - at) * sizeof *v->v);
    v->v[at] = x;
    v->n++;
    return 0;
}

static void ivec_erase_at(ivec *v, size_t at)
{
    memmove(&v->v[at], &v->v[at + 1], (v->n - at - 1) * sizeof *v->v);
    v->n--;
}

static size_t lower_bound_addr(const mm_allocator *a, const ivec *v, uint64_t ptr)
{
    size_t lo = 0, hi = v->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a->b[v->v[mid]].ptr < ptr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* key order: block x before block y (size, then address) */
static inline int key_less(const blk *x, const blk *y)
{
    return x->size < y->size || (x->size == y->size && x->ptr < y->ptr);
}

/* block i into its place in pool p: after the blocks of smaller keys, before
 * an equal one (as lower_bound); the first of its class alone */
static inline void pool_link(mm_allocator *a, pool *p, int32_t i)
{
    blk *b = &a->b[i];
    unsigned c = pool_class(b->size);
    int32_t before, after;
    b->cls = (uint16_t)c;
    if (!(p->sub[c >> POOL_SUB_BITS] >> (c & ((1u << POOL_SUB_BITS) - 1)) & 1)) {
        before = after = -1;
        p->sub[c >> POOL_SUB_BITS] |= (uint16_t)(1u << (c & ((1u << POOL_SUB_BITS) - 1)));
        p->top |= 1ull << (c >> POOL_SUB_BITS);
        p->first[c] = p->last[c] = i;
    } else if (key_less(&a->b[p->last[c]], b)) {
        before = p->last[c];
        after = -1;
        a->b[before].fnext = i;
        p->last[c] = i;
    } else { /* the class's last stops the walk */
        after = p->first[c];
        while (key_less(&a->b[after], b))
            after = a->b[after].fnext;
        before = a->b[after].fprev;
        a->b[after].fprev = i;
        if (before >= 0)
            a->b[before].fnext = i;
        else
            p->first[c] = i;
    }
    b->fprev = before;
    b->fnext = after;
    b->pooled = 1;
    p->nfree++;
}

void alloc_pool_link(mm_allocator *a, pool *p, int32_t i)
{
    pool_link(a, p, i);
}

/* BlockPool::insert_into_blocks (inlined: gcc kept it a call from free,
 * 2.7 % of a replay) */
static inline __attribute__((always_inline)) void pool_insert(mm_allocator *a, pool *p, int32_t i)
{
    a->b[i].gc_base = p->gc_calls;
    pool_link(a, p, i);
}

void alloc_pool_clear(pool *p)
{
    p->nfree = 0;
    p->top = 0;
    memset(p->sub, 0, sizeof p->sub);
}

/* block i out of pool p (nothing when it is not in it) */
static inline void pool_erase(mm_allocator *a, pool *p, int32_t i)
{
    blk *b = &a->b[i];
    if (!b->pooled)
        return;
    int32_t before = b->fprev, after = b->fnext;
    unsigned c = b->cls;
    b->pooled = 0;
    p->nfree--;
    if (before >= 0)
        a->b[before].fnext = after;
    else
        p->first[c] = after;
    if (after >= 0)
        a->b[after].fprev = before;
    else
        p->last[c] = before;
    if (before < 0 && after < 0) { /* the class is empty */
        uint16_t *m = &p->sub[c >> POOL_SUB_BITS];
        *m &= (uint16_t)~(1u << (c & ((1u << POOL_SUB_BITS) - 1)));
        if (!*m)
            p->top &= ~(1ull << (c >> POOL_SUB_BITS));
    }
}

static void unmapped_insert(mm_allocator *a, pool *p, int32_t i)
{
    ivec_insert_at(a, &p->unmapped, lower_bound_addr(a, &p->unmapped, a->b[i].ptr), i);
}

static void unmapped_erase(mm_allocator *a, pool *p, int32_t i)
{
    size_t at = lower_bound_addr(a, &p->unmapped, a->b[i].ptr);
    if (at < p->unmapped.n && p->unmapped.v[at] == i)
        ivec_erase_at(&p->unmapped, at);
}

static int32_t blk_grow(mm_allocator *a);

/* alloc_blk_new, inlined where blocks are split (plain: a->plain, known to
 * be set, see mm_allocator_malloc) */
static inline __attribute__((always_inline)) int32_t blk_new_(mm_allocator *a, uint64_t ptr,
                                                             uint64_t size, int small, int seg,
                                                             const int plain)
{
    int32_t i = a->freeslots.n ? a->freeslots.v[--a->freeslots.n] : blk_grow(a);
    if (i < 0)
        return -1;
    a->b[i] = (blk){.ptr = ptr, .size = size, .prev = -1, .next = -1, .seg = seg, .fprev = -1,
                    .fnext = -1, .small = (uint8_t)small, .mapped = 1, .in_use_slot = 1,
                    .stamp = !plain && a->rec ? ++a->clock : a->clock};
    return i;
}

int32_t alloc_blk_new(mm_allocator *a, uint64_t ptr, uint64_t size, int small, int seg)
{
    return blk_new_(a, ptr, size, small, seg, 0);
}

/* a slot after the last one (no free one to reuse), -1 out of memory */
static int32_t blk_grow(mm_allocator *a)
{
    if (a->nb == a->capb) {
        size_t cap = a->capb ? a->capb * 2 : 256;
        blk *p = realloc(a->b, cap * sizeof *p);
        if (!p) {
            a->nomem = 1;
            return -1;
        }
        a->b = p;
        a->capb = cap;
    }
    return (int32_t)a->nb++;
}

/* block i's content changed (blk.stamp; counted only while a fold's mark is
 * open: the fold asks what changed since the mark) */
static inline void touch_(mm_allocator *a, int32_t i, const int plain)
{
    if (!plain && a->rec)
        a->b[i].stamp = ++a->clock;
}

static void touch(mm_allocator *a, int32_t i)
{
    touch_(a, i, 0);
}

void alloc_blk_delete(mm_allocator *a, int32_t i)
{
    a->b[i].in_use_slot = 0;
    if (a->freeslots.n < a->freeslots.cap) /* a push, without the call */
        a->freeslots.v[a->freeslots.n++] = i;
    else
        ivec_insert_at(a, &a->freeslots, a->freeslots.n, i);
}

void alloc_rec_search(mm_allocator *a, const pool *p, uint64_t req, int32_t got)
{
    if (a->nrecs == a->caprecs) {
        size_t cap = a->caprecs ? 2 * a->caprecs : 256;
        struct rec_search *q = realloc(a->recs, cap * sizeof *q);
        if (!q) {
            a->nomem = 1;
            return;
        }
        a->recs = q;
        a->caprecs = cap;
    }
    struct rec_search r = {.req = req, .got = UINT64_MAX, .small = p->small};
    if (got >= 0) {
        r.got = a->b[got].size;
        r.ptr = a->b[got].ptr;
        /* the blocks of its size after it in the pool (none before: best fit) */
        r.whole = a->b[got].prev < 0 && a->b[got].next < 0;
        int32_t e = a->b[got].fnext, last = got;
        for (; e >= 0 && a->b[e].size == r.got; last = e, e = a->b[e].fnext)
            r.whole &= a->b[e].prev < 0 && a->b[e].next < 0;
        r.others = last != got;
        if (r.others) {
            r.cmin = a->b[a->b[got].fnext].ptr;
            r.cmax = a->b[last].ptr;
        }
    }
    a->recs[a->nrecs++] = r;
}

/* ---- statistics ------------------------------------------------------------------------ */

static void stat_add(uint64_t *cur, uint64_t *peak, uint64_t v)
{
    *cur = mm_sat_add(*cur, v);
    if (peak && *cur > *peak)
        *peak = *cur;
}

static void stat_sub(uint64_t *cur, uint64_t v)
{
    *cur = *cur >= v ? *cur - v : 0;
}

static void seg_event(mm_allocator *a, int got, uint64_t bytes)
{
    if (a->seg_cb)
        a->seg_cb(a->seg_ctx, got, bytes);
}

static void reserved_add(mm_allocator *a, uint64_t bytes)
{
    seg_event(a, 1, bytes);
    stat_add(&a->st.reserved, &a->st.reserved_peak, bytes);
    stat_add(&a->st.segments, &a->st.segments_peak, 1);
    a->st.num_device_alloc++;
}

static void reserved_sub(mm_allocator *a, uint64_t bytes)
{
    seg_event(a, 0, bytes);
    stat_sub(&a->st.reserved, bytes);
    stat_sub(&a->st.segments, 1);
    a->st.num_device_free++;
}

/* ---- sizes (round_size, get_allocation_size, roundup_power2_next_division) ------------ */

static int floor_log2(uint64_t x)
{
    return 63 - __builtin_clzll(x);
}

/* AllocatorConfig::roundup_power2_divisions: intervals start at 1 MiB */
static uint32_t divisions_for(const mm_alloc_conf *c, uint64_t size)
{
    int idx = floor_log2(size) - 20;
    if (idx < 0)
        idx = 0;
    if (idx > MM_ROUNDUP_INTERVALS - 1)
        idx = MM_ROUNDUP_INTERVALS - 1;
    return c->roundup_divisions[idx];
}

static uint64_t roundup_power2_next_division(uint64_t size, uint64_t divisions)
{
    if ((size & (size - 1)) == 0)
        return size;
    uint64_t floor2 = 1ull << floor_log2(size);
    uint64_t div = floor2 >> floor_log2(divisions);
    if (div == 0)
        return floor2 << 1;
    uint64_t f = size & ~(div - 1);
    return f == size ? size : f + div;
}

/* a multiple of kMinBlockSize (at least one), saturated: the rounding without
 * roundup_power2_divisions, which mm_allocator_malloc takes directly when no
 * interval has any (a->round_plain) */
static uint64_t round_plain(uint64_t size)
{
    if (size < kMinBlockSize)
        return kMinBlockSize;
    return size > UINT64_MAX - (kMinBlockSize - 1) ? UINT64_MAX
                                                   : (size + kMinBlockSize - 1) & ~(kMinBlockSize - 1);
}

uint64_t mm_alloc_round_size(const mm_alloc_conf *c, uint64_t size)
{
    if (size < kMinBlockSize)
        return kMinBlockSize;
    uint64_t d = divisions_for(c, size);
    if (d > 1 && size > kMinBlockSize * d)
        return roundup_power2_next_division(size, d);
    return round_plain(size);
}

static uint64_t get_allocation_size(uint64_t size)
{
    if (size <= kSmallSize)
        return kSmallBuffer;
    if (size < kMinLargeAlloc)
        return kLargeBuffer;
    return mm_sat_mul(kRoundLarge, mm_ceil_div(size, kRoundLarge));
}

/* ---- merging and releasing -------------------------------------------------------------- */

static uint64_t merge_into(mm_allocator *a, int32_t dst, int32_t src, const int plain);

/* try_merge_blocks: fold free neighbour `src` into `dst`; the bytes subsumed */
static uint64_t try_merge(mm_allocator *a, int32_t dst, int32_t src, pool *p)
{
    if (src < 0)
        return 0;
    blk *d = &a->b[dst], *s = &a->b[src];
    if (s->allocated || d->mapped != s->mapped)
        return 0;
    if (s->mapped)
        pool_erase(a, p, src);
    else
        unmapped_erase(a, p, src);
    return merge_into(a, dst, src, 0);
}

/* try_merge_blocks once src is out of its pool */
static inline uint64_t merge_into(mm_allocator *a, int32_t dst, int32_t src, const int plain)
{
    blk *d = &a->b[dst], *s = &a->b[src];
    if (d->prev == src) { /* [src dst] */
        d->ptr = s->ptr;
        d->prev = s->prev;
        if (d->prev >= 0)
            a->b[d->prev].next = dst;
    } else { /* [dst src] */
        d->next = s->next;
        if (d->next >= 0)
            a->b[d->next].prev = dst;
    }
    uint64_t sub = s->size;
    d->size += sub;
    touch_(a, dst, plain);
    alloc_blk_delete(a, src);
    return sub;
}

/* release_block: cudaFree of an unsplit cached segment */
static void release_block(mm_allocator *a, int32_t i)
{
    pool *p = &a->pools[a->b[i].small ? 0 : 1];
    pool_erase(a, p, i);
    reserved_sub(a, a->b[i].size);
    alloc_blk_delete(a, i);
}

static int is_split(const blk *b)
{
    return b->prev >= 0 || b->next >= 0;
}

/* unmap_block: return the whole pages inside a free expandable block */
static void unmap_block(mm_allocator *a, int32_t i)
{
    blk *b = &a->b[i];
    const xseg *x = &a->xs[b->seg];
    uint64_t begin = mm_ceil_div(b->ptr - x->base, x->page);
    uint64_t end = (b->ptr + b->size - x->base) / x->page;
    if (begin >= end)
        return;
    pool *p = &a->pools[b->small ? 0 : 1];
    pool_erase(a, p, i);
    uint64_t uptr = x->base + begin * x->page, usize = (end - begin) * x->page;
    uint64_t before = uptr - b->ptr, after = b->size - before - usize;
    if (before) {
        int32_t f = alloc_blk_new(a, b->ptr, before, b->small, b->seg);
        if (f < 0)
            return;
        b = &a->b[i];
        a->b[f].prev = b->prev;
        a->b[f].next = i;
        if (b->prev >= 0)
            a->b[b->prev].next = f;
        b->prev = f;
        pool_insert(a, p, f);
    }
    if (after) {
        int32_t f = alloc_blk_new(a, uptr + usize, after, b->small, b->seg);
        if (f < 0)
            return;
        b = &a->b[i];
        a->b[f].prev = i;
        a->b[f].next = b->next;
        if (b->next >= 0)
            a->b[b->next].prev = f;
        b->next = f;
        pool_insert(a, p, f);
    }
    b->ptr = uptr;
    b->size = usize;
    touch(a, i);
    b->mapped = 0;
    try_merge(a, i, a->b[i].prev, p);
    try_merge(a, i, a->b[i].next, p);
    unmapped_insert(a, p, i);
    seg_event(a, 0, usize);
    stat_sub(&a->st.reserved, usize);
    stat_sub(&a->st.segments, usize / x->page);
    a->st.num_device_free++;
}

/* release_expandable_segment: a segment that is all unmapped goes away */
static void maybe_drop_xseg(mm_allocator *a, int32_t i)
{
    blk *b = &a->b[i];
    if (b->mapped || is_split(b))
        return;
    pool *p = &a->pools[b->small ? 0 : 1];
    a->xs[b->seg].exists = 0;
    unmapped_erase(a, p, i);
    alloc_blk_delete(a, i);
}

/* release_blocks: cudaFree every unsplit free segment; unmap the free pages of
 * expandable ones (gathered first: unmapping changes the pool) */
static void release_pool(mm_allocator *a, pool *p)
{
    ivec todo = {0};
    for (int32_t k = pool_first(p); k >= 0;) {
        int32_t i = k;
        k = pool_next(a->b, p, i); /* before i leaves the pool */
        if (a->b[i].seg >= 0)
            ivec_insert_at(a, &todo, todo.n, i);
        else if (!is_split(&a->b[i]))
            release_block(a, i);
    }
    for (size_t k = 0; k < todo.n; k++) {
        unmap_block(a, todo.v[k]);
        maybe_drop_xseg(a, todo.v[k]);
    }
    free(todo.v);
}

void mm_allocator_empty_cache(mm_allocator *a)
{
    release_pool(a, &a->pools[1]);
    release_pool(a, &a->pools[0]);
}

/* ---- finding a block ------------------------------------------------------------------- */

/* free bytes a block can grow to: itself plus the unmapped range after it */
static uint64_t expandable_size(const mm_allocator *a, int32_t i)
{
    const blk *b = &a->b[i];
    return b->size + (b->next >= 0 && !a->b[b->next].mapped ? a->b[b->next].size : 0);
}

/* get_free_block: best fit (smallest size, then lowest address); left in the
 * pool (take_block takes it out, or moves it when it splits).  plain: no
 * block of an expandable segment, no gc, and max_split_size unset
 * (UINT64_MAX), which no block reaches (segments lie below ADDR_BASE), so
 * neither oversize check can fire: the first fit. */
static inline __attribute__((always_inline)) int32_t get_free_block(mm_allocator *a, pool *p,
                                                                   uint64_t size, const int plain)
{
    const mm_alloc_conf *c = &a->conf;
    if (!plain && a->gc)
        p->gc_calls++;
    int32_t i = pool_first_fit(a->b, p, size);
    if (i < 0 || plain)
        return i;
    if (a->b[i].seg >= 0 && c->expandable_segments) {
        /* a block that can still grow counts as that large for "best fit" */
        for (int32_t n; a->b[i].seg >= 0 && (n = pool_next(a->b, p, i)) >= 0 &&
                        expandable_size(a, n) < expandable_size(a, i);)
            i = n;
    } else if (a->b[i].seg >= 0) {
        while (i >= 0 && a->b[i].seg >= 0)
            i = pool_next(a->b, p, i);
        if (i < 0)
            return -1;
    }
    if (size < c->max_split_size && a->b[i].size >= c->max_split_size)
        return -1; /* no oversized block for a small request */
    if (size >= c->max_split_size && a->b[i].size >= mm_sat_add(size, c->max_non_split_rounding))
        return -1; /* an oversized block only within the rounding limit */
    return i;
}

/* ---- expandable segments ----------------------------------------------------------------- */

static int32_t xseg_create(mm_allocator *a, pool *p)
{
    xseg *x = &a->xs[p->small ? 0 : 1];
    x->page = p->small ? kSmallBuffer : kLargeBuffer;
    /* address space for 1 1/8 of the GPU (ExpandableSegment's constructor) */
    uint64_t total = a->device_total;
    x->size = mm_ceil_div(total + total / 8, x->page) * x->page;
    x->base = mm_ceil_div(a->xs_addr, x->page) * x->page;
    a->xs_addr = mm_sat_add(x->base, x->size);
    x->exists = 1;
    int32_t i = alloc_blk_new(a, x->base, x->size, p->small, p->small ? 0 : 1);
    if (i < 0)
        return -1;
    a->b[i].mapped = 0;
    unmapped_insert(a, p, i);
    return i;
}

static int allocatable(const mm_allocator *a, int32_t i)
{
    return i >= 0 && !a->b[i].allocated;
}

/* find_expandable_block: lowest address with room for `size` bytes of free and
 * unmapped ranges */
static int32_t find_expandable_block(mm_allocator *a, pool *p, uint64_t size)
{
    for (size_t k = 0; k < p->unmapped.n; k++) {
        int32_t c = p->unmapped.v[k];
        if (allocatable(a, a->b[c].prev))
            c = a->b[c].prev;
        uint64_t bytes = 0;
        for (int32_t w = c; bytes < size && allocatable(a, w); w = a->b[w].next)
            bytes += a->b[w].size;
        if (bytes >= size)
            return c;
    }
    return xseg_create(a, p);
}

/* map_block: back the first `size` bytes of unmapped block i with pages */
static int map_block(mm_allocator *a, pool *p, int32_t i, uint64_t size)
{
    const xseg *x = &a->xs[a->b[i].seg];
    uint64_t msize = mm_ceil_div(size, x->page) * x->page;
    if (msize > a->b[i].size)
        msize = a->b[i].size;
    if (a->capacity && mm_sat_add(a->st.reserved, msize) > a->capacity)
        return -1; /* cuMemCreate: out of memory */
    if (a->allowed_max && mm_sat_add(a->st.reserved, msize) > a->allowed_max)
        return -1;
    unmapped_erase(a, p, i);
    a->b[i].mapped = 1;
    touch(a, i);
    if (msize < a->b[i].size) {
        int32_t r = alloc_blk_new(a, a->b[i].ptr + msize, a->b[i].size - msize, p->small, a->b[i].seg);
        if (r < 0)
            return -1;
        a->b[r].mapped = 0;
        a->b[r].prev = i;
        a->b[r].next = a->b[i].next;
        if (a->b[i].next >= 0)
            a->b[a->b[i].next].prev = r;
        a->b[i].next = r;
        a->b[i].size = msize;
        unmapped_insert(a, p, r);
    }
    try_merge(a, i, a->b[i].prev, p);
    try_merge(a, i, a->b[i].next, p);
    pool_insert(a, p, i);
    seg_event(a, 1, msize);
    stat_add(&a->st.reserved, &a->st.reserved_peak, msize);
    stat_add(&a->st.segments, &a->st.segments_peak, msize / x->page);
    a->st.num_device_alloc++;
    return 0;
}

/* try_allocate_expandable_block */
static int32_t alloc_expandable(mm_allocator *a, pool *p, uint64_t size)
{
    int32_t c = find_expandable_block(a, p, size);
    if (c < 0)
        return -1;
    if (!a->b[c].mapped) {
        uint64_t want = a->b[c].size < size ? a->b[c].size : size;
        if (map_block(a, p, c, want) < 0)
            return -1;
    }
    while (a->b[c].size < size) {
        int32_t n = a->b[c].next;
        uint64_t rem = size - a->b[c].size;
        if (n < 0 || map_block(a, p, n, rem < a->b[n].size ? rem : a->b[n].size) < 0)
            return -1;
        c = n; /* map_block merged the free block before it into n */
    }
    pool_erase(a, p, c);
    return c;
}

/* ---- getting memory from the driver ------------------------------------------------------- */

/* alloc_block: a new segment (cudaMalloc) or more pages (expandable) */
static int32_t alloc_block(mm_allocator *a, pool *p, uint64_t size, uint64_t alloc_size,
                           int retry)
{
    if (retry)
        a->st.num_alloc_retries++;
    if (a->allowed_max && mm_sat_add(a->st.reserved, alloc_size) > a->allowed_max)
        return -1;
    if (a->conf.expandable_segments)
        return alloc_expandable(a, p, size);
    if (a->capacity && mm_sat_add(a->st.reserved, alloc_size) > a->capacity)
        return -1; /* cudaMalloc: out of memory */
    uint64_t addr = a->hint;
    if (addr)
        a->hint = 0;
    else {
        /* downwards: the order the CUDA driver handed out addresses in every
         * trace we recorded (H100, CUDA 13); with increasing addresses ties
         * between equal free blocks go the other way and 4 of 10 traces drift
         * (up to +2.0 % reserved), with decreasing ones all 10 replay exactly */
        uint64_t span = mm_sat_mul(mm_ceil_div(alloc_size, kRoundLarge), kRoundLarge);
        if (span > a->next_addr)
            return -1; /* the address space is gone: cudaMalloc fails */
        a->next_addr -= span;
        addr = a->next_addr;
    }
    int32_t i = alloc_blk_new(a, addr, alloc_size, p->small, -1);
    if (i < 0)
        return -1;
    reserved_add(a, alloc_size);
    return i;
}

/* release_available_cached_blocks: free oversize blocks (max_split_size set).
 * A block of an expandable segment is never released here: the single block
 * found is taken only if it is not one, and the walk down from the largest
 * skips them (CUDACachingAllocator.cpp release_available_cached_blocks:
 * `(*it)->expandable_segment_` sends it to the walk, and the walk releases
 * only `!(*cur)->expandable_segment_`).  Releasing them made a replay with
 * max_split_size_mb and expandable_segments map and unmap the same pages
 * forever. */
static int release_available(mm_allocator *a, pool *p, uint64_t size)
{
    uint64_t ms = a->conf.max_split_size;
    if (ms == UINT64_MAX)
        return 0;
    uint64_t key = size < ms ? ms : size;
    int32_t at = pool_first_fit(a->b, p, key);
    if (at >= 0 && a->b[at].seg < 0) {
        release_block(a, at);
        return 1;
    }
    uint64_t freed = 0;
    int32_t below = at >= 0 ? pool_prev(a->b, p, at) : pool_last(p);
    while (below >= 0 && freed < key) {
        int32_t i = below;
        if (a->b[i].size < ms)
            break;
        below = pool_prev(a->b, p, i); /* before i leaves the pool */
        if (a->b[i].seg < 0) {
            freed += a->b[i].size;
            release_block(a, i);
        }
    }
    return freed >= key;
}

/* garbage_collect_cached_blocks: only with a memory fraction (set_fraction) */
static void garbage_collect(mm_allocator *a)
{
    pool *p = &a->pools[1];
    uint64_t thr = (uint64_t)(a->conf.gc_threshold * (double)a->allowed_max);
    if (a->st.reserved <= thr)
        return;
    uint64_t target = a->st.reserved - thr, got = 0;
    double total_age = 0;
    int64_t n = 0;
    for (int32_t k = pool_first(p); k >= 0; k = pool_next(a->b, p, k))
        if (!is_split(&a->b[k])) {
            total_age += (double)(p->gc_calls - a->b[k].gc_base);
            n++;
        }
    int freed = 1;
    while (got < target && freed && n > 0) {
        double thr_age = total_age / (double)n;
        freed = 0;
        for (int32_t k = pool_first(p); k >= 0;) {
            int32_t i = k;
            k = pool_next(a->b, p, i); /* before i leaves the pool */
            double age = (double)(p->gc_calls - a->b[i].gc_base);
            if (!is_split(&a->b[i]) && age >= thr_age) {
                freed = 1;
                got += a->b[i].size;
                total_age -= age;
                n--;
                release_block(a, i);
            }
        }
    }
}

/* ---- malloc and free ------------------------------------------------------------------- */

/* plain: max_split_size unset (UINT64_MAX): a request inside a block is below it */
static inline int should_split(const mm_allocator *a, const blk *b, uint64_t size, const int plain)
{
    uint64_t rem = b->size - size;
    if (b->small || (!plain && a->conf.expandable_segments))
        return rem >= kMinBlockSize;
    return (plain || size < a->conf.max_split_size) && rem > kSmallSize;
}

/* alloc_found_block (i still in its pool when the cache had it); plain: no
 * block is in an expandable segment (blk.seg < 0) */
static inline __attribute__((always_inline)) int32_t take_block(mm_allocator *a, pool *p,
                                                               int32_t i, uint64_t size,
                                                               uint64_t req, const int plain)
{
    int was_split = is_split(&a->b[i]);
    pool_erase(a, p, i);
    if (should_split(a, &a->b[i], size, plain)) {
        int32_t n = blk_new_(a, a->b[i].ptr, size, p->small, a->b[i].seg, plain);
        if (n < 0)
            return -1;
        blk *rem = &a->b[i];
        a->b[n].prev = rem->prev;
        if (rem->prev >= 0)
            a->b[rem->prev].next = n;
        a->b[n].next = i;
        rem->prev = n;
        rem->ptr += size;
        rem->size -= size;
        touch_(a, i, plain);
        pool_insert(a, p, i);
        if (!plain && rem->seg < 0) { /* plain: derived when asked */
            if (was_split)
                stat_sub(&a->st.inactive_split, size);
            else
                stat_add(&a->st.inactive_split, NULL, rem->size);
        }
        i = n;
    } else if (!plain && was_split && a->b[i].seg < 0) {
        stat_sub(&a->st.inactive_split, a->b[i].size);
    }
    a->b[i].allocated = 1;
    a->b[i].req = req;
    touch_(a, i, plain);
    stat_add(&a->st.allocated, &a->st.allocated_peak, a->b[i].size);
    stat_add(&a->st.requested, &a->st.requested_peak, req);
    a->st.num_allocs++;
    return i;
}

/* DeviceCachingAllocator::malloc when the cache has no block: garbage
 * collection, a new block from the driver, then again after freeing oversize
 * blocks, then after emptying the cache; the block, -1 none */
static int32_t from_driver(mm_allocator *a, pool *p, uint64_t size)
{
    uint64_t alloc_size = get_allocation_size(size);
    if (a->gc)
        garbage_collect(a);
    int32_t i = alloc_block(a, p, size, alloc_size, 0);
    if (i < 0 && !a->nomem && release_available(a, p, size))
        i = alloc_block(a, p, size, alloc_size, 0);
    if (i < 0 && !a->nomem) {
        mm_allocator_empty_cache(a);
        i = alloc_block(a, p, size, alloc_size, 1);
    }
    return i;
}

/* DeviceCachingAllocator::malloc; plain: a->plain set (the compiler makes a
 * copy of it without the tests that a->plain answers) */
static inline __attribute__((always_inline)) int64_t malloc_(mm_allocator *a, uint64_t req,
                                                            const int plain)
{
    uint64_t size = a->round_plain ? round_plain(req) : mm_alloc_round_size(&a->conf, req);
    pool *p = &a->pools[size <= kSmallSize ? 0 : 1];
    int32_t i = get_free_block(a, p, size, plain);
    if (!plain && a->rec)
        alloc_rec_search(a, p, size, i);
    if (i < 0)
        i = from_driver(a, p, size);
    if (a->nomem)
        return MM_ALLOC_NOMEM;
    if (i < 0) {
        a->st.num_ooms++;
        return MM_ALLOC_OOM;
    }
    i = take_block(a, p, i, size, req, plain);
    return a->nomem || i < 0 ? MM_ALLOC_NOMEM : i;
}

/* a plain allocator (a->plain): no garbage collection, expandable segments or
 * max_split_size, no fold's mark open - what a replay of a training step
 * mostly is.  Every branch for those is kept in the other copy. */
int64_t mm_allocator_malloc(mm_allocator *a, uint64_t req)
{
    return a->plain ? malloc_(a, req, 1) : malloc_(a, req, 0);
}

/* try_merge for a freed block: its first answer (no neighbour, or one in
 * use: most of them) without the call; plain: every block is mapped (no
 * expandable segments) */
static inline uint64_t merge_freed(mm_allocator *a, int32_t dst, int32_t src, pool *p,
                                   const int plain)
{
    if (src < 0 || a->b[src].allocated)
        return 0;
    if (!plain)
        return try_merge(a, dst, src, p);
    pool_erase(a, p, src);
    return merge_into(a, dst, src, 1);
}

/* free + free_block: back to the pool, merged with free neighbours (plain:
 * as malloc_'s) */
static inline __attribute__((always_inline)) void release_(mm_allocator *a, int32_t i,
                                                          const int plain)
{
    pool *p = &a->pools[a->b[i].small ? 0 : 1];
    a->b[i].allocated = 0;
    touch_(a, i, plain);
    stat_sub(&a->st.allocated, a->b[i].size);
    stat_sub(&a->st.requested, a->b[i].req);
    int xs = plain || a->b[i].seg >= 0; /* no inactive_split to keep */
    uint64_t merged = merge_freed(a, i, a->b[i].prev, p, plain);
    merged += merge_freed(a, i, a->b[i].next, p, plain);
    pool_insert(a, p, i);
    if (!xs) {
        stat_sub(&a->st.inactive_split, merged);
        if (is_split(&a->b[i]))
            stat_add(&a->st.inactive_split, NULL, a->b[i].size);
    }
}

/* handle h names a block in use (a stale or failed handle releases nothing) */
static inline int releasable(const mm_allocator *a, int64_t h)
{
    return h >= 0 && (size_t)h < a->nb && a->b[h].in_use_slot && a->b[h].allocated;
}

void mm_allocator_release(mm_allocator *a, int64_t h)
{
    if (!releasable(a, h))
        return;
    if (a->plain)
        release_(a, (int32_t)h, 1);
    else
        release_(a, (int32_t)h, 0);
}

static inline __attribute__((always_inline)) size_t run_(mm_allocator *a, const mm_alloc_ev *ev,
                                                         size_t n, int64_t *h, const int *stop,
                                                         const int plain)
{
    size_t i = 0;
    for (; i < n && !*stop; i++) {
        const mm_alloc_ev *e = &ev[i];
        if (e->is_free) {
            int64_t x = h[e->id];
            h[e->id] = -1;
            if (releasable(a, x))
                release_(a, (int32_t)x, plain);
        } else {
            int64_t x = malloc_(a, e->bytes, plain);
            h[e->id] = x;
            if (x < 0)
                return i + 1;
        }
    }
    return i;
}

size_t mm_allocator_run(mm_allocator *a, const mm_alloc_ev *ev, size_t n, int64_t *handles,
                        const int *stop)
{
    return a->plain ? run_(a, ev, n, handles, stop, 1) : run_(a, ev, n, handles, stop, 0);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

mm_allocator *mm_allocator_new(const mm_alloc_conf *conf, uint64_t capacity, uint64_t device_total)
{
    mm_allocator *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    if (conf)
        a->conf = *conf;
    else
        mm_alloc_conf_default(&a->conf);
    a->capacity = capacity;
    a->device_total = device_total ? device_total : 80ull * 1024 * MiB;
    if (a->conf.memory_fraction > 0)
        a->allowed_max = (uint64_t)(a->conf.memory_fraction * (double)a->device_total);
    a->gc = a->conf.memory_fraction > 0 && a->conf.gc_threshold > 0;
    a->plain_conf = !a->gc && !a->conf.expandable_segments &&
                    a->conf.max_split_size == UINT64_MAX;
    alloc_set_rec(a, 0);
    a->round_plain = 1;
    for (int k = 0; k < MM_ROUNDUP_INTERVALS; k++)
        a->round_plain &= a->conf.roundup_divisions[k] <= 1;
    a->next_addr = a->xs_addr = ADDR_BASE;
    a->pools[0].small = 1;
    alloc_pool_clear(&a->pools[0]);
    alloc_pool_clear(&a->pools[1]);
    return a;
}

void mm_allocator_free(mm_allocator *a)
{
    if (!a)
        return;
    for (int k = 0; k < 2; k++) {
        free(a->pools[k].unmapped.v);
    }
    free(a->freeslots.v);
    free(a->recs);
    free(a->b);
    free(a);
}

void mm_allocator_reset_peaks(mm_allocator *a)
{
    a->st.allocated_peak = a->st.allocated;
    a->st.requested_peak = a->st.requested;
    a->st.reserved_peak = a->st.reserved;
    a->st.segments_peak = a->st.segments;
}

void mm_allocator_next_address(mm_allocator *a, uint64_t addr)
{
    a->hint = addr;
}

void mm_allocator_on_segment(mm_allocator *a, mm_segment_cb cb, void *ctx)
{
    a->seg_cb = cb;
    a->seg_ctx = ctx;
}

/* inactive_split_bytes, derived: the free blocks of cudaMalloc'ed segments
 * that are split (in torch, and here unless a->plain, malloc and free keep
 * it: alloc_found_block and free_block; the same sum) */
static uint64_t inactive_split_now(const mm_allocator *a)
{
    uint64_t sum = 0;
    for (int k = 0; k < 2; k++) {
        const pool *p = &a->pools[k];
        for (int32_t j = pool_first(p); j >= 0; j = pool_next(a->b, p, j))
            if (a->b[j].seg < 0 && is_split(&a->b[j]))
                sum = mm_sat_add(sum, a->b[j].size);
    }
    return sum;
}

uint64_t alloc_inactive_split(const mm_allocator *a)
{
    return a->plain ? inactive_split_now(a) : a->st.inactive_split;
}

/* a->st.inactive_split made current (malloc and free left it while a->plain) */
static void inactive_split_sync(mm_allocator *a)
{
    a->st.inactive_split = alloc_inactive_split(a);
}

void alloc_set_rec(mm_allocator *a, int on)
{
    inactive_split_sync(a);
    a->rec = on;
    a->plain = !on && a->plain_conf;
}

const mm_alloc_stats *mm_allocator_stats(mm_allocator *a)
{
    inactive_split_sync(a);
    return &a->st;
}

uint64_t mm_allocator_largest_free(const mm_allocator *a)
{
    uint64_t m = 0;
    for (int k = 0; k < 2; k++) {
        int32_t t = pool_last(&a->pools[k]); /* sorted by size: the last is the largest */
        if (t >= 0 && a->b[t].size > m)
            m = a->b[t].size;
    }
    return m;
}
