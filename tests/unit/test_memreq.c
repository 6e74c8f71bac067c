/* test_memreq.c - the host memory request (spank_plugin/memreq.c): Slurm
 * 22.05's size syntax (str_to_mbytes), which of --mem / --mem-per-cpu /
 * --mem-per-gpu stands (_validate_memory_options: command line and #SBATCH
 * lines over the environment, two of them fatal), the SBATCH_/SALLOC_/SLURM_
 * variables, and the evaluation shared with job_submit.lua (the "mem" cases of
 * tests/unit/request_cases.txt). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memreq.h"
#include "plugin_tests.h"
#include "unit.h"

static struct mmg_reqin in;
static struct mmg_memjob mj;
static char err[512];

#define args(...) reqin_args(&in, __VA_ARGS__)

/* ---- the table shared with job_submit.lua ------------------------------------ */

struct memcase {
    struct mmg_jobreq j;
    struct mmg_memjob m;
    struct mmg_memsite site;
    uint64_t host, ovh;
};

static uint64_t u64(const char *s)
{
    return strtoull(s, NULL, 10);
}

static int mem_field(struct memcase *c, const char *k, const char *v)
{
    if (!strcmp(k, "mpn")) { c->m.node_set = 1; c->m.mem_per_node_mb = u64(v); }
    else if (!strcmp(k, "mpc")) { c->m.cpu_set = 1; c->m.mem_per_cpu_mb = u64(v); }
    else if (!strcmp(k, "mpg")) { c->m.gpu_set = 1; c->m.mem_per_gpu_mb = u64(v); }
    else if (!strcmp(k, "cpt")) c->m.cpus_per_task = (uint32_t)u64(v);
    else if (!strcmp(k, "cpg")) c->m.cpus_per_gpu = (uint32_t)u64(v);
    else if (!strcmp(k, "mincpus")) c->m.min_cpus = (uint32_t)u64(v);
    else if (!strcmp(k, "dmn")) c->site.def_per_node = u64(v);
    else if (!strcmp(k, "dmc")) c->site.def_per_cpu = u64(v);
    else if (!strcmp(k, "dmg")) c->site.def_per_gpu = u64(v);
    else if (!strcmp(k, "node_mem")) c->site.node_mem = u64(v);
    else if (!strcmp(k, "maxgpn")) c->site.max_gpus_per_node = (uint32_t)u64(v);
    else if (!strcmp(k, "host")) c->host = u64(v);
    else if (!strcmp(k, "ovh")) c->ovh = u64(v);
    else return 0;
    return 1;
}

static void case_fields(const char *text, struct memcase *c)
{
    char *copy = strdup(text), *save = NULL;
    memset(c, 0, sizeof(*c));
    c->site.max_gpus_per_node = 8;
    c->ovh = 3221225472ull;
    for (char *kv = strtok_r(copy, " \n", &save); kv; kv = strtok_r(NULL, " \n", &save)) {
        char *eq = strchr(kv, '=');
        struct mmg_jobreq *j = &c->j;
        ck_assert_ptr_nonnull(eq);
        *eq++ = '\0';
        if (mem_field(c, kv, eq)) continue;
        if (!strcmp(kv, "tpn")) snprintf(j->tres_per_node, sizeof(j->tres_per_node), "%s", eq);
        else if (!strcmp(kv, "tpj")) snprintf(j->tres_per_job, sizeof(j->tres_per_job), "%s", eq);
        else if (!strcmp(kv, "tpt")) snprintf(j->tres_per_task, sizeof(j->tres_per_task), "%s", eq);
        else if (!strcmp(kv, "min_nodes")) j->min_nodes = (uint32_t)u64(eq);
        else if (!strcmp(kv, "max_nodes")) j->max_nodes = (uint32_t)u64(eq);
        else if (!strcmp(kv, "num_tasks")) j->num_tasks = (uint32_t)u64(eq);
        else if (!strcmp(kv, "ntpn")) j->ntasks_per_node = (uint32_t)u64(eq);
        else ck_abort_msg("unknown field %s", kv);
    }
    free(copy);
}

