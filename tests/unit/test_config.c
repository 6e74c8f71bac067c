/* test_config.c - the SPANK plugin's strict configuration parser
 * (spank_plugin/config.c).  What a mmguard.conf file means is checked by the
 * table tests/unit/conf_cases.txt, which contrib/job_submit.lua's tests run
 * too (the two readers must agree on every key); the tests here cover what
 * only the plugin has: plugstack.conf arguments, their order with config=,
 * and file access errors.  config_suite() also carries the other Slurm-free
 * plugin suites (test_request.c, test_record.c). */
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "plugin_tests.h"
#include "unit.h"

#define MiB (1024ull * 1024ull)
#define GiB (1024ull * MiB)

static struct mmg_config cfg;
static char err[1024];

/* parse the NULL-terminated argument list; returns the parser's rc */
static int parse(const char *a0, ...)
{
    char *av[16];
    int ac = 0;
    va_list ap;
    const char *a = a0;
    va_start(ap, a0);
    while (a && ac < 16) {
        av[ac++] = (char *)a;
        a = va_arg(ap, const char *);
    }
    va_end(ap);
    err[0] = '\0';
    return mmg_config_parse_args(&cfg, ac, av, err, sizeof(err));
}

/* a temporary config file with this content; path into `path` */
static void write_tmp(char path[64], const char *content, size_t len)
{
    int fd;
    snprintf(path, 64, "/tmp/mmguard-conf-XXXXXX");
    fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, content, len), (ssize_t)len);
    close(fd);
}

#define ck_err(needle) ck_assert_msg(strstr(err, needle) != NULL, "'%s' not in '%s'", needle, err)

/* ---- the shared table ---------------------------------------------------- */

/* The value a case's KEY names (see conf_cases.txt). */
static void value_of(const struct mmg_config *c, const char *key, char *out, size_t n)
{
    static const char *const actions[] = { "reject", "warn", "resize" };
    static const char *const requires[] = { "off", "warn", "reject" };
    const struct mmg_gpu *g;
    out[0] = '\0';
    if (!strcmp(key, "action")) snprintf(out, n, "%s", actions[c->action]);
    else if (!strcmp(key, "margin")) mmg_config_margin_str(c, out, n);
    else if (!strcmp(key, "reserve")) snprintf(out, n, "%llu", (unsigned long long)c->reserve);
    else if (!strcmp(key, "default_gpu")) snprintf(out, n, "%s", c->default_gpu);
    else if (!strcmp(key, "on_error")) snprintf(out, n, "%s", c->on_error ? "allow" : "reject");
    else if (!strcmp(key, "require")) snprintf(out, n, "%s", requires[c->require]);
    else if (!strcmp(key, "syslog")) snprintf(out, n, "%s", c->syslog ? "yes" : "no");
    else if (!strcmp(key, "max_micro_batch")) snprintf(out, n, "%s", c->max_micro_batch ? "yes" : "no");
    else if (!strcmp(key, "log")) snprintf(out, n, "%s", c->log_path);
    else if (!strcmp(key, "ctld_log")) snprintf(out, n, "%s", c->ctld_log);
    else if (!strcmp(key, "max_gpus_per_node")) snprintf(out, n, "%u", c->max_gpus_per_node);
    else if (!strcmp(key, "resize_types")) snprintf(out, n, "%s", c->resize_types);
    else if (!strcmp(key, "host_mem")) snprintf(out, n, "%s", mmg_hostmem_name(c->host_mem));
    else if (!strcmp(key, "flush")) snprintf(out, n, "%s", mmg_flush_name(c->flush));
    else if (!strcmp(key, "host_overhead")) snprintf(out, n, "%llu", (unsigned long long)c->host_overhead);
    else if (!strcmp(key, "def_mem_per_node")) snprintf(out, n, "%llu", (unsigned long long)c->def_mem_per_node);
    else if (!strcmp(key, "def_mem_per_cpu")) snprintf(out, n, "%llu", (unsigned long long)c->def_mem_per_cpu);
    else if (!strcmp(key, "def_mem_per_gpu")) snprintf(out, n, "%llu", (unsigned long long)c->def_mem_per_gpu);
    else if (!strcmp(key, "node_mem")) snprintf(out, n, "%llu", (unsigned long long)c->node_mem);
    else if (!strncmp(key, "gpu.", 4) && (g = mmg_config_gpu(c, key + 4)))
        snprintf(out, n, "%llu", (unsigned long long)g->bytes);
    else if (!strncmp(key, "usable.", 7) && (g = mmg_config_gpu(c, key + 7)))
        snprintf(out, n, "%llu", (unsigned long long)mmg_config_usable(c, g->bytes));
    else
        snprintf(out, n, "<no key %s>", key);
}

