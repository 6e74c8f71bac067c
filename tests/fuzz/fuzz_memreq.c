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
#include "memreq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *part(const uint8_t **d, size_t *n)
{
    const uint8_t *nul = memchr(*d, '\0', *n);
    size_t len = nul ? (size_t)(nul - *d) : *n;
    char *s = malloc(len + 1);
    if (!s)
        FUZZ_FAIL("out of memory");
    memcpy(s, *d, len);
    s[len] = '\0';
    *d += len + (nul != NULL);
    *n -= len + (nul != NULL);
    return s;
}

static char **lines(char *s, const char *first, int *count)
{
    size_t n = 2;
    for (char *p = s; *p; p++)
        n += *p == '\n';
    char **v = calloc(n + 1, sizeof *v);
    int k = 0;
    if (!v)
        FUZZ_FAIL("out of memory");
    if (first)
        v[k++] = (char *)first;
    for (char *p = s, *nl; p && *p; p = nl) {
        nl = strchr(p, '\n');
        if (nl)
            *nl++ = '\0';
        v[k++] = p;
    }
    *count = k;
    return v;
}

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
    static const mmg_tool tools[] = { MMG_TOOL_SBATCH, MMG_TOOL_SALLOC, MMG_TOOL_SRUN };
    struct mmg_reqin *r;
    char *script, *env, *args, *site, **envp, **argv;
    int nenv, nargs;
    uint64_t mb;
    if (size < 1 || size > 65536)
        return 0;
    r = malloc(sizeof *r);
    if (!r)
        FUZZ_FAIL("out of memory");
    mmg_reqin_init(r, tools[data[0] % 3]);
    data++;
    size--;
    script = part(&data, &size);
    env = part(&data, &size);
    args = part(&data, &size);
    site = part(&data, &size);
    envp = lines(env, NULL, &nenv);
    argv = lines(args, mmg_tool_name(r->tool), &nargs);
    (void)mmg_script_apply(r, script, strlen(script));
    mmg_env_apply(r, envp);
    (void)mmg_args_apply(r, nargs, argv, MMG_FROM_ARGS, NULL);
    for (int i = 0; i < nargs; i++)
        if (mmg_str_to_mbytes(argv[i], &mb) == 0 && mb > (uint64_t)INT64_MAX)
            FUZZ_FAIL("a size beyond what strtoll reads");
    use(r, site);
    free(envp);
    free(argv);
    free(script);
    free(env);
    free(args);
    free(site);
    free(r);
    return 0;
}