static const char *const kinds[] = { "node", "cpu", "gpu", "whole" };

static void run_mem_case(const struct table_case *tc)
{
    struct memcase c;
    struct mmg_gpureq g;
    struct mmg_memnode n;
    char got[512], ask[32];
    mmg_mem_status st;
    uint64_t need;

    case_fields(tc->text, &c);
    ck_assert_msg(mmg_jobreq_eval(&c.j, &g, err, sizeof(err)) == MMG_REQ_OK, "%s: %s", tc->name,
                  err);
    st = mmg_mem_eval(&c.m, &c.j, &g, &c.site, &n, err, sizeof(err));
    if (st == MMG_MEM_WHOLE) {
        snprintf(got, sizeof(got), "mem whole ranks=%u cpus=%u", n.ranks, n.cpus);
    } else {
        ck_assert_msg(st == MMG_MEM_SIZED, "%s: %s", tc->name, err);
        need = mmg_mem_need(n.ranks, c.host, c.ovh);
        mmg_mem_ask(&n, need, ask, sizeof(ask));
        snprintf(got, sizeof(got), "mem sized kind=%s default=%s ranks=%u cpus=%u have=%llu "
                 "need=%llu fits=%s ask=%s", kinds[n.kind], n.from_default ? "yes" : "no", n.ranks,
                 n.cpus, (unsigned long long)n.have_bytes, (unsigned long long)need,
                 need <= n.have_bytes ? "yes" : "no", ask);
    }
    ck_assert_msg(!strcmp(got, tc->expect), "%s:\n got '%s'\nwant '%s'", tc->name, got,
                  tc->expect);
}

START_TEST(shared_mem_cases)
{
    struct table_case *cases = NULL;
    size_t n = table_load(SRCDIR "/tests/unit/request_cases.txt", &cases), k = 0;
    for (size_t i = 0; i < n; i++)
        if (!strncmp(cases[i].expect, "mem ", 4)) {
            run_mem_case(&cases[i]);
            k++;
        }
    ck_assert_uint_ge(k, 15);
    table_free(cases, n);
}
END_TEST

/* ---- str_to_mbytes ----------------------------------------------------------------- */

START_TEST(sizes)
{
    static const struct { const char *s; long long mb; } t[] = {
        { "4096", 4096 }, { "64G", 65536 }, { "64g", 65536 }, { "64GB", 65536 },
        { "64Gb", 65536 }, { "1T", 1048576 }, { "512M", 512 }, { "512mb", 512 },
        { "1K", 1 }, { "1025K", 2 }, { "1024k", 1 }, { " 8G", 8192 }, { "+8G", 8192 },
        { "0", 0 }, { "-0", 0 },
        { "", -1 }, { "G", -1 }, { "-1", -1 }, { "8 G", -1 }, { "8GiB", -1 }, { "8P", -1 },
        { "1.5G", -1 }, { "8GBB", -1 }, { "99999999999999999999", -1 },
        { "9007199254740992T", -1 }, { "9223372036854775807K", -1 },
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        uint64_t mb = 12345;
        int rc = mmg_str_to_mbytes(t[i].s, &mb);
        if (t[i].mb < 0)
            ck_assert_msg(rc == -1, "'%s' accepted (%llu)", t[i].s, (unsigned long long)mb);
        else
            ck_assert_msg(rc == 0 && mb == (uint64_t)t[i].mb, "'%s': rc %d, %llu", t[i].s, rc,
                          (unsigned long long)mb);
    }
}
END_TEST

/* ---- which option stands ----------------------------------------------------------------- */

static int to_mem(void)
{
    return mmg_reqin_to_mem(&in, &mj, err, sizeof(err));
}

