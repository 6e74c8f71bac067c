/* fuzz_memreq.c - libFuzzer: the host memory request reader (spank_plugin/
 * memreq.c) on top of the GPU request readers it shares options with.  The
 * input is split at NUL bytes into: a tool selector byte, a batch script, an
 * environment block ('\n'-separated NAME=value), a command line
 * ('\n'-separated arguments) and the site (def_mem_per_node, _cpu, _gpu,
 * node_mem, max_gpus_per_node, host bytes per process, host_overhead as
 * decimal numbers).  Contracts: no crash, hang or leak; every message
 * terminated; a sized node has at least one GPU process and one CPU and at
 * most 2^53 - 1 bytes; the size mmg_mem_ask() suggests holds the need. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "fuzz_split.h"
#include "memreq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The site and the prediction from decimal numbers (bounded as mmguard.conf is). */
static void site_of(const char *s, struct mmg_memsite *site, uint64_t *host, uint64_t *ovh)
{
    uint64_t v[7] = { 0, 0, 0, 0, 8, 0, 3ull << 30 };
    char *end;
    for (int i = 0; i < 7 && *s; i++, s = end) {
        v[i] = strtoull(s, &end, 10) & ((1ull << 53) - 1);
        if (end == s)
            break;
    }
    site->def_per_node = v[0];
    site->def_per_cpu = v[1];
    site->def_per_gpu = v[2];
    site->node_mem = v[3];
    site->max_gpus_per_node = (uint32_t)(v[4] % 1025);
    *host = v[5] >> 10;
    *ovh = v[6] >> 10;
}

static void use(struct mmg_reqin *r, const char *sitetext)
{
    struct mmg_jobreq j;
    struct mmg_gpureq g;
    struct mmg_memjob m;
    struct mmg_memsite site;
    struct mmg_memnode node;
    char why[512], ask[32];
    uint64_t host, ovh, need, mb, div;

    if (mmg_reqin_to_mem(r, &m, why, sizeof why) != 0) {
        if (!memchr(why, '\0', sizeof why) || !why[0])
            FUZZ_FAIL("refused without a terminated message");
        return;
    }
    if (mmg_reqin_to_job(r, &j) != 0 || mmg_jobreq_eval(&j, &g, why, sizeof why) != MMG_REQ_OK)
        return;
    site_of(sitetext, &site, &host, &ovh);
    if (mmg_mem_eval(&m, &j, &g, &site, &node, why, sizeof why) != MMG_MEM_SIZED)
        return;
    if (node.ranks == 0 || node.cpus == 0 || node.have_bytes > (1ull << 53) - 1)
        FUZZ_FAIL("inconsistent node");
    need = mmg_mem_need(node.ranks, host, ovh);
    if (need > (1ull << 53))
        return;
    mb = mmg_mem_ask(&node, need, ask, sizeof ask);
    if (!memchr(ask, '\0', sizeof ask))
        FUZZ_FAIL("unterminated ask");
    div = node.from_default ? 1 : node.kind == MMG_MEMK_CPU ? node.cpus
        : node.kind == MMG_MEMK_GPU ? node.ranks : 1;
    if (mb * MMG_MB * div < need)
        FUZZ_FAIL("the suggested size does not hold the need");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_input in;
    uint64_t mb;
    if (size < 1 || size > 65536)
        return 0;
    fuzz_input_read(&in, data, size);
    for (int i = 0; i < in.nargs; i++)
        if (mmg_str_to_mbytes(in.argv[i], &mb) == 0 && mb > (uint64_t)INT64_MAX)
            FUZZ_FAIL("a size beyond what strtoll reads");
    use(in.r, in.last); /* the last part: the site */
    fuzz_input_free(&in);
    return 0;
}
