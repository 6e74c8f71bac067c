/* test_alloc.c - the caching-allocator model on sequences whose answers are
 * derived by hand from c10/cuda/CUDACachingAllocator.cpp (each test says how),
 * the PYTORCH_CUDA_ALLOC_CONF parser, and the trace reader's errors.  The real
 * GPU traces are replayed by tests/alloc/run.sh. */
#include "unit.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "alloc_fold.h"
#include "mmguard.h"

#define MiB (1024ull * 1024ull)

static mm_allocator *new_alloc(const char *conf, uint64_t capacity)
{
    mm_alloc_conf c;
    mm_error e;
    mm_alloc_conf_default(&c);
    if (conf)
        ck_assert_msg(mm_alloc_conf_parse(&c, conf, &e) == 0, "%s", e.msg);
    mm_allocator *a = mm_allocator_new(&c, capacity, 0);
    ck_assert_ptr_nonnull(a);
    return a;
}

#define RESERVED(a) (mm_allocator_stats(a)->reserved)

START_TEST(round_size_rules)
{
    mm_alloc_conf c;
    mm_alloc_conf_default(&c);
    ck_assert_uint_eq(mm_alloc_round_size(&c, 1), 512);           /* kMinBlockSize */
    ck_assert_uint_eq(mm_alloc_round_size(&c, 512), 512);
    ck_assert_uint_eq(mm_alloc_round_size(&c, 513), 1024);
    ck_assert_uint_eq(mm_alloc_round_size(&c, MiB + 1), MiB + 512);
    mm_error e;
    ck_assert_int_eq(mm_alloc_conf_parse(&c, "roundup_power2_divisions:4", &e), 0);
    /* 1200 MiB: floor 1024 MiB, four divisions of 256 MiB -> 1280 MiB */
    ck_assert_uint_eq(mm_alloc_round_size(&c, 1200 * MiB), 1280 * MiB);
    ck_assert_uint_eq(mm_alloc_round_size(&c, 1024 * MiB), 1024 * MiB); /* a power of 2 */
    /* at most 512 * divisions bytes: plain 512-byte rounding */
    ck_assert_uint_eq(mm_alloc_round_size(&c, 1000), 1024);
}
END_TEST

START_TEST(small_requests_share_2mib_segments)
{
    mm_allocator *a = new_alloc(NULL, 0);
    int64_t h1 = mm_allocator_malloc(a, 100), h2 = mm_allocator_malloc(a, 100);
    ck_assert(h1 >= 0 && h2 >= 0 && h1 != h2);
    ck_assert_uint_eq(RESERVED(a), 2 * MiB); /* one kSmallBuffer */
    ck_assert_uint_eq(mm_allocator_stats(a)->allocated, 1024); /* two 512-byte blocks */
    ck_assert_uint_eq(mm_allocator_stats(a)->requested, 200);
    mm_allocator_free(a);
}
END_TEST

START_TEST(mid_requests_share_20mib_segments)
{
    /* 3 MiB < kMinLargeAlloc: a 20 MiB segment, split while more than 1 MiB
     * would remain: six fit (17, 14, 11, 8, 5, 2 MiB left), the 7th needs
     * 3 MiB > 2: a second segment */
    mm_allocator *a = new_alloc(NULL, 0);
    for (int i = 0; i < 6; i++)
        ck_assert(mm_allocator_malloc(a, 3 * MiB) >= 0);
    ck_assert_uint_eq(RESERVED(a), 20 * MiB);
    ck_assert(mm_allocator_malloc(a, 3 * MiB) >= 0);
    ck_assert_uint_eq(RESERVED(a), 40 * MiB);
    ck_assert_uint_eq(mm_allocator_stats(a)->num_device_alloc, 2);
    mm_allocator_free(a);
}
END_TEST

