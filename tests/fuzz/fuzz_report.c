/* fuzz_report.c - libFuzzer: `mmguard report`'s reader (predictor/api/
 * report.c) and its outcome part (loop.c), on decision logs anyone who can
 * submit a job can append to.  Any input, split into lines: no crash, hang or
 * leak; the JSON summary (outcomes joined, margin advice) is valid JSON and
 * the text summary is built. */
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "fuzz_common.h"
#include "report.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mm_report *r = mm_report_new();
    const char *p = (const char *)data, *end = p + size;
    unsigned long line = 0;
    char *json, *text;
    json_object *o;
    if (!r)
        FUZZ_FAIL("out of memory");
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (mm_report_add_line(r, "fuzz", ++line, p, len) == -2)
            FUZZ_FAIL("out of memory on a line");
        p += len + (nl ? 1 : 0);
    }
    json = mm_report_json(r, 3, 0);
    if (!json)
        FUZZ_FAIL("no JSON summary");
    o = json_tokener_parse(json);
    if (!o)
        FUZZ_FAIL("the JSON summary is not JSON");
    json_object_put(o);
    text = mm_report_text(r, 3);
    if (!text)
        FUZZ_FAIL("no text summary");
    free(json);
    free(text);
    mm_report_free(r);
    return 0;
}
