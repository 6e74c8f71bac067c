/* test_request.c - the job's GPU request as the plugin rebuilds it
 * (spank_plugin/request.c, walk.c, script.c, reqtext.c, jobinfo.c): Slurm's
 * option syntax and precedence, #SBATCH lines, input variables, sbatch's
 * node/task rules, and the evaluation shared with job_submit.lua
 * (tests/unit/request_cases.txt). */
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin_tests.h"
#include "request.h"
#include "unit.h"

static struct mmg_reqin in;
static struct mmg_jobreq job;
static struct mmg_gpureq g;
static char why[512];

int reqin_args(struct mmg_reqin *r, mmg_tool tool, const char *a0, ...)
{
    char *av[32];
    int ac = 0;
    va_list ap;
    va_start(ap, a0);
    for (const char *a = a0; a && ac < 31; a = va_arg(ap, const char *))
        av[ac++] = (char *)a;
    va_end(ap);
    av[ac] = NULL;
    mmg_reqin_init(r, tool);
    return mmg_args_apply(r, ac, av, MMG_FROM_ARGS, NULL);
}

#define args(...) reqin_args(&in, __VA_ARGS__)

static mmg_req_status eval(void)
{
    ck_assert_msg(mmg_reqin_to_job(&in, &job) == 0, "to_job: %s", in.error);
    return mmg_jobreq_eval(&job, &g, why, sizeof(why));
}

#define OPT(id) (in.o[id].set ? in.o[id].value : "<unset>")

/* ---- the table shared with job_submit.lua -------------------------------- */

static void fields(const char *text, struct mmg_jobreq *j)
{
    char *copy = strdup(text), *save = NULL;
    memset(j, 0, sizeof(*j));
    for (char *kv = strtok_r(copy, " \n", &save); kv; kv = strtok_r(NULL, " \n", &save)) {
        char *eq = strchr(kv, '=');
        ck_assert_ptr_nonnull(eq);
        *eq++ = '\0';
        if (!strcmp(kv, "tpn")) snprintf(j->tres_per_node, sizeof(j->tres_per_node), "%s", eq);
        else if (!strcmp(kv, "tpj")) snprintf(j->tres_per_job, sizeof(j->tres_per_job), "%s", eq);
        else if (!strcmp(kv, "tpt")) snprintf(j->tres_per_task, sizeof(j->tres_per_task), "%s", eq);
        else if (!strcmp(kv, "tps")) snprintf(j->tres_per_socket, sizeof(j->tres_per_socket), "%s", eq);
        else if (!strcmp(kv, "min_nodes")) j->min_nodes = (uint32_t)atoi(eq);
        else if (!strcmp(kv, "max_nodes")) j->max_nodes = (uint32_t)atoi(eq);
        else if (!strcmp(kv, "num_tasks")) j->num_tasks = (uint32_t)atoi(eq);
        else if (!strcmp(kv, "ntpn")) j->ntasks_per_node = (uint32_t)atoi(eq);
        else ck_abort_msg("unknown field %s", kv);
    }
    free(copy);
}

START_TEST(shared_cases)
{
    struct table_case *cases = NULL;
    size_t n = table_load(SRCDIR "/tests/unit/request_cases.txt", &cases);
    ck_assert_uint_ge(n, 20);
    for (size_t i = 0; i < n; i++) {
        const struct table_case *tc = &cases[i];
        char got[256];
        mmg_req_status st;
        if (!strncmp(tc->expect, "mem ", 4))
            continue; /* host memory: test_memreq.c */
        fields(tc->text, &job);
        st = mmg_jobreq_eval(&job, &g, why, sizeof(why));
        if (st == MMG_REQ_OK)
            snprintf(got, sizeof(got), "ok gpus=%u type=%s nodes=%u-%u", g.gpus_min, g.type,
                     g.nodes_min, g.nodes_max);
        else
            snprintf(got, sizeof(got), "%s", st == MMG_REQ_NONE ? "none" : "unknown");
        if (st == MMG_REQ_UNKNOWN) {
            ck_assert_msg(!strncmp(tc->expect, "unknown ", 8), "%s: unknown (%s)", tc->name, why);
            ck_assert_msg(!strncmp(why, tc->expect + 8, strlen(tc->expect + 8)),
                          "%s: '%s', want '%s...'", tc->name, why, tc->expect + 8);
        } else {
            ck_assert_msg(!strcmp(got, tc->expect), "%s: '%s', want '%s'", tc->name, got,
                          tc->expect);
        }
    }
    table_free(cases, n);
}
END_TEST

