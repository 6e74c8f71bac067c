/* test_config.c - the SPANK plugin's strict configuration parser
 * (spank_plugin/config.c): defaults, sizes, margins, the GPU table and every
 * error message, from plugstack arguments and from a config file. */
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
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

START_TEST(defaults)
{
    ck_assert_int_eq(parse(NULL), 0);
    ck_assert_int_eq(cfg.action, MMG_ACTION_REJECT);
    ck_assert_int_eq(cfg.on_error, MMG_ONERR_REJECT);
    ck_assert_int_eq(cfg.syslog, 0);
    ck_assert_str_eq(cfg.default_gpu, "h100");
    ck_assert_str_eq(cfg.log_path, "");
    ck_assert_uint_eq(cfg.max_gpus_per_node, 8);
    ck_assert_uint_eq(cfg.n_gpus, 5);
    ck_assert_uint_eq(mmg_config_gpu(&cfg, "h100")->bytes, 81559 * MiB);
    ck_assert_uint_eq(mmg_config_gpu(&cfg, "h200")->bytes, 143771 * MiB);
    ck_assert_uint_eq(mmg_config_gpu(&cfg, "a100")->bytes, 81920 * MiB);
    ck_assert_uint_eq(mmg_config_gpu(&cfg, "a100-40g")->bytes, 40960 * MiB);
    ck_assert_uint_eq(mmg_config_gpu(&cfg, "l40s")->bytes, 46068 * MiB);
    ck_assert_ptr_null(mmg_config_gpu(&cfg, "v100"));
    /* no margin: everything usable */
    ck_assert_uint_eq(mmg_config_usable(&cfg, 81559 * MiB), 81559 * MiB);
}
END_TEST

START_TEST(values_from_args)
{
    ck_assert_int_eq(parse("action=warn", "margin=10%", "reserve=2GiB", "default_gpu=a100",
                           "log=/var/log/mmguard/decisions.jsonl", "syslog=yes",
                           "on_error=allow", "max_gpus_per_node=4", "resize_types=h200,a100",
                           "ctld_log=/var/log/mmguard/ctld.jsonl", NULL), 0);
    ck_assert_int_eq(cfg.action, MMG_ACTION_WARN);
    ck_assert_int_eq(cfg.on_error, MMG_ONERR_ALLOW);
    ck_assert_int_eq(cfg.syslog, 1);
    ck_assert_str_eq(cfg.default_gpu, "a100");
    ck_assert_str_eq(cfg.log_path, "/var/log/mmguard/decisions.jsonl");
    ck_assert_str_eq(cfg.ctld_log, "/var/log/mmguard/ctld.jsonl");
    ck_assert_str_eq(cfg.resize_types, "h200,a100");
    ck_assert_uint_eq(cfg.max_gpus_per_node, 4);
    ck_assert_uint_eq(cfg.reserve, 2 * GiB);
    ck_assert(cfg.margin.percent == 10.0);
    ck_assert_int_eq(parse("action=resize", NULL), 0);
    ck_assert_int_eq(cfg.action, MMG_ACTION_RESIZE);
    ck_assert_str_eq(mmg_action_name(cfg.action), "resize");
}
END_TEST

START_TEST(margin_and_reserve)
{
    char s[64];
    uint64_t g = 81559 * MiB;
    /* percent (rounded up by the library) plus reserve */
    ck_assert_int_eq(parse("margin=10%", "reserve=2GiB", NULL), 0);
    ck_assert_uint_eq(mmg_config_usable(&cfg, g), g - (g + 9) / 10 - 2 * GiB);
    mmg_config_margin_str(&cfg, s, sizeof(s));
    ck_assert_str_eq(s, "10%+2147483648");
    /* margin given as a size adds to reserve */
    ck_assert_int_eq(parse("margin=4GiB", "reserve=512MiB", NULL), 0);
    ck_assert_uint_eq(mmg_config_usable(&cfg, g), g - 4 * GiB - 512 * MiB);
    mmg_config_margin_str(&cfg, s, sizeof(s));
    ck_assert_str_eq(s, "0%+4831838208");
    /* reserve larger than a GPU: usable 0 for that GPU */
    ck_assert_int_eq(parse("reserve=50GiB", NULL), 0);
    ck_assert_uint_eq(mmg_config_usable(&cfg, 40960 * MiB), 0);
}
END_TEST

