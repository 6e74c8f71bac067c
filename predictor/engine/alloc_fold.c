/* alloc_fold.c - the exact fold of the caching-allocator model over repeated
 * periods (see alloc_fold.h).
 *
 * What the next period sees of the allocator (alloc.c): the free blocks (best
 * fit by size, then address: get_free_block), the blocks it frees (their
 * size, and which neighbours are free to merge with: free_block), whether a
 * block has neighbours at all (is_split: inactive_split, empty_cache), the
 * next segment's address (below every other: alloc_block) and the reserved
 * bytes against a capacity.  Every other block is allocated and stays so
 * through the folded periods ("opaque"): only its being there counts.
 *
 * The check, between the mark (period start) and now (its end), with
 * down = the bytes of address space the period's segments took:
 *   - no expandable segments, memory fraction or address hint; the period
 *     got no retry, no OOM and gave nothing back to the driver; the reserved
 *     bytes of the last folded period stay within the capacity (and the
 *     caller's bound), so no later period would have met a failing cudaMalloc;
 *   - every free block is either "fixed" (free at the mark, untouched since,
 *     still free) or "moving": the free blocks now that are not fixed are
 *     exactly the mark's moving ones shifted down by `down`, of equal size;
 *   - each block the folded periods free that existed at the mark (pairs) has
 *     its partner now at its address - down, equal size and request;
 *   - each moving or freed block's neighbours (prev, next) correspond: none
 *     and none, opaque and opaque, the same fixed block, or the shifted
 *     partner of a moving or freed one;
 *   - a free block now that is no moving one's partner is "dead" (dead_ones):
 *     the period made it between blocks that stay allocated, and every search
 *     of its pool the period made that it could have served found a smaller
 *     block, so neither it nor its copies are ever taken;
 *   - or it ends a chain or a ladder of whole free blocks of one shape
 *     (chain_from, chain_to, ladder_grows): the period consumes or adds one
 *     such block at the end where the shift points, and the state is the
 *     mark's shifted as if the chain went on without end on the other side;
 *     the searches the period made show that none could have reached that
 *     missing part (chain_ok), and a chain consumed limits the periods to
 *     its real blocks;
 *   - the shift: down the new segments' bytes, else the first freed pair's
 *     move; the pairs of the first periods that follow it limit the periods
 *     (pairs_shifted: the checkpoints a backward frees were laid out in
 *     other places by the first layers of its forward);
 *   - what moves keeps its order against what stays wherever a best fit
 *     broke a tie between them (order_kept: each search's block found and
 *     the others of its size, against the segments the period changed,
 *     swept over the folded periods).
 * A fixed block can tie with a moving one in best fit only by size; moving
 * blocks move down, so a fixed block that lost a tie to one still loses it,
 * and one that came first fails the same size test the moving one then
 * meets.  So the next period repeats this one, shifted, and then leaves the
 * same relation behind: by induction every later period does.  A free
 * block's req (the last tensor's it held) is read by nothing and not
 * compared.  MMGUARD_REPLAY_FOLD=check (reserve.c) holds all of it to the
 * unfolded replay: the whole state after each fold, by a hash.
 *
 * Applying period j (1..n): the blocks the first period changed or removed
 * (X, from the mark's copy) are found shifted by j * down and removed, the
 * blocks it made or changed (T, stamp after the mark) are added shifted; then
 * the neighbour links are set again from the addresses, the free lists
 * rebuilt and the statistics moved by n times the period's difference (a
 * peak: the period's own maximum plus n differences, when they grow). */
#include "alloc_fold.h"
#include "alloc_internal.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

#define FOLD_DIFFER 4 /* free blocks a state may have more or fewer to pass mm_alloc_fold_maybe */

enum { T_NONE = 0, T_OPAQUE, T_MOVING, T_FIXED, T_FREED, T_HIT /* a moving one's partner */ };

struct mm_alloc_mark {
    blk *b;                 /* the blocks at the mark */
    size_t nb, capb;
    mm_alloc_stats st;      /* the statistics at the mark (the peaks as they were) */
    uint64_t clock, next_addr;
    int full;               /* the blocks were copied (mm_alloc_mark_open) */
    size_t npool[2];        /* free blocks, small and large pool */
    uint64_t *psize;        /* their sizes, in pool order (small pool first) */
    size_t cappsize;
    int open;
    uint8_t *type0, *type1; /* T_* of the mark's blocks and of now's */
    size_t cap0, cap1;
    uint64_t *hk;           /* ptr + 1 -> block index, open addressing (0: empty) */
    int32_t *hv;
    size_t hcap;
    blk *x, *t;             /* the period's removed / made blocks */
    size_t nx, nt, capx, capt;
    int32_t *part;          /* the partner now of each mark's moving or freed block */
    uint8_t *still0, *still1; /* ... that stayed in place (mark's; now's partners) */
    size_t cappart, capst0, capst1;
    uint64_t limit;         /* the periods the chains allow (chain_from) */
    uint64_t up;            /* how far the folded periods may move a block up (chain_ok) */
    struct extent { uint64_t lo, hi; } *act; /* the segments the period changed */
    size_t nact, capact;
    uint64_t *still;        /* after a fold: the still blocks' addresses, sorted */
    size_t nstill, capstill;
};

mm_alloc_mark *mm_alloc_mark_new(void)
{
    return calloc(1, sizeof(mm_alloc_mark));
}

void mm_alloc_mark_free(mm_alloc_mark *m)
{
    if (!m)
        return;
    free(m->b);
    free(m->psize);
    free(m->type0);
    free(m->type1);
    free(m->hk);
    free(m->hv);
    free(m->x);
    free(m->t);
    free(m->part);
    free(m->still0);
    free(m->still1);
    free(m->still);
    free(m->act);
    free(m);
}