/* One case: parse its file, compare with its expectation. */
static void run_conf_case(const struct table_case *tc)
{
    char path[64], arg[96], want[1024], got[1100];
    write_tmp(path, tc->text, tc->len);
    snprintf(arg, sizeof(arg), "config=%s", path);
    if (!strncmp(tc->expect, "error ", 6)) {
        unsigned line = (unsigned)strtoul(tc->expect + 6, NULL, 10);
        const char *msg = strchr(tc->expect + 6, ' ');
        ck_assert_msg(parse(arg, NULL) == -1, "%s: accepted", tc->name);
        if (line)
            snprintf(want, sizeof(want), "%s:%u: %s", path, line, msg ? msg + 1 : "");
        else
            snprintf(want, sizeof(want), "%s: %s", path, msg ? msg + 1 : "");
        ck_assert_msg(!strncmp(err, want, strlen(want)), "%s: got '%s', want '%s...'", tc->name,
                      err, want);
    } else {
        char *copy = strdup(tc->expect + 2), *save = NULL;
        ck_assert_msg(parse(arg, NULL) == 0, "%s: %s", tc->name, err);
        for (char *kv = strtok_r(copy, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
            char *eq = strchr(kv, '=');
            ck_assert_ptr_nonnull(eq);
            *eq = '\0';
            value_of(&cfg, kv, got, sizeof(got));
            ck_assert_msg(!strcmp(got, eq + 1), "%s: %s is '%s', want '%s'", tc->name, kv, got,
                          eq + 1);
        }
        free(copy);
    }
    unlink(path);
}

START_TEST(shared_cases)
{
    struct table_case *cases = NULL;
    size_t n = table_load(SRCDIR "/tests/unit/conf_cases.txt", &cases);
    ck_assert_uint_ge(n, 50);
    for (size_t i = 0; i < n; i++)
        run_conf_case(&cases[i]);
    table_free(cases, n);
}
END_TEST

/* ---- what only the plugin has --------------------------------------------- */

START_TEST(defaults)
{
    ck_assert_int_eq(parse(NULL), 0);
    ck_assert_int_eq(cfg.action, MMG_ACTION_REJECT);
    ck_assert_int_eq(cfg.require, MMG_REQUIRE_OFF);
    ck_assert_uint_eq(cfg.n_gpus, 5);
    ck_assert_ptr_null(mmg_config_gpu(&cfg, "v100"));
    ck_assert_uint_eq(mmg_config_usable(&cfg, 81559 * MiB), 81559 * MiB);
}
END_TEST

START_TEST(values_from_args)
{
    ck_assert_int_eq(parse("action=warn", "margin=10%", "reserve=2GiB", "default_gpu=a100",
                           "log=/var/log/mmguard/decisions.jsonl", "syslog=yes",
                           "on_error=allow", "max_gpus_per_node=4", "resize_types=h200",
                           "require=reject", "ctld_log=/var/log/mmguard/ctld.jsonl", NULL), 0);
    ck_assert_int_eq(cfg.action, MMG_ACTION_WARN);
    ck_assert_int_eq(cfg.on_error, MMG_ONERR_ALLOW);
    ck_assert_int_eq(cfg.require, MMG_REQUIRE_REJECT);
    ck_assert_str_eq(cfg.default_gpu, "a100");
    ck_assert_uint_eq(mmg_config_usable(&cfg, 81920 * MiB),
                      81920 * MiB - (81920 * MiB + 9) / 10 - 2 * GiB);
}
END_TEST

START_TEST(arg_errors)
{
    /* plugstack arguments name their position instead of FILE:LINE */
    ck_assert_int_eq(parse("action=warn", "bogus=1", NULL), -1);
    ck_assert_str_eq(err, "plugstack.conf argument 2: unknown key 'bogus'");
    ck_assert_int_eq(parse("noequals", NULL), -1);
    ck_assert_str_eq(err, "plugstack.conf argument 1: expected key=value, got 'noequals'");
    ck_assert_int_eq(parse("default_gpu=v100", NULL), -1);
    ck_assert_str_eq(err, "plugstack.conf: default_gpu: unknown GPU type 'v100' (add gpu.v100=SIZE)");
    ck_assert_int_eq(parse("config=mmguard.conf", NULL), -1);
    ck_err("config: 'mmguard.conf' is not an absolute path");
}
END_TEST

START_TEST(file_ok_and_override)
{
    char path[64], arg[96];
    const char *text = "action = warn\nmargin=10%\n";
    write_tmp(path, text, strlen(text));
    snprintf(arg, sizeof(arg), "config=%s", path);
    ck_assert_int_eq(parse(arg, NULL), 0);
    ck_assert_int_eq(cfg.action, MMG_ACTION_WARN);
    ck_assert_str_eq(cfg.config_file, path);
    /* later plugstack arguments override the file */
    ck_assert_int_eq(parse(arg, "action=reject", NULL), 0);
    ck_assert_int_eq(cfg.action, MMG_ACTION_REJECT);
    /* and earlier ones are overridden by it */
    ck_assert_int_eq(parse("action=resize", arg, NULL), 0);
    ck_assert_int_eq(cfg.action, MMG_ACTION_WARN);
    unlink(path);
}
END_TEST

/* the shipped example must be valid as it is */
START_TEST(shipped_example)
{
    ck_assert_int_eq(parse("config=" SRCDIR "/mmguard.conf.example", NULL), 0);
    ck_assert_int_eq(cfg.action, MMG_ACTION_REJECT);
    ck_assert(cfg.margin.percent == 10.0);
    /* resize only moves to types with more memory than the default: an a100
     * (80 GiB) is not larger than an h100, so it must not be listed */
    {
        char list[sizeof(cfg.resize_types)], *save = NULL;
        const struct mmg_gpu *def = mmg_config_gpu(&cfg, cfg.default_gpu);
        memcpy(list, cfg.resize_types, sizeof(list));
        ck_assert_str_ne(list, "");
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save))
            ck_assert_msg(mmg_config_gpu(&cfg, t)->bytes > def->bytes,
                          "resize_types entry %s is not larger than %s", t, def->name);
    }
}
END_TEST

START_TEST(file_access)
{
    ck_assert_int_eq(parse("config=/nonexistent/mmguard.conf", NULL), -1);
    ck_assert_str_eq(err, "/nonexistent/mmguard.conf: cannot open config file: No such file or directory");
    ck_assert_int_eq(parse("config=/tmp", NULL), -1);
    ck_assert_str_eq(err, "/tmp: config file is not a regular file");
}
END_TEST

Suite *config_suite(void)
{
    Suite *s = suite_create("plugin");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, shared_cases);
    tcase_add_test(tc, defaults);
    tcase_add_test(tc, values_from_args);
    tcase_add_test(tc, arg_errors);
    tcase_add_test(tc, file_ok_and_override);
    tcase_add_test(tc, file_access);
    tcase_add_test(tc, shipped_example);
    suite_add_tcase(s, tc);
    suite_add_tcase(s, request_tcase());
    suite_add_tcase(s, record_tcase());
    suite_add_tcase(s, memreq_tcase());
    return s;
}