START_TEST(large_rounding_and_no_split_under_1mib)
{
    /* 11 MiB + 1 byte: rounded to 11 MiB + 512, segment rounded to 2 MiB: 12 MiB.
     * Reused for 11.5 MiB: 0.5 MiB would remain, not > kSmallSize: not split,
     * so the whole 12 MiB block is allocated. */
    mm_allocator *a = new_alloc(NULL, 0);
    int64_t h = mm_allocator_malloc(a, 11 * MiB + 1);
    ck_assert_uint_eq(RESERVED(a), 12 * MiB);
    mm_allocator_release(a, h);
    h = mm_allocator_malloc(a, 11 * MiB + MiB / 2);
    ck_assert(h >= 0);
    ck_assert_uint_eq(RESERVED(a), 12 * MiB);
    ck_assert_uint_eq(mm_allocator_stats(a)->allocated, 12 * MiB);
    mm_allocator_free(a);
}
END_TEST

START_TEST(fragmentation_and_best_fit)
{
    /* A, B 100 MiB each; free A; 150 MiB fits in neither: a third segment */
    mm_allocator *a = new_alloc(NULL, 0);
    int64_t A = mm_allocator_malloc(a, 100 * MiB);
    ck_assert(mm_allocator_malloc(a, 100 * MiB) >= 0);
    mm_allocator_release(a, A);
    ck_assert(mm_allocator_malloc(a, 150 * MiB) >= 0);
    ck_assert_uint_eq(RESERVED(a), 350 * MiB);
    mm_allocator_free(a);

    /* free 40 and 30 MiB blocks: 25 MiB takes the smaller one (best fit) and
     * splits it (5 MiB > 1 MiB left); a following 35 MiB still fits the 40 */
    a = new_alloc(NULL, 0);
    int64_t x = mm_allocator_malloc(a, 40 * MiB), y = mm_allocator_malloc(a, 30 * MiB);
    mm_allocator_release(a, x);
    mm_allocator_release(a, y);
    ck_assert(mm_allocator_malloc(a, 25 * MiB) >= 0);
    ck_assert(mm_allocator_malloc(a, 35 * MiB) >= 0);
    ck_assert_uint_eq(RESERVED(a), 70 * MiB);
    ck_assert_uint_eq(mm_allocator_stats(a)->inactive_split, 10 * MiB); /* 5 + 5 */
    mm_allocator_free(a);
}
END_TEST

START_TEST(best_fit_within_a_size_class)
{
    /* Free blocks of 24.5 and 24.75 MiB (one size class of the pool's list:
     * alloc_internal.h): best fit (get_free_block's lower_bound by size) for
     * 24.625 MiB passes the smaller one and takes the larger, unsplit (0.125
     * MiB would remain, not > kSmallSize); then 24.25 MiB takes the 24.5 MiB
     * one.  Each is made by a request whose 26 MiB segment (2 MiB rounding)
     * splits, its remainder taken by a request of that size, so that freeing
     * it cannot merge: no new segment is needed for either. */
    mm_allocator *a = new_alloc(NULL, 0);
    int64_t x1 = mm_allocator_malloc(a, 24 * MiB + MiB / 2);
    ck_assert(mm_allocator_malloc(a, MiB + MiB / 2) >= 0);
    int64_t x2 = mm_allocator_malloc(a, 24 * MiB + 3 * MiB / 4);
    ck_assert(mm_allocator_malloc(a, MiB + MiB / 4) >= 0);
    ck_assert_uint_eq(RESERVED(a), 52 * MiB);
    uint64_t p1 = mm_allocator_block_ptr(a, x1), p2 = mm_allocator_block_ptr(a, x2);
    mm_allocator_release(a, x1);
    mm_allocator_release(a, x2);
    ck_assert_uint_eq(mm_allocator_largest_free(a), 24 * MiB + 3 * MiB / 4);
    int64_t h = mm_allocator_malloc(a, 24 * MiB + 5 * MiB / 8);
    ck_assert(h >= 0);
    ck_assert_uint_eq(mm_allocator_block_ptr(a, h), p2);
    h = mm_allocator_malloc(a, 24 * MiB + MiB / 4);
    ck_assert(h >= 0);
    ck_assert_uint_eq(mm_allocator_block_ptr(a, h), p1);
    ck_assert_uint_eq(RESERVED(a), 52 * MiB);
    ck_assert_uint_eq(mm_allocator_largest_free(a), 0);
    mm_allocator_free(a);
}
END_TEST