/* grow *p (elements of `size` bytes) to hold n; 0 or -1 */
static int reserve_n(void **p, size_t *cap, size_t n, size_t size)
{
    if (n <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < n)
        c *= 2;
    void *q = realloc(*p, c * size);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

int mm_alloc_mark_light(const mm_allocator *a, mm_alloc_mark *m)
{
    m->full = 0;
    m->open = 0;
    m->st = a->st;
    m->st.inactive_split = alloc_inactive_split(a);
    m->clock = a->clock;
    m->next_addr = a->next_addr;
    m->npool[0] = a->pools[0].nfree;
    m->npool[1] = a->pools[1].nfree;
    if (reserve_n((void **)&m->psize, &m->cappsize, m->npool[0] + m->npool[1] + 1,
                  sizeof *m->psize))
        return -1;
    for (size_t k = 0, q = 0; k < 2; k++)
        for (int32_t j = pool_first(&a->pools[k]); j >= 0; j = pool_next(a->b, &a->pools[k], j))
            m->psize[q++] = a->b[j].size;
    return 0;
}

int mm_alloc_mark_open(mm_allocator *a, mm_alloc_mark *m)
{
    if (reserve_n((void **)&m->b, &m->capb, a->nb, sizeof *m->b) || mm_alloc_mark_light(a, m))
        return -1;
    memcpy(m->b, a->b, a->nb * sizeof *a->b);
    m->nb = a->nb;
    m->full = 1;
    a->st.allocated_peak = a->st.allocated;
    a->st.requested_peak = a->st.requested;
    a->st.reserved_peak = a->st.reserved;
    a->st.segments_peak = a->st.segments;
    alloc_set_rec(a, 1);
    a->nrecs = 0;
    m->open = 1;
    return 0;
}

static uint64_t max_u64(uint64_t x, uint64_t y)
{
    return x > y ? x : y;
}

void mm_alloc_mark_close(mm_allocator *a, mm_alloc_mark *m, uint64_t pmax[4])
{
    if (!m->open)
        return;
    pmax[0] = a->st.allocated_peak;
    pmax[1] = a->st.requested_peak;
    pmax[2] = a->st.reserved_peak;
    pmax[3] = a->st.segments_peak;
    a->st.allocated_peak = max_u64(m->st.allocated_peak, pmax[0]);
    a->st.requested_peak = max_u64(m->st.requested_peak, pmax[1]);
    a->st.reserved_peak = max_u64(m->st.reserved_peak, pmax[2]);
    a->st.segments_peak = max_u64(m->st.segments_peak, pmax[3]);
    alloc_set_rec(a, 0);
    m->open = 0;
}

int mm_alloc_fold_maybe(const mm_allocator *a, const mm_alloc_mark *m)
{
    const mm_alloc_stats *s0 = &m->st, *s1 = &a->st;
    if (m->open || s1->num_alloc_retries != s0->num_alloc_retries ||
        s1->num_device_free != s0->num_device_free)
        return 0;
    /* the mark's free blocks' sizes and now's (sorted both) alike but for a
     * few: moving ones keep theirs, fixed ones stay, dead ones and a
     * chain's or a ladder's ends come and go */
    size_t differ = 0;
    for (size_t k = 0, q = 0; k < 2; k++) {
        int32_t j = pool_first(&a->pools[k]); /* now's, in order */
        size_t x = 0;
        while (x < m->npool[k] || j >= 0) {
            if (x == m->npool[k] || (j >= 0 && a->b[j].size < m->psize[q + x])) {
                j = pool_next(a->b, &a->pools[k], j), differ++;
            } else if (j < 0 || a->b[j].size > m->psize[q + x]) {
                x++, differ++;
            } else {
                x++, j = pool_next(a->b, &a->pools[k], j);
            }
            if (differ > FOLD_DIFFER)
                return 0;
        }
        q += m->npool[k];
    }
    return 1;
}

uint64_t mm_allocator_block_ptr(const mm_allocator *a, int64_t h)
{
    return h >= 0 && (size_t)h < a->nb ? a->b[h].ptr : 0;
}

static uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

uint64_t mm_alloc_hash_add(uint64_t h, uint64_t x)
{
    return mix64(h ^ mix64(x + 0x9E3779B97F4A7C15ull));
}

/* every block (its content and its neighbours' addresses), in any slot
 * order, and every statistic */
uint64_t mm_alloc_state_hash(const mm_allocator *a)
{
    uint64_t sum = 0;
    for (size_t k = 0; k < a->nb; k++) {
        const blk *b = &a->b[k];
        if (!b->in_use_slot)
            continue;
        uint64_t h = mm_alloc_hash_add(b->ptr, b->size);
        h = mm_alloc_hash_add(h, b->allocated ? b->req : 0); /* a free one's: stale, unread */
        h = mm_alloc_hash_add(h, (uint64_t)b->allocated | (uint64_t)b->mapped << 1 |
                                     (uint64_t)b->small << 2 | (uint64_t)(uint32_t)b->seg << 8);
        h = mm_alloc_hash_add(h, b->prev >= 0 ? a->b[b->prev].ptr : 1);
        h = mm_alloc_hash_add(h, b->next >= 0 ? a->b[b->next].ptr : 1);
        sum += h;
    }
    uint64_t h = mm_alloc_hash_add(sum, a->next_addr);
    mm_alloc_stats now = a->st;
    now.inactive_split = alloc_inactive_split(a);
    const uint64_t *st = (const uint64_t *)&now;
    for (size_t k = 0; k < sizeof now / sizeof *st; k++)
        h = mm_alloc_hash_add(h, st[k]);
    for (int k = 0; k < 2; k++) {
        h = mm_alloc_hash_add(h, a->pools[k].nfree);
        for (int32_t j = pool_first(&a->pools[k]); j >= 0; j = pool_next(a->b, &a->pools[k], j))
            h = mm_alloc_hash_add(h, a->b[j].ptr);
    }
    return mm_alloc_hash_add(h, (uint64_t)a->nomem);
}

/* ---- address -> block -------------------------------------------------------------------- */

static size_t hslot(const mm_alloc_mark *m, uint64_t key)
{
    return (size_t)(((key >> 9) * 0x9E3779B97F4A7C15ull) >> 20) & (m->hcap - 1);
}

/* an empty table for n blocks */
static int hash_init(mm_alloc_mark *m, size_t n)
{
    size_t c = 1024;
    while (c < 2 * n + 16)
        c *= 2;
    if (c > m->hcap) {
        uint64_t *k = realloc(m->hk, c * sizeof *k);
        if (k)
            m->hk = k;
        int32_t *v = realloc(m->hv, c * sizeof *v);
        if (v)
            m->hv = v;
        if (!k || !v)
            return -1;
    }
    m->hcap = c;
    memset(m->hk, 0, c * sizeof *m->hk);
    return 0;
}

static void hput(mm_alloc_mark *m, uint64_t ptr, int32_t v)
{
    size_t s = hslot(m, ptr + 1);
    while (m->hk[s] && m->hk[s] != ptr + 1)
        s = (s + 1) & (m->hcap - 1);
    m->hk[s] = ptr + 1;
    m->hv[s] = v;
}

int64_t mm_alloc_fold_block_at(const mm_alloc_mark *m, uint64_t ptr)
{
    if (!m->hcap)
        return -1;
    for (size_t s = hslot(m, ptr + 1); m->hk[s]; s = (s + 1) & (m->hcap - 1))
        if (m->hk[s] == ptr + 1)
            return m->hv[s];
    return -1;
}

/* remove ptr (linear probing: the entries after it move back into the gap) */
static void hdel(mm_alloc_mark *m, uint64_t ptr)
{
    size_t mask = m->hcap - 1, s = hslot(m, ptr + 1);
    while (m->hk[s] && m->hk[s] != ptr + 1)
        s = (s + 1) & mask;
    if (!m->hk[s])
        return;
    for (size_t j = (s + 1) & mask; m->hk[j]; j = (j + 1) & mask) {
        size_t home = hslot(m, m->hk[j]);
        /* j's entry may fill the gap at s unless its home lies in (s, j] */
        if ((j > s && (home <= s || home > j)) || (j < s && home <= s && home > j)) {
            m->hk[s] = m->hk[j];
            m->hv[s] = m->hv[j];
            s = j;
        }
    }
    m->hk[s] = 0;
}

/* ---- the check --------------------------------------------------------------------------- */

static int in_use_now(const mm_allocator *a, size_t k)
{
    return k < a->nb && a->b[k].in_use_slot;
}

/* the mark's block k as it is now: not changed since the mark */
static int untouched(const mm_allocator *a, const mm_alloc_mark *m, size_t k)
{
    return in_use_now(a, k) && a->b[k].stamp <= m->clock;
}

/* how many more periods the global conditions allow (0 none), and the shift */
static uint64_t periods_allowed(const mm_allocator *a, const mm_alloc_mark *m, uint64_t periods,
                                uint64_t limit, uint64_t *down)
{
    const mm_alloc_stats *s0 = &m->st, *s1 = &a->st;
    if (m->open || !m->full || a->conf.expandable_segments || a->allowed_max || a->hint || a->nomem ||
        m->next_addr < a->next_addr || s1->num_alloc_retries != s0->num_alloc_retries ||
        s1->num_ooms != s0->num_ooms || s1->num_device_free != s0->num_device_free ||
        s1->reserved < s0->reserved)
        return 0;
    *down = m->next_addr - a->next_addr;
    if (a->capacity && a->capacity < limit)
        limit = a->capacity;
    uint64_t grow = s1->reserved - s0->reserved, n = periods;
    if (grow) {
        if (s1->reserved > limit)
            return 0;
        if ((limit - s1->reserved) / grow < n)
            n = (limit - s1->reserved) / grow;
    }
    if (*down && a->next_addr / *down < n)
        n = a->next_addr / *down;
    return n;
}

/* the kinds of the mark's blocks and of now's, and the table of now's */
static int classify(const mm_allocator *a, mm_alloc_mark *m)
{
    if (reserve_n((void **)&m->type0, &m->cap0, m->nb + 1, 1) ||
        reserve_n((void **)&m->type1, &m->cap1, a->nb + 1, 1) ||
        reserve_n((void **)&m->part, &m->cappart, m->nb + 1, sizeof *m->part) ||
        reserve_n((void **)&m->still0, &m->capst0, m->nb + 1, 1) ||
        reserve_n((void **)&m->still1, &m->capst1, a->nb + 1, 1) || hash_init(m, a->nb))
        return -1;
    memset(m->still0, 0, m->nb + 1);
    memset(m->still1, 0, a->nb + 1);
    m->limit = UINT64_MAX;
    for (size_t k = 0; k <= m->nb; k++)
        m->part[k] = -1;
    for (size_t k = 0; k < m->nb; k++)
        m->type0[k] = !m->b[k].in_use_slot ? T_NONE : m->b[k].allocated ? T_OPAQUE : T_MOVING;
    for (size_t k = 0; k < a->nb; k++) {
        m->type1[k] = !a->b[k].in_use_slot ? T_NONE : a->b[k].allocated ? T_OPAQUE : T_MOVING;
        if (a->b[k].in_use_slot)
            hput(m, a->b[k].ptr, (int32_t)k);
    }
    for (size_t k = 0; k < m->nb; k++)
        if (m->type0[k] == T_MOVING && untouched(a, m, k) && !a->b[k].allocated)
            m->type0[k] = m->type1[k] = T_FIXED;
    return 0;
}

static int same_shape(const blk *x, const blk *y, uint64_t shift)
{
    /* a free block's req is the last tensor's it held, read by nothing */
    return y->ptr == x->ptr + shift && y->size == x->size &&
           (!x->allocated || y->req == x->req) &&
           y->small == x->small && y->allocated == x->allocated && y->mapped == x->mapped &&
           y->seg == x->seg;
}

/* The partner now of the mark's block k (moving or freed) and whether it
 * stayed in place (*still): at its address + shift, or else at the same
 * address (a block the period gave back as it found it), with k's shape
 * and, when `want` is not T_NONE, that kind now; -1 none. */
static int64_t partner(const mm_allocator *a, const mm_alloc_mark *m, size_t k, uint64_t shift,
                       uint8_t want, int *still)
{
    /* a whole free block given back as it was stays (ladder_grows) */
    const blk *x = &m->b[k];
    int first = !x->allocated && x->prev < 0 && x->next < 0;
    for (int c = first; c < first + 2; c++) {
        uint64_t d = c & 1 ? 0 : shift;
        if (c == 1 && !shift)
            break;
        int64_t y = mm_alloc_fold_block_at(m, m->b[k].ptr + d);
        if (y >= 0 && same_shape(&m->b[k], &a->b[y], d) &&
            (want == T_NONE || m->type1[y] == want)) {
            *still = (c & 1) || !shift;
            return y;
        }
    }
    return -1;
}

/* the pair's block now is its block at the mark shifted, or in place */
static int pair_shape(const blk *x, const blk *y, uint64_t shift)
{
    return same_shape(x, y, shift) || same_shape(x, y, 0);
}

/* one pair's block now is its block at the mark shifted (or in place) */
static int pair_shifted(const mm_allocator *a, const mm_alloc_mark *m, const mm_fold_pair *p,
                        uint64_t shift)
{
    int64_t x = p->at_mark, y = p->now;
    if (x < 0 || y < 0)
        return x < 0 && y < 0;
    return (size_t)x < m->nb && (size_t)y < a->nb && pair_shape(&m->b[x], &a->b[y], shift);
}

/* The pairs' blocks shifted (or in place), before the whole check (most
 * periods fail here).  The pairs of a period link the block it frees to the
 * one the next period frees, so folding n periods needs those of the first
 * n (the verified one and n - 1 folded ones): at the first pair that is not
 * shifted, n and *np end (its period's and the later ones dropped). */
static void pairs_shifted(const mm_allocator *a, const mm_alloc_mark *m,
                          const mm_fold_pair *pairs, size_t *np, uint64_t *n, uint64_t shift)
{
    for (size_t i = 0; i < *np; i++) {
        if (pairs[i].period < *n && pair_shifted(a, m, &pairs[i], shift))
            continue;
        if (pairs[i].period < *n)
            *n = pairs[i].period;
        while (i > 0 && pairs[i - 1].period >= *n)
            i--;
        *np = i;
        return;
    }
}

static int pairs_match(const mm_allocator *a, mm_alloc_mark *m, const mm_fold_pair *pairs,
                       size_t np, uint64_t shift)
{
    for (size_t i = 0; i < np; i++) {
        int64_t x = pairs[i].at_mark, y = pairs[i].now;
        if (x < 0 || y < 0) {
            if (x >= 0 || y >= 0)
                return 0;
            continue;
        }
        if ((size_t)x >= m->nb || (size_t)y >= a->nb || m->type0[x] != T_OPAQUE ||
            m->type1[y] != T_OPAQUE || !pair_shape(&m->b[x], &a->b[y], shift))
            return 0;
        m->type0[x] = m->type1[y] = T_FREED;
        m->part[x] = (int32_t)y;
        m->still0[x] = m->still1[y] = !same_shape(&m->b[x], &a->b[y], shift) || !shift;
    }
    return 1;
}

/* neighbour w0 of a mark's block against neighbour w1 of its partner */
static int side_ok(const mm_alloc_mark *m, int32_t w0, int32_t w1)
{
    if (w0 < 0 || w1 < 0)
        return w0 < 0 && w1 < 0;
    switch (m->type0[w0]) {
    case T_OPAQUE:
        return m->type1[w1] == T_OPAQUE;
    case T_FIXED:
        return w1 == w0;
    default: /* moving or freed: its own partner */
        return m->part[w0] == w1;
    }
}

/* Whether a chain of free blocks of x's shape that goes on, past its real
 * blocks, with missing ones from `first_missing` on (every `shift` bytes)
 * can stand in for the endless one (see chain_from, chain_to): no search of
 * the period could have taken a missing one, in this period or a folded
 * one.  Missing ones below the real ones (shift down): no search reached
 * the size at all; above them (up): every search the size could serve found
 * a block of that size below the first missing one, also once moved up by
 * the folded periods (m->up: at most that many bytes), so a missing one
 * always loses the tie by address. */
static int chain_ok(const mm_allocator *a, const mm_alloc_mark *m, const blk *x,
                    uint64_t first_missing, uint64_t shift)
{
    for (size_t s = 0; s < a->nrecs; s++) {
        const struct rec_search *q = &a->recs[s];
        if (q->small != x->small || q->req > x->size || q->got < x->size)
            continue;
        if ((int64_t)shift < 0 || q->got != x->size ||
            mm_sat_add(q->ptr, m->up) >= first_missing)
            return 0;
    }
    return 1;
}

/* A free block now that is no moving one's partner: one the period made
 * and left (a segment's remainder no request fits), to stay free through
 * the folded periods, as its copies do: it must be new, free between
 * allocated blocks that stay (or none), and every search of the cache the
 * period made in its pool that could take it (request no larger) found a
 * smaller block.  The folded periods search alike (shifted), so they never
 * reach it or its copies, which are as large. */
/* A free block now, u, that no moving one's partner is: the partner of the
 * mark's free block u - d that the period did not touch, whose own block
 * now is the partner of the mark's at u - 2d, and so on up to one whose
 * block now has none there - a chain of whole free blocks of one shape
 * that grows by one block each period at the end where they move (the 688
 * MiB segments a checkpointed backward frees one per period pair, each
 * below the last).  The state now is the mark's shifted if the chain had
 * no end on the other side; it has, so no search may reach past it
 * (chain_ok).  1 when u is such a chain's, 0 not, and the chain's blocks
 * are partners (those now before slot k already scanned by dead_ones). */
static int chain_to(const mm_allocator *a, mm_alloc_mark *m, size_t u, size_t k, uint64_t shift)
{
    const blk *x = &a->b[u];
    if (!shift || x->prev >= 0 || x->next >= 0)
        return 0;
    size_t cur = u; /* a block now whose mark's partner is sought */
    for (;;) {
        int64_t g = mm_alloc_fold_block_at(m, a->b[cur].ptr - shift);
        if (g < 0 || (size_t)g >= m->nb || m->type0[g] != T_FIXED || m->type1[g] != T_FIXED ||
            !same_shape(&m->b[g], &a->b[cur], shift))
            break;
        m->type0[g] = T_MOVING;
        m->part[g] = (int32_t)cur;
        m->type1[cur] = cur < k ? T_MOVING : T_HIT;
        cur = (size_t)g; /* untouched: the same slot now */
    }
    if (cur == u) /* no chain; the last block now has no mark's partner */
        return 0;
    m->type1[cur] = cur < k ? T_MOVING : T_HIT;
    return chain_ok(a, m, x, a->b[cur].ptr - shift, (uint64_t)0 - shift);
}

/* The free blocks of x's size and pool: 1 when all are whole (no
 * neighbours), their number in *n and the lowest address apart from x's in
 * *lo; 0 when one is not whole. */
static int whole_run(const pool *p, const blk *b, const blk *x, size_t *n, uint64_t *lo)
{
    *n = 0;
    *lo = UINT64_MAX;
    for (int32_t at = pool_first_fit(b, p, x->size); at >= 0 && b[at].size == x->size;
         at = b[at].fnext) {
        const blk *w = &b[at];
        if (w->prev >= 0 || w->next >= 0)
            return 0;
        (*n)++;
        if (w != x && w->ptr < *lo)
            *lo = w->ptr;
    }
    return 1;
}

/* A whole free block now, u, that the period made below every other free
 * block of its size, all whole, one more than at the mark (the 688 MiB
 * segment each period pair of a checkpointed backward frees below the
 * ones it frees before): the free blocks of that size are a ladder that
 * best fit reaches bottom first, and only through searches that found one
 * of them among others all whole (rec.whole).  Every whole free block of
 * the size that the period took and gave back stays (partner); the period
 * after takes the same ranks, one of them u instead of the mark's, and
 * so on, the moving ones (u and its copies) staying below the others as
 * they move down.  The top of the ladder has no mark's partner: no search
 * may have reached past the ladder (a larger block or none found for a
 * request it could serve). */
static int ladder_grows(const mm_allocator *a, const mm_alloc_mark *m, size_t u, uint64_t shift)
{
    const blk *x = &a->b[u];
    size_t n0 = 0, n1;
    uint64_t lo;
    if ((int64_t)shift >= 0 || x->allocated || x->prev >= 0 || x->next >= 0 ||
        !whole_run(&a->pools[x->small ? 0 : 1], a->b, x, &n1, &lo) || x->ptr >= lo) 
        return 0;
    for (size_t k = 0; k < m->nb; k++) {
        const blk *w = &m->b[k];
        if (!w->in_use_slot || w->allocated || !w->mapped || w->small != x->small ||
            w->size != x->size)
            continue;
        if (w->prev >= 0 || w->next >= 0) 
            return 0;
        n0++;
    }
    if (n1 != n0 + 1) {
        return 0; }
    for (size_t s = 0; s < a->nrecs; s++) {
        const struct rec_search *q = &a->recs[s];
        if (q->small != x->small || q->req > x->size || q->got < x->size)
            continue;
        if (q->got != x->size || !q->whole) {
            return 0; }
    }
    return 1;
}

static int dead_ones(const mm_allocator *a, mm_alloc_mark *m, uint64_t shift)
{
    for (size_t k = 0; k < a->nb; k++) {
        if (m->type1[k] == T_HIT) {
            m->type1[k] = T_MOVING;
            continue;
        }
        if (m->type1[k] != T_MOVING)
            continue;
        if (chain_to(a, m, k, k, shift) || ladder_grows(a, m, k, shift)) {
            m->type1[k] = T_MOVING;
            continue;
        }
        const blk *d = &a->b[k];
        if (d->stamp <= m->clock || (d->prev >= 0 && m->type1[d->prev] != T_OPAQUE) ||
            (d->next >= 0 && m->type1[d->next] != T_OPAQUE)) {
            return 0; }
        for (size_t s = 0; s < a->nrecs; s++) {
            const struct rec_search *q = &a->recs[s];
            if (q->small == d->small && q->req <= d->size && q->got >= d->size) {
                return 0; }
        }
    }
    return 1;
}

/* The segments the period changed (a block made or changed there, not given
 * back in place): their extents, sorted, in m->act (m->nact).  -1 out of
 * memory, 0 when a block given back in place shares a segment with them (its
 * order against the moving ones would change), 1 ok. */
static int active_segments(const mm_allocator *a, mm_alloc_mark *m)
{
    m->nact = 0;
    for (size_t k = 0; k < a->nb; k++) {
        if (!a->b[k].in_use_slot || a->b[k].stamp <= m->clock || m->still1[k] ||
            a->b[k].prev >= 0)
            continue; /* a segment's head that the period changed, or one below */
        m->nact++;
    }
    if (reserve_n((void **)&m->act, &m->capact, 2 * (a->nb + 1), sizeof *m->act))
        return -1;
    size_t n = 0;
    for (size_t k = 0; k < a->nb; k++) {
        if (!a->b[k].in_use_slot || a->b[k].prev >= 0)
            continue;
        int changed = 0, still = 0;
        uint64_t end = a->b[k].ptr;
        for (int32_t w = (int32_t)k; w >= 0; w = a->b[w].next) {
            changed |= a->b[w].stamp > m->clock && !m->still1[w];
            still |= m->still1[w];
            end = a->b[w].ptr + a->b[w].size;
        }
        if (changed && still)
            return 0;
        if (changed) {
            m->act[n].lo = a->b[k].ptr;
            m->act[n++].hi = end;
        }
    }
    m->nact = n;
    return 1;
}

/* address p lies in a segment the period changed */
static int in_active(const mm_alloc_mark *m, uint64_t p)
{
    for (size_t k = 0; k < m->nact; k++)
        if (p >= m->act[k].lo && p < m->act[k].hi)
            return 1;
    return 0;
}

/* [lo, hi] meets what the changed segments sweep over n periods */
static int meets_sweep(const mm_alloc_mark *m, uint64_t lo, uint64_t hi, uint64_t shift,
                       uint64_t n)
{
    for (size_t k = 0; k < m->nact; k++) {
        uint64_t a0 = m->act[k].lo, a1 = m->act[k].hi;
        if ((int64_t)shift < 0)
            a0 = a0 > n * -shift ? a0 - n * -shift : 0;
        else
            a1 = mm_sat_add(a1, n * shift);
        if (lo < a1 && hi >= a0)
            return 1;
    }
    return 0;
}

/* Best fit breaks ties between free blocks of one size by address; what
 * the period moves (the blocks of the segments it changed: each folded
 * period does the same there, shifted) must keep its order against what
 * stays (every other block) in each search the period made that had a tie.
 * A search's block found (g) and the others of its size (c, from cmin to
 * cmax): shifted down, a moving g stays below every c; a g that stays keeps
 * its order unless a moving c could pass it (c within the sweep of the
 * changed segments and g too).  Shifted up, a g that stays wins against c
 * that move up from above it; a moving g must not reach a c. */
static int order_kept(const mm_allocator *a, mm_alloc_mark *m, uint64_t shift, uint64_t n)
{
    int r = active_segments(a, m);
    if (r <= 0 || !shift)
        return r < 0 ? -1 : r || !shift;
    for (size_t s = 0; s < a->nrecs; s++) {
        const struct rec_search *q = &a->recs[s];
        if (q->got == UINT64_MAX || !q->others)
            continue;
        int moving = in_active(m, q->ptr);
        if ((int64_t)shift < 0 && !moving && meets_sweep(m, q->ptr, q->ptr, shift, n) &&
            meets_sweep(m, q->cmin, q->cmax, 0, 0))
            return 0;
        if ((int64_t)shift > 0 && moving && q->cmin <= mm_sat_add(q->ptr, n * shift))
            return 0;
    }
    return 1;
}

/* The mark's moving block k (free, changed by the period) has no moving
 * partner now: its partner may be a free block the period did not touch,
 * whose own partner is the next such block, and so on - a chain x, x + d,
 * x + 2d, ... of free whole blocks of one shape (the 688 MiB segments a
 * checkpointed forward consumes one per period pair, bottom first; the
 * remainders its backward merges back, top first).  The state now is then
 * the mark's shifted if the chain went on without end, and folded period j
 * takes its j-th block: as long as it is real (limit) and no search could
 * have taken a missing one (chain_ok), the real chain does the same.  A
 * chain may also end in a moving partner of the usual kind. */
static int chain_from(const mm_allocator *a, mm_alloc_mark *m, size_t k, uint64_t shift)
{
    uint64_t len = 0;
    size_t cur = k;
    for (;;) {
        int64_t y = mm_alloc_fold_block_at(m, m->b[cur].ptr + shift);
        if (!shift || y < 0 || !same_shape(&m->b[cur], &a->b[y], shift) ||
            (m->type1[y] != T_FIXED && m->type1[y] != T_MOVING)) {
            if (cur == k || !chain_ok(a, m, &m->b[k], m->b[k].ptr + (len + 1) * shift, shift))
                return 0;
            if (len < m->limit)
                m->limit = len; /* folded period len + 1 would need one more */
            return 1;
        }
        if (cur != k)
            m->type0[cur] = T_MOVING;
        m->part[cur] = (int32_t)y;
        m->still0[cur] = m->still1[y] = 0;
        if (m->type1[y] == T_MOVING) { /* joins a moving partner */
            m->type1[y] = T_HIT;
            return 1; /* no missing one */
        }
        m->type1[y] = T_HIT;
        if (m->type0[y] != T_FIXED || (size_t)y >= m->nb)
            return 0;
        len++;
        cur = (size_t)y; /* untouched: the same slot at the mark */
    }
}

/* the moving and freed blocks: partners of equal shape (shifted or in
 * place) with matching neighbours, as many moving ones now as at the mark;
 * and nothing else of the mark's changed */
static int blocks_match(const mm_allocator *a, mm_alloc_mark *m, uint64_t shift)
{
    for (size_t k = 0; k < m->nb; k++) {
        uint8_t t = m->type0[k];
        if (t == T_OPAQUE && !untouched(a, m, k)) 
            return 0; /* an allocated block changed without being freed */
        if (t != T_MOVING || m->part[k] >= 0)
            continue;
        int still = 0;
        int64_t y = partner(a, m, k, shift, T_MOVING, &still);
        if (y < 0 && chain_from(a, m, k, shift))
            continue;
        if (y < 0)
            return 0;
        m->part[k] = (int32_t)y;
        m->still0[k] = m->still1[y] = (uint8_t)still;
        m->type1[y] = T_HIT;
    }
    for (size_t k = 0; k < m->nb; k++) {
        uint8_t t = m->type0[k];
        if (t != T_MOVING && t != T_FREED)
            continue;
        const blk *y = &a->b[m->part[k]];
        if (!side_ok(m, m->b[k].prev, y->prev) || !side_ok(m, m->b[k].next, y->next)) 
            return 0;
    }
    if (!dead_ones(a, m, shift)) return 0;
    return 1;
}

/* ---- applying the periods ---------------------------------------------------------------- */

static int by_u64(const void *x, const void *y)
{
    uint64_t p = *(const uint64_t *)x, q = *(const uint64_t *)y;
    return p < q ? -1 : p > q;
}

/* X: the mark's blocks changed or gone; T: now's blocks made or changed;
 * but not those back in place as they were (each period leaves them so);
 * and the addresses of those (skip_handles) */
static int collect_changes(const mm_allocator *a, mm_alloc_mark *m)
{
    m->nx = m->nt = m->nstill = 0;
    for (size_t k = 0; k < m->nb; k++)
        if (m->b[k].in_use_slot && !untouched(a, m, k) && !m->still0[k]) {
            if (reserve_n((void **)&m->x, &m->capx, m->nx + 1, sizeof *m->x))
                return -1;
            m->x[m->nx++] = m->b[k];
        }
    for (size_t k = 0; k < a->nb; k++) {
        if (!a->b[k].in_use_slot || a->b[k].stamp <= m->clock)
            continue;
        if (m->still1[k]) {
            if (reserve_n((void **)&m->still, &m->capstill, m->nstill + 1, sizeof *m->still))
                return -1;
            m->still[m->nstill++] = a->b[k].ptr;
            continue;
        }
        if (reserve_n((void **)&m->t, &m->capt, m->nt + 1, sizeof *m->t))
            return -1;
        m->t[m->nt++] = a->b[k];
    }
    if (m->nstill)
        qsort(m->still, m->nstill, sizeof *m->still, by_u64);
    return 0;
}

int mm_alloc_fold_still(const mm_alloc_mark *m, uint64_t ptr)
{
    size_t lo = 0, hi = m->nstill;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->still[mid] < ptr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < m->nstill && m->still[lo] == ptr;
}

/* period j: X shifted out, T shifted in (links only say "has a neighbour":
 * relink sets them) */
static int apply_period(mm_allocator *a, mm_alloc_mark *m, uint64_t shift)
{
    for (size_t i = 0; i < m->nx; i++) {
        const blk *x = &m->x[i];
        int64_t k = mm_alloc_fold_block_at(m, x->ptr + shift);
        if (k < 0 || !same_shape(x, &a->b[k], shift))
            return -1;
        hdel(m, x->ptr + shift);
        alloc_blk_delete(a, (int32_t)k);
    }
    for (size_t i = 0; i < m->nt; i++) {
        const blk *t = &m->t[i];
        int32_t k = alloc_blk_new(a, t->ptr + shift, t->size, t->small, t->seg);
        if (k < 0)
            return -1;
        blk *b = &a->b[k];
        b->req = t->req;
        b->allocated = t->allocated;
        b->mapped = t->mapped;
        b->gc_base = t->gc_base;
        b->prev = t->prev >= 0 ? 0 : -1;
        b->next = t->next >= 0 ? 0 : -1;
        hput(m, b->ptr, k);
    }
    return 0;
}

/* the neighbour links from the addresses: next at ptr + size */
static int relink(mm_allocator *a, const mm_alloc_mark *m)
{
    size_t had_prev = 0, links = 0;
    for (size_t k = 0; k < a->nb; k++)
        if (a->b[k].in_use_slot && a->b[k].prev >= 0)
            had_prev++;
    for (size_t k = 0; k < a->nb; k++)
        a->b[k].prev = -1;
    for (size_t k = 0; k < a->nb; k++) {
        blk *b = &a->b[k];
        if (!b->in_use_slot || b->next < 0)
            continue;
        int64_t n = mm_alloc_fold_block_at(m, b->ptr + b->size);
        if (n < 0 || a->b[n].prev >= 0)
            return -1;
        b->next = (int32_t)n;
        a->b[n].prev = (int32_t)k;
        links++;
    }
    return links == had_prev ? 0 : -1;
}

typedef struct pool_key {
    uint64_t size, ptr;
    int32_t i;
} pool_key;

static int by_size_ptr(const void *x, const void *y)
{
    const pool_key *p = x, *q = y;
    if (p->size != q->size)
        return p->size < q->size ? -1 : 1;
    return p->ptr < q->ptr ? -1 : p->ptr > q->ptr;
}

/* the free lists again, sorted like BlockComparatorSize */
static int rebuild_pools(mm_allocator *a)
{
    for (size_t k = 0; k < a->nb; k++)
        a->b[k].pooled = 0;
    pool_key *keys = malloc((a->nb + 1) * sizeof *keys);
    if (!keys)
        return -1;
    for (int small = 0; small < 2; small++) {
        pool *p = &a->pools[small ? 0 : 1];
        size_t n = 0;
        for (size_t k = 0; k < a->nb; k++) {
            const blk *b = &a->b[k];
            if (b->in_use_slot && !b->allocated && b->mapped && b->small == small)
                keys[n++] = (pool_key){b->size, b->ptr, (int32_t)k};
        }
        qsort(keys, n, sizeof *keys, by_size_ptr);
        alloc_pool_clear(p);
        for (size_t k = 0; k < n; k++) /* in order: each one goes last */
            alloc_pool_link(a, p, keys[k].i);
    }
    free(keys);
    return 0;
}

/* now + n (now - mark), in two's complement (a difference may be negative) */
static uint64_t ahead(uint64_t now, uint64_t mark, uint64_t n)
{
    return now + n * (now - mark);
}

static void peak_ahead(uint64_t *peak, uint64_t now, uint64_t mark, uint64_t pmax, uint64_t n)
{
    if (now > mark)
        *peak = max_u64(*peak, pmax + n * (now - mark));
}

static void stats_ahead(mm_allocator *a, const mm_alloc_mark *m, const uint64_t pmax[4],
                        uint64_t n)
{
    mm_alloc_stats *s = &a->st;
    const mm_alloc_stats *s0 = &m->st;
    peak_ahead(&s->allocated_peak, s->allocated, s0->allocated, pmax[0], n);
    peak_ahead(&s->requested_peak, s->requested, s0->requested, pmax[1], n);
    peak_ahead(&s->reserved_peak, s->reserved, s0->reserved, pmax[2], n);
    peak_ahead(&s->segments_peak, s->segments, s0->segments, pmax[3], n);
    s->allocated = ahead(s->allocated, s0->allocated, n);
    s->requested = ahead(s->requested, s0->requested, n);
    s->reserved = ahead(s->reserved, s0->reserved, n);
    s->segments = ahead(s->segments, s0->segments, n);
    s->inactive_split = ahead(alloc_inactive_split(a), s0->inactive_split, n);
    s->num_device_alloc = ahead(s->num_device_alloc, s0->num_device_alloc, n);
    s->num_allocs = ahead(s->num_allocs, s0->num_allocs, n);
}

/* a current statistic that n more periods would take below zero: the
 * periods cannot all be the same (stat_sub would clamp) */
static int stats_stay(const mm_allocator *a, const mm_alloc_mark *m, uint64_t n)
{
    const uint64_t now[3] = {a->st.allocated, a->st.requested, alloc_inactive_split(a)};
    const uint64_t then[3] = {m->st.allocated, m->st.requested, m->st.inactive_split};
    for (int i = 0; i < 3; i++)
        if (now[i] < then[i] && (then[i] - now[i]) > now[i] / n)
            return 0;
    return 1;
}

/* The shift of one period: down the new segments' bytes when it got any,
 * else from the first freed pair not given back in place (0 when none). */
static uint64_t pick_shift(const mm_allocator *a, const mm_alloc_mark *m,
                           const mm_fold_pair *pairs, size_t np, uint64_t down)
{
    if (down)
        return (uint64_t)0 - down;
    for (size_t i = 0; i < np; i++)
        if (pairs[i].at_mark >= 0 && (size_t)pairs[i].at_mark < m->nb && pairs[i].now >= 0 &&
            (size_t)pairs[i].now < a->nb &&
            a->b[pairs[i].now].ptr != m->b[pairs[i].at_mark].ptr)
            return a->b[pairs[i].now].ptr - m->b[pairs[i].at_mark].ptr;
    return 0; /* every pair in place (pair_shape) */
}

/* An upward shift: a moving block could pass a fixed one of its size, so
 * every fixed free block must lie outside all that the n periods change
 * (below it, or above where it ends). */
static int fixed_clear(const mm_allocator *a, const mm_alloc_mark *m, uint64_t shift, uint64_t n)
{
    if ((int64_t)shift <= 0)
        return 1;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t k = 0; k < m->nb; k++)
        if (m->type0[k] == T_MOVING || m->type0[k] == T_FREED || (m->b[k].in_use_slot &&
                                                                  !untouched(a, m, k))) {
            lo = m->b[k].ptr < lo ? m->b[k].ptr : lo;
            hi = max_u64(hi, m->b[k].ptr + m->b[k].size);
        }
    for (size_t k = 0; k < a->nb; k++)
        if (a->b[k].in_use_slot && (a->b[k].stamp > m->clock || m->type1[k] == T_FREED)) {
            lo = a->b[k].ptr < lo ? a->b[k].ptr : lo;
            hi = max_u64(hi, a->b[k].ptr + a->b[k].size);
        }
    hi += n * shift;
    for (size_t k = 0; k < a->nb; k++)
        if (m->type1[k] == T_FIXED && a->b[k].ptr + a->b[k].size > lo && a->b[k].ptr < hi)
            return 0;
    return 1;
}

