/* fuzz_outcome.c - libFuzzer: the job's record reader (spank_plugin/
 * outcome_rec.c), which slurmstepd runs as root on a file the user wrote.
 * Any input: no crash, hang or leak; an accepted record has printable
 * strings of bounded length, its enumerations among the known values, and
 * renders as one outcome line that json-c reads back. */
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "fuzz_common.h"
#include "outcome_rec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_text(const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    if (n == cap)
        FUZZ_FAIL("unterminated string");
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            FUZZ_FAIL("a control or non-ASCII byte got through");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct mmg_outcome_rec r;
    struct mmg_outcome_job j = { .job_id = 1, .uid = 2, .record_state = "ok" };
    char err[512], *line;
    json_object *o;
    if (mmg_outcome_parse((const char *)data, size, &r, err, sizeof err) != 0) {
        if (!memchr(err, '\0', sizeof err) || !err[0])
            FUZZ_FAIL("unterminated or empty error");
        return 0;
    }
    if (strcmp(r.status, "running") && strcmp(r.status, "done") && strcmp(r.status, "oom") &&
        strcmp(r.status, "error"))
        FUZZ_FAIL("unknown status accepted");
    if (r.n_absent > MMG_OUTCOME_ABSENT)
        FUZZ_FAIL("too many absent notes");
    check_text(r.device, sizeof r.device);
    check_text(r.oom_message, sizeof r.oom_message);
    check_text(r.time, sizeof r.time);
    for (size_t i = 0; i < r.n_absent; i++)
        check_text(r.absent[i], sizeof r.absent[i]);
    snprintf(j.step, sizeof j.step, "batch");
    j.rec = &r;
    line = mmg_outcome_line(&j);
    if (!line)
        FUZZ_FAIL("no outcome line");
    if (strchr(line, '\n'))
        FUZZ_FAIL("a newline in the outcome line");
    o = json_tokener_parse(line);
    if (!o)
        FUZZ_FAIL("the outcome line is not JSON");
    json_object_put(o);
    free(line);
    return 0;
}
