/* fuzz_size.c - libFuzzer: mm_parse_size / mm_parse_margin / mm_usable_bytes /
 * mm_format_bytes.  Checks, beyond "no crash": a parsed size re-parses from
 * its exact decimal form to the same value; margin percent is in [0, 100);
 * usable bytes never exceed the GPU memory. */
#include <inttypes.h>
#include <stdio.h>

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    char *s = malloc(size + 1);
    if (!s)
        FUZZ_FAIL("contract at this line");
    memcpy(s, data, size);
    s[size] = '\0';
    mm_error e;
    uint64_t b = 0;
    if (mm_parse_size(s, &b, &e) == 0) {
        char dec[32];
        uint64_t b2 = 0;
        snprintf(dec, sizeof dec, "%" PRIu64, b);
        if (mm_parse_size(dec, &b2, &e) != 0 || b2 != b)
            FUZZ_FAIL("contract at this line");
        char fb[32];
        mm_format_bytes(b, fb, sizeof fb);
        mm_format_bytes(b, fb, 4); /* truncation must terminate */
        if (!memchr(fb, '\0', 4))
            FUZZ_FAIL("contract at this line");
    } else {
        fuzz_check_error(&e);
    }
    mm_margin m;
    if (mm_parse_margin(s, &m, &e) == 0) {
        if (!(m.percent >= 0.0 && m.percent < 100.0))
            FUZZ_FAIL("contract at this line");
        static const uint64_t mems[] = {0, 1, 81559ull << 20, UINT64_MAX};
        for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
            if (mm_usable_bytes(mems[i], &m) > mems[i])
                FUZZ_FAIL("contract at this line");
    } else {
        fuzz_check_error(&e);
    }
    /* NULL error pointers are allowed by the API */
    (void)mm_parse_size(s, &b, NULL);
    (void)mm_parse_margin(s, &m, NULL);
    free(s);
    return 0;
}
