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
#include "request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The next NUL-terminated part of the input (malloc'd), or "" at the end. */
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

/* "a\nb\nc" -> {"a","b","c",NULL} pointing into s (argv[0] first when given). */
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
    static const mmg_tool tools[] = { MMG_TOOL_SBATCH, MMG_TOOL_SALLOC, MMG_TOOL_SRUN };
    struct mmg_reqin *r;
    char *script, *env, *args, *job, **envp, **argv;
    int nenv, nargs;
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
    job = part(&data, &size);
    envp = lines(env, NULL, &nenv);
    argv = lines(args, mmg_tool_name(r->tool), &nargs);
    (void)mmg_script_apply(r, script, strlen(script));
    mmg_env_apply(r, envp);
    (void)mmg_args_apply(r, nargs, argv, MMG_FROM_ARGS, NULL);
    (void)mmg_alloc_apply(r, job);
    (void)mmg_hostlist_count(args);
    use_request(r);
    free(envp);
    free(argv);
    free(script);
    free(env);
    free(args);
    free(job);
    free(r);
    return 0;
}