int64_t mm_alloc_fold(mm_allocator *a, mm_alloc_mark *m, const uint64_t pmax[4],
                      const mm_fold_pair *pairs, size_t npairs, uint64_t periods,
                      uint64_t reserved_limit, uint64_t *shift)
{
    uint64_t down = 0, n = periods_allowed(a, m, periods, reserved_limit, &down);
    if (!n || !stats_stay(a, m, n)) return 0;
    uint64_t d = pick_shift(a, m, pairs, npairs, down);
    pairs_shifted(a, m, pairs, &npairs, &n, d);
    if (!n) return 0;
    if (classify(a, m))
        return -1;
    m->up = (int64_t)d > 0 ? n * d : 0;
    if (!pairs_match(a, m, pairs, npairs, d)) return 0;
    if (!blocks_match(a, m, d)) { return 0; }
    if (m->limit < n)
        n = m->limit;
    if (!n) return 0;
    int ok = order_kept(a, m, d, n);
    if (ok < 0)
        return -1;
    if (!ok) return 0;
    if (!fixed_clear(a, m, d, n)) return 0;
    if (collect_changes(a, m))
        return -1;
    size_t grow = m->nt > m->nx ? m->nt - m->nx : 0;
    if (hash_init(m, a->nb + n * grow))
        return -1;
    for (size_t k = 0; k < a->nb; k++)
        if (a->b[k].in_use_slot)
            hput(m, a->b[k].ptr, (int32_t)k);
    for (uint64_t j = 1; j <= n; j++)
        if (apply_period(a, m, j * d))
            return -1;
    if (relink(a, m) || rebuild_pools(a) || a->nomem)
        return -1;
    stats_ahead(a, m, pmax, n);
    a->next_addr -= n * down;
    *shift = d;
    return (int64_t)n;
}


