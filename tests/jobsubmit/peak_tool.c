/* peak_tool.c - the C side of `make check-jobsubmit-peak`: for each spec (at
 * its own data-parallel degree and at 1, each replayed at N = 1..COVER too)
 * the MMGUARD record the plugin would publish (record.c), then its
 * mm_peak_for_dp() for every N = 1..4096 ("-": not covered); or the same for
 * a record taken from a real job.  tests/jobsubmit/peak_check.lua holds
 * job_submit.lua's peak(N) of the record against each line.
 *
 *   peak_tool spec FILE...     predictions of these specs
 *   peak_tool record TEXT      a published MMGUARD value
 * Output: "v=4 ..." record lines, each followed by "N<TAB>PEAK" lines. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "mmguard.h"
#include "record.h"

#define MAX_N 4096
#define COVER 64

static void emit(const struct mmg_record *r)
{
    char text[MMG_RECORD_MAX + 1];
    if (mmg_record_format(r, text, sizeof(text)) != 0) {
        fprintf(stderr, "peak_tool: record too long\n");
        return;
    }
    printf("%s\n", text);
    for (uint32_t n = 1; n <= MAX_N; n++) {
        uint64_t pk = mmg_record_peak_for_dp(r, n);
        if (pk == MM_PEAK_UNKNOWN)
            printf("%" PRIu32 "\t-\n", n);
        else
            printf("%" PRIu32 "\t%" PRIu64 "\n", n, pk);
    }
}

static int from_spec(const char *path, const char *set)
{
    mm_error e;
    mm_prediction p;
    struct mmg_record r;
    uint32_t ns[COVER];
    mm_spec *spec = mm_spec_load_file(path, &e);
    for (uint32_t i = 0; i < COVER; i++)
        ns[i] = i + 1;
    if (!spec || (set && mm_spec_set(spec, set, &e) != 0) || mm_predict(spec, &p, &e) != 0 ||
        mm_dp_cover(spec, &p, ns, COVER, &e) != 0) {
        fprintf(stderr, "peak_tool: %s: %s\n", path, e.msg);
        if (spec)
            mm_spec_free(spec);
        return -1;
    }
    memset(&r, 0, sizeof(r));
    snprintf(r.decision, sizeof(r.decision), "accept");
    mmg_record_set_model(&r, &p);
    emit(&r);
    mm_prediction_free(&p);
    mm_spec_free(spec);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = 0;
    if (argc >= 3 && !strcmp(argv[1], "record")) {
        struct mmg_record r;
        char err[256];
        if (mmg_record_parse(argv[2], &r, err, sizeof(err)) != 0 || !r.has_model) {
            fprintf(stderr, "peak_tool: %s\n", r.has_model ? err : "no peak model in the record");
            return 1;
        }
        emit(&r);
        return 0;
    }
    if (argc < 3 || strcmp(argv[1], "spec") != 0) {
        fprintf(stderr, "usage: peak_tool spec FILE... | peak_tool record TEXT\n");
        return 2;
    }
    for (int i = 2; i < argc; i++)
        rc |= from_spec(argv[i], NULL) | from_spec(argv[i], "training.data_parallel=1");
    return rc ? 1 : 0;
}
