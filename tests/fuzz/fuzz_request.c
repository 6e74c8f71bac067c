/* fuzz_request.c - libFuzzer: every reader of the GPU request (spank_plugin/
 * request.c, walk.c, script.c, reqtext.c, jobinfo.c; Slurm-free).  The input
 * is split at NUL bytes into: a tool selector byte, a batch script, an
 * environment block ('\n'-separated NAME=value), a command line
 * ('\n'-separated arguments) and an `scontrol show job` record.  Then the
 * request is rebuilt, evaluated and written in the user's terms.  Contracts:
 * no crash, hang or leak; every string terminated; totals consistent. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "fuzz_split.h"
#include "request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_str(const char *s, size_t n)
{
    if (!memchr(s, '\0', n))
        FUZZ_FAIL("unterminated string");
}

static void use_request(struct mmg_reqin *r)
{
    struct mmg_jobreq j;
    struct mmg_gpureq g;
    char why[512], out[600];
    check_str(r->error, sizeof r->error);
    if (mmg_reqin_to_job(r, &j) != 0)
        return;
    check_str(j.tres_per_node, sizeof j.tres_per_node);
    if (mmg_jobreq_eval(&j, &g, why, sizeof why) != MMG_REQ_OK) {
        check_str(why, sizeof why);
        return;
    }
    if (g.gpus_min == 0 || g.gpus_min > MMG_REQ_MAX_GPUS || g.nodes_min > g.nodes_max ||
        mmg_gpureq_total(&g, g.nodes_min) != g.gpus_min)
        FUZZ_FAIL("inconsistent request");
    mmg_request_describe(r, &g, out, sizeof out);
    check_str(out, sizeof out);
    for (uint32_t want = 1; want <= 17; want += 8) {
        uint32_t got = mmg_request_spell(r, &g, want, want > 8 ? "h200" : "", 8, out, sizeof out);
        if (got && got < want)
            FUZZ_FAIL("spelled fewer GPUs than asked");
        check_str(out, sizeof out);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_input in;
    if (size < 1 || size > 65536)
        return 0;
    fuzz_input_read(&in, data, size);
    (void)mmg_alloc_apply(in.r, in.last); /* the last part: an scontrol record */
    (void)mmg_hostlist_count(in.args);
    use_request(in.r);
    fuzz_input_free(&in);
    return 0;
}