START_TEST(max_split_size)
{
    /* max_split_size_mb:128: a free 200 MiB block is not given to a 50 MiB
     * request (get_free_block), so a new 50 MiB segment is made */
    mm_allocator *a = new_alloc("max_split_size_mb:128", 0);
    int64_t h = mm_allocator_malloc(a, 200 * MiB);
    mm_allocator_release(a, h);
    ck_assert(mm_allocator_malloc(a, 50 * MiB) >= 0);
    ck_assert_uint_eq(RESERVED(a), 250 * MiB);
    mm_allocator_free(a);

    /* an oversize block serves a large request only within
     * max_non_split_rounding (20 MiB): 220 for 210 yes, 220 for 190 no */
    a = new_alloc("max_split_size_mb:128", 0);
    h = mm_allocator_malloc(a, 220 * MiB);
    mm_allocator_release(a, h);
    h = mm_allocator_malloc(a, 210 * MiB);
    ck_assert_uint_eq(RESERVED(a), 220 * MiB);
    mm_allocator_release(a, h);
    ck_assert(mm_allocator_malloc(a, 190 * MiB) >= 0);
    ck_assert_uint_eq(RESERVED(a), 410 * MiB);
    mm_allocator_free(a);
}
END_TEST

START_TEST(capacity_retry_and_oom)
{
    /* capacity 100 MiB: 60 cached, 80 asked: cudaMalloc fails, the cache is
     * emptied (release_cached_blocks), the retry succeeds; then 30 more: OOM */
    mm_allocator *a = new_alloc(NULL, 100 * MiB);
    int64_t h = mm_allocator_malloc(a, 60 * MiB);
    mm_allocator_release(a, h);
    ck_assert(mm_allocator_malloc(a, 80 * MiB) >= 0);
    ck_assert_uint_eq(RESERVED(a), 80 * MiB);
    ck_assert_uint_eq(mm_allocator_stats(a)->num_alloc_retries, 1);
    ck_assert_int_eq(mm_allocator_malloc(a, 30 * MiB), MM_ALLOC_OOM);
    ck_assert_uint_eq(mm_allocator_stats(a)->num_ooms, 1);
    mm_allocator_empty_cache(a);
    ck_assert_uint_eq(RESERVED(a), 80 * MiB); /* in use: not released */
    mm_allocator_free(a);
}
END_TEST

/* a log of n events over `slots` tensors: each event frees a live one or
 * asks for a block for a dead one (sizes of 0.5 KiB to ~96 MiB, an LCG) */
static void random_log(mm_alloc_ev *ev, size_t n, int32_t slots, uint64_t seed)
{
    uint8_t live[64] = {0};
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int32_t id = (int32_t)((seed >> 33) % (uint64_t)slots);
        uint64_t bytes = (seed >> 7) % ((seed >> 60) > 11 ? 96 * MiB : 3 * MiB) + 1;
        ev[i] = (mm_alloc_ev){.bytes = bytes, .id = id, .is_free = live[id]};
        live[id] = !live[id];
    }
}

/* mm_allocator_run does what malloc and release one by one do, in the plain
 * copy and in the other (expandable segments, max_split_size, gc), and
 * stops at a request that gets no block and when *stop is set */
