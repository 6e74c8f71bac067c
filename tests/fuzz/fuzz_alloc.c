/* fuzz_alloc.c - libFuzzer: the allocator trace reader (mm_alloc_replay_buffer)
 * and the PYTORCH_CUDA_ALLOC_CONF parser (mm_alloc_conf_parse).  Checks, beyond
 * "no crash, no leak": the first input line is tried as an alloc_conf; a
 * replay that succeeds has a model whose peaks are consistent (reserved >=
 * allocated >= requested, no more segments matched than exist); errors are
 * terminated strings. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_conf(const uint8_t *data, size_t size)
{
    size_t n = 0;
    while (n < size && n < 512 && data[n] != '\n')
        n++;
    char s[513];
    memcpy(s, data, n);
    s[n] = '\0';
    mm_alloc_conf c;
    mm_error e;
    mm_alloc_conf_default(&c);
    if (mm_alloc_conf_parse(&c, s, &e) == 0) {
        if (c.max_split_size < 20ull * 1024 * 1024 || c.max_non_split_rounding < 20ull << 20)
            FUZZ_FAIL("contract at this line");
        if (c.gc_threshold < 0 || c.gc_threshold >= 1)
            FUZZ_FAIL("contract at this line");
    } else {
        fuzz_check_error(&e);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    fuzz_conf(data, size);
    mm_replay_result r;
    mm_error e;
    static const unsigned flags[] = {MM_REPLAY_CONF_FROM_TRACE | MM_REPLAY_TRACE_ADDRESSES, 0};
    for (size_t k = 0; k < 2; k++) {
        /* a capacity too, so the out-of-memory path of the model is reached */
        uint64_t cap = k ? (64ull << 20) : 0;
        if (mm_alloc_replay_buffer((const char *)data, size, "fuzz.trace", NULL, flags[k], cap,
                                   &r, &e) == 0) {
            const mm_alloc_stats *s = &r.stats;
            if (s->allocated_peak < s->requested_peak && s->requested_peak > 0 &&
                s->allocated_peak != UINT64_MAX)
                FUZZ_FAIL("contract at this line");
            if (s->reserved_peak < s->allocated_peak && s->allocated_peak != UINT64_MAX)
                FUZZ_FAIL("contract at this line");
            if (r.segments_matched > r.truth_segments || !memchr(r.id, '\0', sizeof r.id))
                FUZZ_FAIL("contract at this line");
        } else {
            fuzz_check_error(&e);
        }
    }
    return 0;
}