START_TEST(gpu_table)
{
    ck_assert_int_eq(parse("gpu.h100=80GiB", "gpu.b200=192GB", "gpu.H200=141GiB", NULL), 0);
    ck_assert_uint_eq(mmg_config_gpu(&cfg, "h100")->bytes, 80 * GiB); /* override */
    ck_assert_uint_eq(mmg_config_gpu(&cfg, "B200")->bytes, 192000000000ull); /* added */
    ck_assert_uint_eq(mmg_config_gpu(&cfg, "h200")->bytes, 141 * GiB); /* case-insensitive */
    ck_assert_uint_eq(cfg.n_gpus, 6);
    ck_assert_str_eq(mmg_config_gpu(&cfg, "b200")->name, "b200"); /* stored lower-case */
    ck_assert_int_eq(parse("gpu.MI300X=192GiB", "default_gpu=Mi300x", NULL), 0);
    ck_assert_str_eq(cfg.default_gpu, "mi300x");
}
END_TEST

START_TEST(arg_errors)
{
    ck_assert_int_eq(parse("action=warn", "bogus=1", NULL), -1);
    ck_assert_str_eq(err, "plugstack.conf argument 2: unknown key 'bogus'");
    ck_assert_int_eq(parse("action=maybe", NULL), -1);
    ck_assert_str_eq(err, "plugstack.conf argument 1: action: invalid value 'maybe' (reject|warn|resize)");
    ck_assert_int_eq(parse("noequals", NULL), -1);
    ck_err("plugstack.conf argument 1: expected key=value, got 'noequals'");
    ck_assert_int_eq(parse("=3", NULL), -1);
    ck_err("empty key before '='");
    ck_assert_int_eq(parse("margin=100%", NULL), -1);
    ck_err("plugstack.conf argument 1: margin: invalid value '100%'");
    ck_assert_int_eq(parse("margin=lots", NULL), -1);
    ck_err("margin: invalid value 'lots'");
    ck_assert_int_eq(parse("reserve=2 parsecs", NULL), -1);
    ck_err("reserve: invalid size '2 parsecs'");
    ck_assert_int_eq(parse("gpu.a/b=80GiB", NULL), -1);
    ck_err("gpu.a/b: invalid GPU type name 'a/b'");
    ck_assert_int_eq(parse("gpu.=80GiB", NULL), -1);
    ck_err("invalid GPU type name ''");
    ck_assert_int_eq(parse("gpu.h100=0", NULL), -1);
    ck_err("gpu.h100: GPU memory must be > 0");
    ck_assert_int_eq(parse("gpu.h100=eighty", NULL), -1);
    ck_err("gpu.h100: invalid size 'eighty'");
    ck_assert_int_eq(parse("default_gpu=v100", NULL), -1);
    ck_err("default_gpu: unknown GPU type 'v100' (add gpu.v100=SIZE)");
    ck_assert_int_eq(parse("resize_types=h200,v100", NULL), -1);
    ck_err("resize_types: unknown GPU type 'v100'");
    ck_assert_int_eq(parse("resize_types=h200,,a100", NULL), -1);
    ck_err("resize_types: empty entry in 'h200,,a100'");
    ck_assert_int_eq(parse("resize_types=h200,", NULL), -1);
    ck_err("resize_types: empty entry");
    ck_assert_int_eq(parse("log=decisions.jsonl", NULL), -1);
    ck_err("log: 'decisions.jsonl' is not an absolute path");
    ck_assert_int_eq(parse("ctld_log=rel/x", NULL), -1);
    ck_err("ctld_log: 'rel/x' is not an absolute path");
    ck_assert_int_eq(parse("syslog=maybe", NULL), -1);
    ck_err("syslog: invalid value 'maybe' (yes|no)");
    ck_assert_int_eq(parse("on_error=ignore", NULL), -1);
    ck_err("on_error: invalid value 'ignore' (reject|allow)");
    ck_assert_int_eq(parse("max_gpus_per_node=0", NULL), -1);
    ck_err("max_gpus_per_node: '0' is not an integer in 1..1024");
    ck_assert_int_eq(parse("max_gpus_per_node=2000", NULL), -1);
    ck_assert_int_eq(parse("max_gpus_per_node=8x", NULL), -1);
    ck_assert_int_eq(parse("max_gpus_per_node=-1", NULL), -1);
    ck_assert_int_eq(parse("reserve=100GiB", NULL), -1);
    ck_err("margin/reserve leave no usable memory on h100");
    /* relative config path */
    ck_assert_int_eq(parse("config=mmguard.conf", NULL), -1);
    ck_err("config: 'mmguard.conf' is not an absolute path");
    /* log=none / empty disables */
    ck_assert_int_eq(parse("log=/x/y", "log=none", NULL), 0);
    ck_assert_str_eq(cfg.log_path, "");
}
END_TEST