START_TEST(run_matches_malloc_and_release)
{
    static const char *const confs[] = {NULL, "expandable_segments:True",
                                        "max_split_size_mb:40",
                                        "garbage_collection_threshold:0.5"};
    enum { N = 4000, SLOTS = 48 };
    static mm_alloc_ev ev[N];
    random_log(ev, N, SLOTS, 42);
    for (size_t c = 0; c < sizeof confs / sizeof *confs; c++) {
        uint64_t cap = c == 3 ? 0 : 640 * MiB;
        mm_alloc_conf conf;
        mm_error e;
        mm_alloc_conf_default(&conf);
        if (confs[c])
            ck_assert_msg(mm_alloc_conf_parse(&conf, confs[c], &e) == 0, "%s", e.msg);
        if (c == 3)
            conf.memory_fraction = 0.9;
        mm_allocator *one = mm_allocator_new(&conf, cap, 1024 * MiB);
        mm_allocator *all = mm_allocator_new(&conf, cap, 1024 * MiB);
        int64_t h1[SLOTS], h2[SLOTS];
        for (int k = 0; k < SLOTS; k++)
            h1[k] = h2[k] = -1;
        size_t fails = 0;
        for (size_t i = 0; i < N; i++) {
            if (ev[i].is_free) {
                mm_allocator_release(one, h1[ev[i].id]);
                h1[ev[i].id] = -1;
            } else {
                h1[ev[i].id] = mm_allocator_malloc(one, ev[i].bytes);
                fails += h1[ev[i].id] < 0;
            }
        }
        int stop = 0;
        size_t runs = 0;
        for (size_t i = 0; i < N; runs++) {
            size_t k = mm_allocator_run(all, ev + i, N - i, h2, &stop);
            ck_assert_uint_gt(k, 0);
            i += k;
            if (i < N) /* it stopped at a request without a block */
                ck_assert_int_lt(h2[ev[i - 1].id], 0);
        }
        ck_assert_uint_eq(runs, fails + (ev[N - 1].is_free || h2[ev[N - 1].id] >= 0));
        if (cap) /* the card is full now and then */
            ck_assert_uint_gt(fails, 0);
        for (int k = 0; k < SLOTS; k++)
            ck_assert_int_eq(h1[k], h2[k]);
        ck_assert_uint_eq(mm_alloc_state_hash(one), mm_alloc_state_hash(all));
        ck_assert_int_eq(memcmp(mm_allocator_stats(one), mm_allocator_stats(all),
                                sizeof(mm_alloc_stats)), 0);
        ck_assert_uint_gt(mm_allocator_stats(all)->num_allocs, N / 4);
        stop = 1;
        ck_assert_uint_eq(mm_allocator_run(all, ev, N, h2, &stop), 0);
        mm_allocator_free(one);
        mm_allocator_free(all);
    }
}
END_TEST

/* inactive_split_bytes as a plain allocator derives it from its free blocks
 * and as one with a max_split_size no block reaches keeps it, event by event
 * (alloc_found_block, free_block): the same */
START_TEST(inactive_split_derived_as_kept)
{
    enum { N = 3000, SLOTS = 40 };
    static mm_alloc_ev ev[N];
    random_log(ev, N, SLOTS, 7);
    mm_allocator *plain = new_alloc(NULL, 0), *kept = new_alloc("max_split_size_mb:1000000", 0);
    int64_t h1[SLOTS], h2[SLOTS];
    for (int k = 0; k < SLOTS; k++)
        h1[k] = h2[k] = -1;
    uint64_t most = 0;
    for (size_t i = 0; i < N; i++) {
        int64_t *h[2] = {h1, h2};
        mm_allocator *a[2] = {plain, kept};
        for (int k = 0; k < 2; k++) {
            if (ev[i].is_free) {
                mm_allocator_release(a[k], h[k][ev[i].id]);
                h[k][ev[i].id] = -1;
            } else {
                h[k][ev[i].id] = mm_allocator_malloc(a[k], ev[i].bytes);
            }
        }
        uint64_t x = mm_allocator_stats(plain)->inactive_split;
        ck_assert_uint_eq(x, mm_allocator_stats(kept)->inactive_split);
        most = x > most ? x : most;
    }
    ck_assert_uint_gt(most, 0);
    mm_allocator_free(plain);
    mm_allocator_free(kept);
}
END_TEST