/* ---- the command line ------------------------------------------------------- */

START_TEST(option_syntax)
{
    /* --name=value, --name value, short with and without a blank, clusters */
    ck_assert_int_eq(args(MMG_TOOL_SBATCH, "sbatch", "--gres=gpu:2", "-N", "2", "-vn4", "-Gh100:1",
                          "train.sh", "--gres=gpu:8", NULL), 6);
    ck_assert_str_eq(OPT(MMG_O_GRES), "gpu:2");
    ck_assert_str_eq(OPT(MMG_O_NODES), "2");
    ck_assert_str_eq(OPT(MMG_O_NTASKS), "4");
    ck_assert_str_eq(OPT(MMG_O_GPUS), "h100:1");
    ck_assert_str_eq(in.o[MMG_O_GPUS].spelled, "--gpus");
    /* an option's value is not an option: -J --gres=gpu:4 names the job */
    args(MMG_TOOL_SBATCH, "sbatch", "-J", "--gres=gpu:4", "x.sh", NULL);
    ck_assert(!in.o[MMG_O_GRES].set);
    /* abbreviations stand for the option, which later wins */
    args(MMG_TOOL_SBATCH, "sbatch", "--gpus-per-n=2", "--gpus-per-node", "3", NULL);
    ck_assert_str_eq(OPT(MMG_O_GPUS_PER_NODE), "3");
    ck_assert_str_eq(in.o[MMG_O_GPUS_PER_NODE].spelled, "--gpus-per-node");
    /* --tasks-per-node is --ntasks-per-node */
    args(MMG_TOOL_SRUN, "srun", "--tasks-per-node=2", "python", "-N", "9", NULL);
    ck_assert_str_eq(OPT(MMG_O_NTASKS_PER_NODE), "2");
    ck_assert(!in.o[MMG_O_NODES].set); /* after the command: its own argument */
    /* "--" ends the options */
    ck_assert_int_eq(args(MMG_TOOL_SRUN, "srun", "-n2", "--", "--gres=gpu:1", NULL), 3);
    ck_assert(!in.o[MMG_O_GRES].set);
    /* another plugin's option: no argument unless --name=value */
    ck_assert_int_eq(args(MMG_TOOL_SBATCH, "sbatch", "--site-opt", "--gres=gpu:1", "--x=1", "s",
                          NULL), 4);
    ck_assert_str_eq(OPT(MMG_O_GRES), "gpu:1");
    /* tool-specific: --wait takes a value in srun only */
    ck_assert_int_eq(args(MMG_TOOL_SBATCH, "sbatch", "-W", "s.sh", NULL), 2);
    ck_assert_int_eq(args(MMG_TOOL_SRUN, "srun", "-W", "10", "cmd", NULL), 3);
    /* hetjob separator */
    args(MMG_TOOL_SBATCH, "sbatch", "-N1", ":", "-N2", "s", NULL);
    ck_assert(in.het);
}
END_TEST

