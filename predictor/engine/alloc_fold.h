/* alloc_fold.h - fast-forwarding the caching-allocator model (alloc.c) over
 * the repeated periods of a replay, exactly (engine layer; used by reserve.c).
 *
 * Why: a step's log repeats itself layer after layer, and replaying every
 * event of every layer through the model is most of a prediction's cost.
 * When one period (a layer's events) leaves the allocator in the state it
 * found, shifted - the same free blocks, the same blocks about to be freed,
 * each moved down by the bytes of the segments the period got from the
 * driver, with the same neighbours - the next period does the same things
 * to the shifted blocks, and so does every period after it (the model's
 * choices depend on sizes, on the order of addresses, and on which
 * neighbours are free; a shift down keeps all of them).  Then the remaining
 * periods are applied as copies of the first one's changes instead of being
 * replayed.  When the state is not provably the same, nothing is folded. */
#ifndef MM_ALLOC_FOLD_H
#define MM_ALLOC_FOLD_H

#include <stddef.h>
#include <stdint.h>
#include "alloc.h"

typedef struct mm_alloc_mark mm_alloc_mark;

mm_alloc_mark *mm_alloc_mark_new(void);
void mm_alloc_mark_free(mm_alloc_mark *m);
/* The allocator at the start of a period: a copy of its blocks and stats.
 * Until mm_alloc_mark_close its peak statistics follow the period alone (the
 * fold needs the period's own maxima, which close puts in pmax: allocated,
 * requested, reserved, segments) and close restores them.  One mark open at
 * a time.  0, -1 out of memory (nothing changed). */
int mm_alloc_mark_open(mm_allocator *a, mm_alloc_mark *m);
/* A light mark: the statistics and the free blocks' sizes alone, all that
 * mm_alloc_fold_maybe reads (mm_alloc_fold needs an open one, closed). */
int mm_alloc_mark_light(const mm_allocator *a, mm_alloc_mark *m);
void mm_alloc_mark_close(mm_allocator *a, mm_alloc_mark *m, uint64_t pmax[4]);
/* 0 when the state now cannot be the (closed) mark's shifted: a quick test
 * of its free bytes and free blocks before mm_alloc_fold's whole one */
int mm_alloc_fold_maybe(const mm_allocator *a, const mm_alloc_mark *m);

/* the address of a handle's block */
uint64_t mm_allocator_block_ptr(const mm_allocator *a, int64_t h);

/* A tensor that existed at the mark and is freed during the folded periods:
 * its handle at the mark, and the handle now of the tensor the next period
 * frees in its place (-1 both: a free of nothing). */
typedef struct mm_fold_pair {
    int64_t at_mark, now;
    uint64_t period;   /* the period that frees at_mark: 0 the verified one, j the j-th folded */
} mm_fold_pair;

/* One period ran from mark m (closed) to now, its maxima pmax (the largest
 * of its parts' when it was run as several).  If the state now is the
 * mark's shifted down by the period's new segments (see above; `pairs` are
 * the mark's blocks freed in the verified period and the periods to fold
 * but the last, in order; a pair not shifted like the others limits the
 * periods to those before it), apply up to
 * `periods` more periods at once: fewer when the reserved bytes would pass
 * `reserved_limit` (or the card's capacity) before the last, as the periods
 * replayed one by one would have found them (a segment callback is not
 * called for them).  Returns the periods applied (0: not provably the same,
 * nothing changed) and *down, the shift of one period; -1 out of memory or
 * an inconsistent state (the allocator is then unusable). */
int64_t mm_alloc_fold(mm_allocator *a, mm_alloc_mark *m, const uint64_t pmax[4],
                      const mm_fold_pair *pairs, size_t npairs, uint64_t periods,
                      uint64_t reserved_limit, uint64_t *shift);
/* After mm_alloc_fold applied periods: the handle of the block at `ptr`,
 * -1 none (the block of a tensor a folded period allocated). */
int64_t mm_alloc_fold_block_at(const mm_alloc_mark *m, uint64_t ptr);
/* After mm_alloc_fold applied periods: 1 when the block the verified period
 * left at `ptr` is one it gave back in place (every folded period leaves its
 * copy there, not shifted), 0 when it moves with the shift. */
int mm_alloc_fold_still(const mm_alloc_mark *m, uint64_t ptr);

/* What a check of the fold compares (MMGUARD_REPLAY_FOLD=check, reserve.c):
 * a hash of the allocator's whole state (its blocks by address, not by slot,
 * their neighbours, the free lists' order, the statistics), and one step of
 * such a hash. */
uint64_t mm_alloc_state_hash(const mm_allocator *a);
uint64_t mm_alloc_hash_add(uint64_t h, uint64_t x);

#endif