START_TEST(empty_cache_releases_unsplit)
{
    mm_allocator *a = new_alloc(NULL, 0);
    int64_t x = mm_allocator_malloc(a, 64 * MiB), y = mm_allocator_malloc(a, 100);
    mm_allocator_release(a, x);
    mm_allocator_release(a, y);
    ck_assert_uint_eq(mm_allocator_stats(a)->reserved_peak, 66 * MiB);
    mm_allocator_empty_cache(a);
    ck_assert_uint_eq(RESERVED(a), 0);
    mm_allocator_reset_peaks(a);
    ck_assert_uint_eq(mm_allocator_stats(a)->reserved_peak, 0);
    mm_allocator_free(a);
}
END_TEST

START_TEST(expandable_segments_map_pages)
{
    /* 30 MiB maps two 20 MiB pages (40); 5 MiB is carved from the 10 left;
     * 20 MiB then maps one more page after the 5 MiB free tail: 60 MiB */
    mm_allocator *a = new_alloc("expandable_segments:True", 0);
    ck_assert(mm_allocator_malloc(a, 30 * MiB) >= 0);
    ck_assert_uint_eq(RESERVED(a), 40 * MiB);
    ck_assert(mm_allocator_malloc(a, 5 * MiB) >= 0);
    ck_assert_uint_eq(RESERVED(a), 40 * MiB);
    int64_t h = mm_allocator_malloc(a, 20 * MiB);
    ck_assert(h >= 0);
    ck_assert_uint_eq(RESERVED(a), 60 * MiB);
    /* freeing the last block and emptying the cache unmaps whole free pages */
    mm_allocator_release(a, h);
    mm_allocator_empty_cache(a);
    ck_assert_uint_eq(RESERVED(a), 40 * MiB);
    mm_allocator_free(a);
}
END_TEST

START_TEST(conf_parse)
{
    mm_alloc_conf c;
    mm_error e;
    mm_alloc_conf_default(&c);
    ck_assert_int_eq(mm_alloc_conf_parse(&c, "roundup_power2_divisions:[256:1,512:2,>:4],"
                                             "expandable_segments:True, max_split_size_mb:128",
                                         &e), 0);
    ck_assert_uint_eq(c.roundup_divisions[0], 1); /* the first value fills below it */
    ck_assert_uint_eq(c.roundup_divisions[8], 1);
    ck_assert_uint_eq(c.roundup_divisions[9], 2);
    ck_assert_uint_eq(c.roundup_divisions[10], 4);
    ck_assert_uint_eq(c.roundup_divisions[15], 4);
    ck_assert_int_eq(c.expandable_segments, 1);
    ck_assert_uint_eq(c.max_split_size, 128 * MiB);
    ck_assert_uint_eq(mm_alloc_round_size(&c, 300 * MiB), 300 * MiB);  /* 1 division */
    ck_assert_uint_eq(mm_alloc_round_size(&c, 600 * MiB), 768 * MiB);  /* 2 */
    ck_assert_uint_eq(mm_alloc_round_size(&c, 1200 * MiB), 1280 * MiB); /* 4 */
    /* every parse starts from the defaults, as torch's parseArgs does */
    ck_assert_int_eq(mm_alloc_conf_parse(&c, "backend:native,garbage_collection_threshold:0.6",
                                         &e), 0);
    ck_assert_uint_eq(c.max_split_size, UINT64_MAX);
    ck_assert_int_eq(c.expandable_segments, 0);
    ck_assert(c.gc_threshold > 0.59 && c.gc_threshold < 0.61);
    ck_assert_int_eq(mm_alloc_conf_parse(&c, "", &e), 0);
}
END_TEST