START_TEST(file_ok_and_override)
{
    char path[64], arg[96];
    const char *text = "# mmguard.conf\n\n  action = warn  \r\n"
                       "margin=10%\n   # indented comment\ngpu.b200=192GiB\n"
                       "default_gpu=b200\nlog=/var/log/mmguard/d.jsonl"; /* no final newline */
    write_tmp(path, text, strlen(text));
    snprintf(arg, sizeof(arg), "config=%s", path);
    ck_assert_int_eq(parse(arg, NULL), 0);
    ck_assert_int_eq(cfg.action, MMG_ACTION_WARN);
    ck_assert_str_eq(cfg.default_gpu, "b200");
    ck_assert_str_eq(cfg.log_path, "/var/log/mmguard/d.jsonl");
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
    ck_assert_str_eq(cfg.resize_types, "h200,a100");
}
END_TEST

START_TEST(file_errors)
{
    char path[64], arg[96], expect[160];
    const char *t1 = "action=warn\n# c\n\nfoo = 1\n";
    const char *t2 = "action=warn\njust words\n";
    const char *t3 = "config=/etc/other.conf\n";
    const char *t4 = "action=warn\nmargin=10%%\n";
    static const char t5[] = "action=warn\n\0x=1\n";

    write_tmp(path, t1, strlen(t1));
    snprintf(arg, sizeof(arg), "config=%s", path);
    ck_assert_int_eq(parse(arg, NULL), -1);
    snprintf(expect, sizeof(expect), "%s:4: unknown key 'foo'", path);
    ck_assert_str_eq(err, expect);
    unlink(path);

    write_tmp(path, t2, strlen(t2));
    snprintf(arg, sizeof(arg), "config=%s", path);
    ck_assert_int_eq(parse(arg, NULL), -1);
    snprintf(expect, sizeof(expect), "%s:2: expected key=value, got 'just words'", path);
    ck_assert_str_eq(err, expect);
    unlink(path);

    write_tmp(path, t3, strlen(t3));
    snprintf(arg, sizeof(arg), "config=%s", path);
    ck_assert_int_eq(parse(arg, NULL), -1);
    ck_err(":1: config: only allowed on the plugstack.conf line");
    unlink(path);

    write_tmp(path, t4, strlen(t4));
    snprintf(arg, sizeof(arg), "config=%s", path);
    ck_assert_int_eq(parse(arg, NULL), -1);
    snprintf(expect, sizeof(expect), "%s:2: margin: invalid value '10%%%%'", path);
    ck_err(expect);
    unlink(path);

    write_tmp(path, t5, sizeof(t5) - 1);
    snprintf(arg, sizeof(arg), "config=%s", path);
    ck_assert_int_eq(parse(arg, NULL), -1);
    ck_err("NUL byte in config file");
    unlink(path);

    ck_assert_int_eq(parse("config=/nonexistent/mmguard.conf", NULL), -1);
    ck_assert_str_eq(err, "/nonexistent/mmguard.conf: cannot open config file: No such file or directory");
    ck_assert_int_eq(parse("config=/tmp", NULL), -1);
    ck_assert_str_eq(err, "/tmp: config file is not a regular file");
}
END_TEST

START_TEST(file_limits)
{
    char path[64], arg[96];
    size_t n = MMG_CONF_MAX_BYTES + 10, i;
    char *big = malloc(n);
    ck_assert_ptr_nonnull(big);
    /* too large */
    for (i = 0; i < n; i++)
        big[i] = (i % 64 == 63) ? '\n' : '#';
    write_tmp(path, big, n);
    snprintf(arg, sizeof(arg), "config=%s", path);
    ck_assert_int_eq(parse(arg, NULL), -1);
    ck_err("config file larger than 65536 bytes");
    unlink(path);
    /* one over-long line */
    memset(big, '#', 2000);
    big[2000] = '\n';
    write_tmp(path, big, 2001);
    snprintf(arg, sizeof(arg), "config=%s", path);
    ck_assert_int_eq(parse(arg, NULL), -1);
    ck_err(":1: line longer than 1023 bytes");
    unlink(path);
    free(big);
}
END_TEST

Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("config");
    tcase_add_test(tc, defaults);
    tcase_add_test(tc, values_from_args);
    tcase_add_test(tc, margin_and_reserve);
    tcase_add_test(tc, gpu_table);
    tcase_add_test(tc, arg_errors);
    tcase_add_test(tc, file_ok_and_override);
    tcase_add_test(tc, file_errors);
    tcase_add_test(tc, shipped_example);
    tcase_add_test(tc, file_limits);
    suite_add_tcase(s, tc);
    return s;
}