START_TEST(options)
{
    char *env[] = { (char *)"SBATCH_MEM_PER_CPU=2G", (char *)"SALLOC_MEM_PER_NODE=9G", NULL };
    static const char script[] = "#!/bin/sh\n#SBATCH --mem=100G\n#SBATCH -c 4\ntrue\n";

    args(MMG_TOOL_SBATCH, "sbatch", "--mem", "64G", "-c8", "--cpus-per-gpu=6", "--mincpus=3",
         "x.sh", NULL);
    ck_assert_int_eq(to_mem(), 0);
    ck_assert(mj.node_set && !mj.cpu_set && !mj.gpu_set);
    ck_assert_uint_eq(mj.mem_per_node_mb, 65536);
    ck_assert_uint_eq(mj.cpus_per_task, 8);
    ck_assert_uint_eq(mj.cpus_per_gpu, 6);
    ck_assert_uint_eq(mj.min_cpus, 3);
    ck_assert_str_eq(mj.src->spelled, "--mem");
    /* abbreviations: --mem-per-g is --mem-per-gpu, --mem is exact */
    args(MMG_TOOL_SBATCH, "sbatch", "--mem-per-g=40G", NULL);
    ck_assert_int_eq(to_mem(), 0);
    ck_assert(mj.gpu_set);
    ck_assert_uint_eq(mj.mem_per_gpu_mb, 40960);
    /* the environment: SBATCH_* for sbatch, SALLOC_* are salloc's */
    mmg_reqin_init(&in, MMG_TOOL_SBATCH);
    mmg_env_apply(&in, env);
    ck_assert_int_eq(to_mem(), 0);
    ck_assert(mj.cpu_set && !mj.node_set);
    ck_assert_uint_eq(mj.mem_per_cpu_mb, 2048);
    ck_assert_str_eq(mj.src->spelled, "SBATCH_MEM_PER_CPU");
    /* an #SBATCH line counts as the command line: it resets the variable */
    mmg_reqin_init(&in, MMG_TOOL_SBATCH);
    mmg_script_apply(&in, script, strlen(script));
    mmg_env_apply(&in, env);
    ck_assert_int_eq(to_mem(), 0);
    ck_assert(mj.node_set && !mj.cpu_set);
    ck_assert_uint_eq(mj.mem_per_node_mb, 102400);
    ck_assert_uint_eq(mj.src->line, 2);
    ck_assert_uint_eq(mj.cpus_per_task, 4);
    /* the same option: the variable overrides the #SBATCH line */
    {
        char *e2[] = { (char *)"SBATCH_MEM_PER_NODE=50G", NULL };
        mmg_reqin_init(&in, MMG_TOOL_SBATCH);
        mmg_script_apply(&in, script, strlen(script));
        mmg_env_apply(&in, e2);
        ck_assert_int_eq(to_mem(), 0);
        ck_assert_uint_eq(mj.mem_per_node_mb, 51200);
        ck_assert_str_eq(mj.src->spelled, "SBATCH_MEM_PER_NODE");
    }
    /* srun reads SLURM_MEM_PER_NODE (what a batch job exports) */
    {
        char *e3[] = { (char *)"SLURM_MEM_PER_NODE=4096", (char *)"SRUN_CPUS_PER_TASK=2",
                       (char *)"SBATCH_MEM_PER_GPU=1G", NULL };
        mmg_reqin_init(&in, MMG_TOOL_SRUN);
        mmg_env_apply(&in, e3);
        ck_assert_int_eq(to_mem(), 0);
        ck_assert(mj.node_set);
        ck_assert_uint_eq(mj.mem_per_node_mb, 4096);
        ck_assert_uint_eq(mj.cpus_per_task, 2);
    }
    /* no memory option at all */
    args(MMG_TOOL_SALLOC, "salloc", "--gres=gpu:1", NULL);
    ck_assert_int_eq(to_mem(), 0);
    ck_assert(!mj.node_set && !mj.cpu_set && !mj.gpu_set && mj.src == NULL);
}
END_TEST