START_TEST(conf_errors_name_the_key)
{
    static const struct {
        const char *in, *want;
    } bad[] = {
        {"max_split_size_mb:10", "max_split_size_mb: 10 too small"},
        {"max_split_sz_mb:200", "did you mean 'max_split_size_mb'"},
        {"expandable_segments:maybe", "expandable_segments: expected True or False"},
        {"garbage_collection_threshold:1.5", "garbage_collection_threshold: '1.5'"},
        {"roundup_power2_divisions:3", "roundup_power2_divisions: 3 must be a power of 2"},
        {"roundup_power2_divisions:[100:2]", "interval 100 (MiB) must be a power of 2"},
        {"roundup_power2_divisions:[256:2", "missing ']'"},
        {"max_split_size_mb", "max_split_size_mb: expected ':'"},
        {"max_split_size_mb:-5", "expected a non-negative integer"},
        {"max_split_size_mb:128 x", "max_split_size_mb: unexpected 'x'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mm_alloc_conf c;
        mm_error e;
        mm_alloc_conf_default(&c);
        c.max_split_size = 7;
        ck_assert_int_eq(mm_alloc_conf_parse(&c, bad[i].in, &e), -1);
        ck_assert_msg(strstr(e.msg, bad[i].want), "'%s': got '%s'", bad[i].in, e.msg);
        ck_assert_uint_eq(c.max_split_size, 7); /* unchanged on error */
    }
}
END_TEST

#define HDR "# mmguard-alloc-trace/1 {\"id\": \"t\", \"alloc_conf\": null}\n"

static int replay(const char *text, mm_replay_result *r, mm_error *e)
{
    return mm_alloc_replay_buffer(text, strlen(text), "t.trace", NULL,
                                  MM_REPLAY_CONF_FROM_TRACE | MM_REPLAY_TRACE_ADDRESSES, 0, r, e);
}

/* What MMGUARD_REPLAY_FOLD=check compares after a fold (alloc_fold.c,
 * mm_alloc_state_hash): the same sequence gives the same hash; a tensor's
 * request counts while its block is allocated and not once it is free (a
 * free block's req is the last tensor's, read by nothing: 3 MiB - 100 and
 * 3 MiB - 200 both round to a 3 MiB block, kMinBlockSize 512; the peak of
 * the requested bytes still tells them apart until it is reset); a block at
 * another address or with other neighbours is another state. */
START_TEST(state_hash_what_a_fold_keeps)
{
    mm_allocator *a = new_alloc(NULL, 0), *b = new_alloc(NULL, 0);
    int64_t x = mm_allocator_malloc(a, 3 * MiB - 100), y = mm_allocator_malloc(b, 3 * MiB - 200);
    ck_assert_int_ge(x, 0);
    ck_assert_int_ge(y, 0);
    ck_assert_uint_ne(mm_alloc_state_hash(a), mm_alloc_state_hash(b)); /* requested differs */
    mm_allocator_release(a, x);
    mm_allocator_release(b, y);
    ck_assert_uint_ne(mm_alloc_state_hash(a), mm_alloc_state_hash(b)); /* requested_peak */
    mm_allocator_reset_peaks(a);
    mm_allocator_reset_peaks(b);
    ck_assert_uint_eq(mm_alloc_state_hash(a), mm_alloc_state_hash(b));
    /* two 4 MiB tensors in the 20 MiB segment, one freed: the first leaves a
     * free block before the second, the second one merged with the rest */
    int64_t p = mm_allocator_malloc(a, 4 * MiB), q = mm_allocator_malloc(a, 4 * MiB);
    int64_t r = mm_allocator_malloc(b, 4 * MiB), t = mm_allocator_malloc(b, 4 * MiB);
    ck_assert_uint_eq(mm_alloc_state_hash(a), mm_alloc_state_hash(b));
    mm_allocator_release(a, p);
    mm_allocator_release(b, t);
    ck_assert_uint_eq(mm_allocator_stats(a)->allocated, mm_allocator_stats(b)->allocated);
    ck_assert_uint_ne(mm_alloc_state_hash(a), mm_alloc_state_hash(b));
    mm_allocator_release(a, q);
    mm_allocator_release(b, r);
    ck_assert_uint_eq(mm_alloc_state_hash(a), mm_alloc_state_hash(b));
    mm_allocator_free(a);
    mm_allocator_free(b);
}
END_TEST

START_TEST(trace_replay_small)
{
    /* two 100 MiB tensors, the first freed, a 150 MiB one: as the
     * fragmentation test, now through the trace reader; the real allocator's
     * segments (S lines) are the truth it is compared with */
    const char *t = HDR
        "S 7f0000000000 104857600 0 0\n"
        "a 7f0000000000 104857600 0 1\n"
        "S 7f0010000000 104857600 0 0\n"
        "a 7f0010000000 104857600 0 1\n"
        "f 7f0000000000 104857600 0 1\n"
        "S 7f0020000000 157286400 0 0\n"
        "a 7f0020000000 157286400 0 1\n"
        "U 7f0020000000 157286400 0 1\n";
    mm_replay_result r;
    mm_error e;
    ck_assert_msg(replay(t, &r, &e) == 0, "%s", e.msg);
    ck_assert_str_eq(r.id, "t");
    ck_assert_uint_eq(r.events, 4);
    ck_assert_uint_eq(r.stats.reserved_peak, 350 * MiB);
    ck_assert_uint_eq(r.truth_reserved_peak, 350 * MiB);
    ck_assert_uint_eq(r.truth_allocated_peak, 250 * MiB);
    ck_assert_uint_eq(r.truth_segments, 3);
    ck_assert_uint_eq(r.segments_matched, 3);
}
END_TEST

START_TEST(trace_errors_name_file_and_line)
{
    static const struct {
        const char *in, *want;
    } bad[] = {
        {"hello\n", "t.trace:1: not an mmguard-alloc-trace/1 file"},
        {"# mmguard-alloc-trace/1 {nope\n", "t.trace:1: header: malformed JSON"},
        {"# mmguard-alloc-trace/1 {\"alloc_conf\": \"max_split_size_mb:1\"}\n",
         "t.trace:1: header: alloc_conf: max_split_size_mb"},
        {HDR "a 10 512 0 0\nx 10 512 0 0\n", "t.trace:3: expected 'CODE ADDR SIZE STREAM DT'"},
        {HDR "a 10 512 0\n", "t.trace:2: expected"},
        {HDR "a 10 -512 0 0\n", "t.trace:2: expected"},
        {HDR "f 10 512 0 0\n", "t.trace:2: free of 10: no such allocation"},
        {HDR "a 10 512 0 0\na 10 512 0 0\n", "t.trace:3: alloc at 10: address already"},
        {HDR "a 10 512 7 0\n", "t.trace:2: stream 7: only single-stream"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mm_replay_result r;
        mm_error e;
        ck_assert_int_eq(replay(bad[i].in, &r, &e), -1);
        ck_assert_msg(strstr(e.msg, bad[i].want), "case %zu: got '%s'", i, e.msg);
    }
    mm_replay_result r;
    mm_error e;
    ck_assert_int_eq(mm_alloc_replay_buffer("", 0, "t.trace", NULL, 0, 0, &r, &e), -1);
    ck_assert_ptr_nonnull(strstr(e.msg, "empty trace"));
    ck_assert_int_eq(mm_alloc_replay_file("/nonexistent/t", NULL, 0, 0, &r, &e), -1);
    ck_assert_ptr_nonnull(strstr(e.msg, "/nonexistent/t"));
}
END_TEST

Suite *alloc_suite(void)
{
    Suite *s = suite_create("alloc");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, round_size_rules);
    tcase_add_test(tc, small_requests_share_2mib_segments);
    tcase_add_test(tc, mid_requests_share_20mib_segments);
    tcase_add_test(tc, large_rounding_and_no_split_under_1mib);
    tcase_add_test(tc, fragmentation_and_best_fit);
    tcase_add_test(tc, best_fit_within_a_size_class);
    tcase_add_test(tc, max_split_size);
    tcase_add_test(tc, capacity_retry_and_oom);
    tcase_add_test(tc, run_matches_malloc_and_release);
    tcase_add_test(tc, inactive_split_derived_as_kept);
    tcase_add_test(tc, empty_cache_releases_unsplit);
    tcase_add_test(tc, expandable_segments_map_pages);
    tcase_add_test(tc, conf_parse);
    tcase_add_test(tc, conf_errors_name_the_key);
    tcase_add_test(tc, trace_replay_small);
    tcase_add_test(tc, trace_errors_name_file_and_line);
    tcase_add_test(tc, state_hash_what_a_fold_keeps);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- the predictor's reserved peak (reserve.c) ----------------------------------------- */

START_TEST(reserved_peak_in_prediction)
{
    static const char *const names[] = {"llava-1.5-7b-pretrain", "llava-1.5-7b-lora",
                                        "llava-1.5-7b-finetune"};
    for (size_t i = 0; i < 3; i++) {
        mm_spec *s = unit_preset(names[i]);
        mm_error e;
        ck_assert_int_eq(mm_spec_set(s, "training.data_parallel=1", &e), 0);
        mm_prediction p;
        ck_assert_msg(mm_predict(s, &p, &e) == 0, "%s", e.msg);
        /* reserved holds what is allocated, plus rounding and cached blocks */
        ck_assert_uint_ge(p.reserved_peak_bytes, p.allocated_peak_bytes);
        ck_assert_uint_eq(p.allocator_slack, p.reserved_peak_bytes - p.allocated_peak_bytes);
        /* device level = reserved + context at N = 1 (no NCCL), and the same
         * through mm_peak_for_dp at the spec's N */
        ck_assert_uint_eq(p.peak_bytes, p.reserved_peak_bytes + p.overheads.cuda_context);
        ck_assert_uint_eq(mm_peak_for_dp(&p, 1), p.peak_bytes);
        mm_prediction_free(&p);
        mm_spec_free(s);
    }
}
END_TEST

START_TEST(alloc_conf_key_changes_reserved)
{
    /* a checkpointed LoRA step: recomputed activations land in blocks cached
     * for other sizes, so expandable segments (no fixed-size segments) change
     * the reserved peak; max_split_size_mb too */
    mm_spec *s = unit_preset("llava-1.5-7b-lora");
    mm_error e;
    mm_prediction a, b, c;
    ck_assert_int_eq(mm_spec_set(s, "training.data_parallel=1", &e), 0);
    ck_assert_int_eq(mm_spec_set(s, "training.gradient_checkpointing=true", &e), 0);
    ck_assert_int_eq(mm_predict(s, &a, &e), 0);
    ck_assert_msg(mm_spec_set(s, "device.alloc_conf=expandable_segments:True", &e) == 0, "%s",
                  e.msg);
    ck_assert_int_eq(mm_predict(s, &b, &e), 0);
    ck_assert_msg(mm_spec_set(s, "device.alloc_conf=max_split_size_mb:64", &e) == 0, "%s", e.msg);
    ck_assert_int_eq(mm_predict(s, &c, &e), 0);
    ck_assert_uint_eq(a.allocated_peak_bytes, b.allocated_peak_bytes);
    ck_assert_uint_ne(a.reserved_peak_bytes, b.reserved_peak_bytes);
    ck_assert_uint_ne(a.reserved_peak_bytes, c.reserved_peak_bytes);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
    mm_prediction_free(&c);
    /* a bad value is refused with the key's name, and the spec is unchanged */
    ck_assert_int_eq(mm_spec_set(s, "device.alloc_conf=max_split_size_mb:5", &e), -1);
    ck_assert_msg(strstr(e.msg, "device.alloc_conf") && strstr(e.msg, "max_split_size_mb"), "%s",
                  e.msg);
    mm_spec_free(s);
}
END_TEST

Suite *reserve_suite(void)
{
    Suite *s = suite_create("reserve");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, reserved_peak_in_prediction);
    tcase_add_test(tc, alloc_conf_key_changes_reserved);
    suite_add_tcase(s, tc);
    return s;
}