START_TEST(value_too_long)
{
    char big[400];
    memset(big, '1', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    args(MMG_TOOL_SBATCH, "sbatch", "--nodes", big, NULL);
    ck_assert(!in.o[MMG_O_NODES].set);
    ck_assert_msg(strstr(in.error, "--nodes: value longer than 255 bytes") != NULL, "%s", in.error);
    ck_assert_int_eq(mmg_reqin_to_job(&in, &job), -1);
}
END_TEST

/* ---- precedence: #SBATCH < environment < command line ----------------------- */

START_TEST(precedence)
{
    static const char script[] = "#!/bin/sh\n#SBATCH --gres=gpu:h100:2\n#SBATCH -N 2\nsrun x\n";
    char *env[] = { (char *)"SBATCH_GRES=gpu:h100:4", (char *)"SALLOC_GPUS=9", NULL };
    char *av[] = { (char *)"sbatch", (char *)"--gres=gpu:h100:8", (char *)"t.sh", NULL };

    mmg_reqin_init(&in, MMG_TOOL_SBATCH);
    mmg_script_apply(&in, script, strlen(script));
    ck_assert_str_eq(OPT(MMG_O_GRES), "gpu:h100:2");
    ck_assert_uint_eq(in.o[MMG_O_GRES].line, 2);
    mmg_env_apply(&in, env);
    ck_assert_str_eq(OPT(MMG_O_GRES), "gpu:h100:4");
    ck_assert_str_eq(in.o[MMG_O_GRES].spelled, "SBATCH_GRES");
    ck_assert(!in.o[MMG_O_GPUS].set); /* SALLOC_* is salloc's */
    mmg_args_apply(&in, 3, av, MMG_FROM_ARGS, NULL);
    ck_assert_int_eq(eval(), MMG_REQ_OK);
    ck_assert_uint_eq(g.gpus_min, 16); /* 8 per node (command line) x 2 nodes (script) */
    ck_assert_str_eq(g.type, "h100");
}
END_TEST

START_TEST(env_per_tool)
{
    char *env[] = { (char *)"SLURM_GPUS_PER_NODE=h100:2", (char *)"SLURM_JOB_NUM_NODES=3",
                    (char *)"SLURM_NPROCS=5", (char *)"SLURM_NTASKS=6",
                    (char *)"SLURM_JOB_ID=42", (char *)"SBATCH_GPUS=1", NULL };
    mmg_reqin_init(&in, MMG_TOOL_SRUN);
    mmg_env_apply(&in, env);
    ck_assert_str_eq(OPT(MMG_O_GPUS_PER_NODE), "h100:2");
    ck_assert_str_eq(OPT(MMG_O_NODES), "3");
    ck_assert_str_eq(OPT(MMG_O_NTASKS), "6"); /* SLURM_NTASKS overrides SLURM_NPROCS */
    ck_assert_str_eq(OPT(MMG_O_JOBID), "42");
    ck_assert(!in.o[MMG_O_GPUS].set);
    ck_assert_int_eq(eval(), MMG_REQ_OK);
    ck_assert_uint_eq(g.gpus_min, 6);
    /* sbatch reads no node or task count from the environment */
    mmg_reqin_init(&in, MMG_TOOL_SBATCH);
    mmg_env_apply(&in, env);
    ck_assert(!in.o[MMG_O_NODES].set);
    ck_assert_str_eq(OPT(MMG_O_GPUS), "1");
}
END_TEST

/* ---- #SBATCH lines ------------------------------------------------------------ */

START_TEST(script_directives)
{
    static const char s1[] =
        "#!/bin/bash\n"
        "# a comment\n"
        "\n"
        "#SBATCH --job-name 'my job' --gres=gpu:h100:1 # trailing comment\n"
        "#SBATCH --nodes=\"2\"\n"
        "#SLURM --ntasks=4\n"
        "#SBATCH --gpus-per-node=\\#3\n"      /* a backslash takes '#' literally */
        "#SBATCH --gres\n"                    /* its value on the next line, as getopt sees it */
        "#SBATCH gpu:h100:7\n"
        "  echo start\n"                      /* the first command ends the directives */
        "#SBATCH --gres=gpu:h100:8\n";
    static const char s2[] = "#!/bin/sh\n#PBS -l nodes=2:gpus=4\n#SBATCH -G 1\nhostname\n";
    static const char s3[] = "#!/bin/sh\n#SBATCH --gres='gpu:2\n";
    static const char s4[] = "#!/bin/sh\n#SBATCH -N 1\n#SBATCH hetjob\n#SBATCH -N 2\n";

    mmg_reqin_init(&in, MMG_TOOL_SBATCH);
    ck_assert_int_eq(mmg_script_apply(&in, s1, strlen(s1)), 0);
    ck_assert_str_eq(OPT(MMG_O_GRES), "gpu:h100:7");
    ck_assert_uint_eq(in.o[MMG_O_GRES].line, 8);
    ck_assert_str_eq(OPT(MMG_O_NODES), "2");
    ck_assert_str_eq(OPT(MMG_O_NTASKS), "4");
    ck_assert_str_eq(OPT(MMG_O_GPUS_PER_NODE), "#3");

    mmg_reqin_init(&in, MMG_TOOL_SBATCH);
    mmg_script_apply(&in, s2, strlen(s2));
    ck_assert_int_eq(in.pbs_line, 2);
    ck_assert_str_eq(OPT(MMG_O_GPUS), "1");

    mmg_reqin_init(&in, MMG_TOOL_SBATCH);
    snprintf(in.script_name, sizeof(in.script_name), "job.sh");
    ck_assert_int_eq(mmg_script_apply(&in, s3, strlen(s3)), -1);
    ck_assert_str_eq(in.error, "job.sh line 2: unmatched quote in an #SBATCH line");

    mmg_reqin_init(&in, MMG_TOOL_SBATCH);
    mmg_script_apply(&in, s4, strlen(s4));
    ck_assert(in.het);
}
END_TEST

/* ---- sbatch's node and task rules ----------------------------------------------- */

START_TEST(nodes_and_tasks)
{
    args(MMG_TOOL_SBATCH, "sbatch", "-N", "2-4", "--gres=gpu:2", NULL);
    ck_assert_int_eq(eval(), MMG_REQ_OK);
    ck_assert_uint_eq(job.min_nodes, 2);
    ck_assert_uint_eq(job.max_nodes, 4);
    ck_assert_uint_eq(g.gpus_min, 4);
    /* -N 1k: 1024 nodes */
    args(MMG_TOOL_SBATCH, "sbatch", "-N1k", "--gres=gpu:1", NULL);
    ck_assert_int_eq(eval(), MMG_REQ_OK);
    ck_assert_uint_eq(g.gpus_min, 1024);
    /* tasks from nodes x tasks per node; nodes capped by tasks */
    args(MMG_TOOL_SBATCH, "sbatch", "-N2", "--ntasks-per-node=3", "--gpus-per-task=1", NULL);
    ck_assert_int_eq(eval(), MMG_REQ_OK);
    ck_assert_uint_eq(job.num_tasks, 6);
    ck_assert_uint_eq(g.gpus_min, 6);
    args(MMG_TOOL_SBATCH, "sbatch", "-N", "2", "-n", "1", "--gres=gpu:1", NULL);
    ck_assert_int_eq(eval(), MMG_REQ_OK);
    ck_assert_uint_eq(g.gpus_min, 1);
    /* a node list counts its hosts */
    args(MMG_TOOL_SBATCH, "sbatch", "-w", "gpu[001-003],login", "--gres=gpu:1", NULL);
    ck_assert_int_eq(eval(), MMG_REQ_OK);
    ck_assert_uint_eq(g.gpus_min, 4);
    /* bad values and node files */
    args(MMG_TOOL_SBATCH, "sbatch", "-N", "4-2", "--gres=gpu:1", NULL);
    ck_assert_int_eq(mmg_reqin_to_job(&in, &job), -1);
    ck_assert_str_eq(in.error, "--nodes=4-2: cannot read this value");
    args(MMG_TOOL_SBATCH, "sbatch", "-F", "hosts.txt", NULL);
    ck_assert_int_eq(mmg_reqin_to_job(&in, &job), -1);
    /* --gres=none: no GRES */
    args(MMG_TOOL_SBATCH, "sbatch", "--gres=NONE", NULL);
    ck_assert_int_eq(eval(), MMG_REQ_NONE);
}
END_TEST

START_TEST(hostlists)
{
    ck_assert_uint_eq(mmg_hostlist_count("a"), 1);
    ck_assert_uint_eq(mmg_hostlist_count("a,b,c"), 3);
    ck_assert_uint_eq(mmg_hostlist_count("gpu[001-004,007]"), 5);
    ck_assert_uint_eq(mmg_hostlist_count("r[1-2]n[1-3],x"), 7);
    ck_assert_uint_eq(mmg_hostlist_count(""), 0);
    ck_assert_uint_eq(mmg_hostlist_count("a,,b"), 0);
    ck_assert_uint_eq(mmg_hostlist_count("n[3-1]"), 0);
    ck_assert_uint_eq(mmg_hostlist_count("n[1-2"), 0);
    ck_assert_uint_eq(mmg_hostlist_count("n[]"), 0);
}
END_TEST

/* ---- in the user's terms ------------------------------------------------------------- */

START_TEST(spelled)
{
    static const char script[] = "#!/bin/sh\n#SBATCH --gres=gpu:h100:2,shard:1\necho\n";
    char out[512];
    char *env[] = { (char *)"SBATCH_GPUS=a100:2", NULL };

    args(MMG_TOOL_SBATCH, "sbatch", "--gres=gpu:h100:2,shard:1", NULL);
    eval();
    ck_assert_uint_eq(mmg_request_spell(&in, &g, 6, "", 8, out, sizeof(out)), 6);
    ck_assert_str_eq(out, "--gres=gpu:h100:6,shard:1");
    ck_assert_uint_eq(mmg_request_spell(&in, &g, 2, "h200", 8, out, sizeof(out)), 2);
    ck_assert_str_eq(out, "--gres=gpu:h200:2,shard:1");
    /* more than a node holds: more nodes */
    ck_assert_uint_eq(mmg_request_spell(&in, &g, 12, "", 8, out, sizeof(out)), 12);
    ck_assert_str_eq(out, "-N 2 --gres=gpu:h100:6,shard:1");
    mmg_request_describe(&in, &g, out, sizeof(out));
    ck_assert_str_eq(out, "2 GPUs (--gres=gpu:h100:2,shard:1 on 1 node)");

    mmg_reqin_init(&in, MMG_TOOL_SBATCH);
    snprintf(in.script_name, sizeof(in.script_name), "train.sh");
    mmg_script_apply(&in, script, strlen(script));
    eval();
    mmg_request_spell(&in, &g, 3, "", 8, out, sizeof(out));
    ck_assert_str_eq(out, "#SBATCH --gres=gpu:h100:3,shard:1 (train.sh line 2)");

    mmg_reqin_init(&in, MMG_TOOL_SBATCH);
    mmg_env_apply(&in, env);
    eval();
    mmg_request_spell(&in, &g, 5, "", 8, out, sizeof(out));
    ck_assert_str_eq(out, "SBATCH_GPUS=a100:5");

    /* per task: rounded up to whole tasks */
    args(MMG_TOOL_SRUN, "srun", "-n", "4", "--gpus-per-task=1", "cmd", NULL);
    eval();
    ck_assert_uint_eq(mmg_request_spell(&in, &g, 6, "", 8, out, sizeof(out)), 8);
    ck_assert_str_eq(out, "--gpus-per-task=2");
}
END_TEST

/* ---- an srun step's allocation --------------------------------------------------------- */

START_TEST(allocation)
{
    static const char rec[] =
        "JobId=7 JobName=interactive UserId=u(1) NumNodes=2 NumCPUs=2 NumTasks=2 "
        "TRES=cpu=2,node=2 TresPerNode=gres:gpu:h100:4,gres:shard:1 MinCPUsNode=1\n";
    char *env[] = { (char *)"SLURM_JOB_ID=7", NULL };

    mmg_reqin_init(&in, MMG_TOOL_SRUN);
    mmg_env_apply(&in, env);
    ck_assert_int_eq(mmg_alloc_apply(&in, rec), 1);
    ck_assert_str_eq(OPT(MMG_O_GRES), "gpu:h100:4,shard:1");
    ck_assert_int_eq(in.o[MMG_O_GRES].from, MMG_FROM_ALLOC);
    ck_assert_int_eq(eval(), MMG_REQ_OK);
    ck_assert_uint_eq(g.gpus_min, 8);
    /* the step's own node count wins */
    mmg_reqin_init(&in, MMG_TOOL_SRUN);
    args(MMG_TOOL_SRUN, "srun", "-N1", "cmd", NULL);
    mmg_alloc_apply(&in, "JobId=8 NumNodes=2 TresPerJob=gres:gpu:h200:3");
    ck_assert_str_eq(OPT(MMG_O_GPUS), "h200:3");
    ck_assert_str_eq(OPT(MMG_O_NODES), "1");
    ck_assert_int_eq(mmg_alloc_apply(&in, "garbage"), -1);
    ck_assert_int_eq(mmg_alloc_apply(&in, "JobId=9 NumNodes=1"), 0);
}
END_TEST

TCase *request_tcase(void)
{
    TCase *tc = tcase_create("request");
    tcase_add_test(tc, shared_cases);
    tcase_add_test(tc, option_syntax);
    tcase_add_test(tc, value_too_long);
    tcase_add_test(tc, precedence);
    tcase_add_test(tc, env_per_tool);
    tcase_add_test(tc, script_directives);
    tcase_add_test(tc, nodes_and_tasks);
    tcase_add_test(tc, hostlists);
    tcase_add_test(tc, spelled);
    tcase_add_test(tc, allocation);
    return tc;
}