START_TEST(exclusions_and_bad_values)
{
    char *env[] = { (char *)"SBATCH_MEM_PER_CPU=2G", (char *)"SBATCH_MEM_PER_GPU=8G", NULL };
    /* two on the command line: sbatch's fatal */
    args(MMG_TOOL_SBATCH, "sbatch", "--mem=1G", "--mem-per-cpu=1G", NULL);
    ck_assert_int_eq(to_mem(), -1);
    ck_assert_str_eq(err, "--mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive");
    /* two in the environment, none on the command line */
    mmg_reqin_init(&in, MMG_TOOL_SBATCH);
    mmg_env_apply(&in, env);
    ck_assert_int_eq(to_mem(), -1);
    ck_assert_str_eq(err, "SBATCH_MEM_PER_CPU, SBATCH_MEM_PER_GPU, and SBATCH_MEM_PER_NODE are "
                          "mutually exclusive");
    /* ... unless one is given on the command line, which resets the others */
    {
        char *av[] = { (char *)"sbatch", (char *)"--mem-per-gpu=16G", NULL };
        mmg_args_apply(&in, 2, av, MMG_FROM_ARGS, NULL);
        ck_assert_int_eq(to_mem(), 0);
        ck_assert(mj.gpu_set && !mj.cpu_set);
        ck_assert_uint_eq(mj.mem_per_gpu_mb, 16384);
    }
    /* values Slurm refuses */
    args(MMG_TOOL_SBATCH, "sbatch", "--mem=64GiB", NULL);
    ck_assert_int_eq(to_mem(), -1);
    ck_assert_str_eq(err, "--mem=64GiB: cannot read this value");
    args(MMG_TOOL_SBATCH, "sbatch", "-c", "0", "--mem=1G", NULL);
    ck_assert_int_eq(to_mem(), -1);
    ck_assert_str_eq(err, "--cpus-per-task=0: cannot read this value");
}
END_TEST

/* ---- the need and the ask --------------------------------------------------------- */

START_TEST(need_and_ask)
{
    struct mmg_memnode n;
    char out[32];
    memset(&n, 0, sizeof(n));
    ck_assert_uint_eq(mmg_mem_need(4, 10, 1), 44);
    ck_assert_uint_eq(mmg_mem_need(2, UINT64_MAX, 1), UINT64_MAX);
    ck_assert_uint_eq(mmg_mem_need(3, UINT64_MAX / 2, 0), UINT64_MAX);
    n.kind = MMG_MEMK_NODE;
    ck_assert_uint_eq(mmg_mem_ask(&n, 1024ull * MMG_MB, out, sizeof(out)), 1024);
    ck_assert_str_eq(out, "1G");
    ck_assert_uint_eq(mmg_mem_ask(&n, 1024ull * MMG_MB + 1, out, sizeof(out)), 2048);
    ck_assert_str_eq(out, "2G");
    ck_assert_uint_eq(mmg_mem_ask(&n, 1023ull * MMG_MB, out, sizeof(out)), 1023);
    ck_assert_str_eq(out, "1023M");
    n.kind = MMG_MEMK_GPU;
    n.ranks = 8;
    mmg_mem_ask(&n, 80ull << 30, out, sizeof(out));
    ck_assert_str_eq(out, "10G");
    n.from_default = 1; /* a default is asked back as --mem, per node */
    mmg_mem_ask(&n, 80ull << 30, out, sizeof(out));
    ck_assert_str_eq(out, "80G");
}
END_TEST

TCase *memreq_tcase(void)
{
    TCase *tc = tcase_create("memreq");
    tcase_add_test(tc, shared_mem_cases);
    tcase_add_test(tc, sizes);
    tcase_add_test(tc, options);
    tcase_add_test(tc, exclusions_and_bad_values);
    tcase_add_test(tc, need_and_ask);
    return tc;
}
