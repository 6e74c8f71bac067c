/* test_report.c - unit tests of the decision-log summary (predictor/api/report.c). */
#include <check.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

#include "unit.h"

static int add(mm_report *r, unsigned long lineno, const char *line)
{
    return mm_report_add_line(r, "t.log", lineno, line, strlen(line));
}

/* The JSON summary, parsed. */
static json_object *summary(const mm_report *r, size_t top)
{
    char *s = mm_report_json(r, top, 0);
    json_object *o;
    ck_assert_ptr_nonnull(s);
    o = json_tokener_parse(s);
    free(s);
    ck_assert_ptr_nonnull(o);
    return o;
}

static json_object *path(json_object *o, const char *a, const char *b)
{
    json_object *v = NULL;
    ck_assert_msg(json_object_object_get_ex(o, a, &v), "no key %s", a);
    if (b)
        ck_assert_msg(json_object_object_get_ex(v, b, &v), "no key %s.%s", a, b);
    return v;
}

static int64_t ival(json_object *o, const char *a, const char *b)
{
    return json_object_get_int64(path(o, a, b));
}

static const char *CTLD_REJECT =
    "{\"time\":\"2025-01-01T00:00:00Z\",\"source\":\"slurmctld\",\"decision\":\"reject\","
    "\"user\":\"alice\",\"uid\":1000,\"spec\":\"/s/a.yaml\",\"spec_sha256\":\"aa11\","
    "\"model\":\"llava\",\"peak_bytes\":150,\"usable_bytes\":100,\"gpus\":4,"
    "\"time_limit_minutes\":90}";

START_TEST(test_counts)
{
    mm_report *r = mm_report_new();
    json_object *o, *users, *u0;
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(add(r, 1, CTLD_REJECT), 0);
    ck_assert_int_eq(add(r, 2, CTLD_REJECT), 0);
    ck_assert_int_eq(add(r, 3, "{\"decision\":\"accept\",\"source\":\"sbatch\",\"user\":\"bob\","
                               "\"model\":\"llama\",\"peak_bytes\":50,\"usable_bytes\":100}\n"), 0);
    ck_assert_int_eq(add(r, 4, "{\"decision\":\"resize\",\"source\":\"slurmctld\",\"uid\":7}"), 0);
    ck_assert_int_eq(add(r, 5, "{\"decision\":\"warn\"}"), 0);
    ck_assert_int_eq(add(r, 6, "{\"decision\":\"error\",\"user\":\"bob\"}"), 0);
    ck_assert_int_eq(add(r, 7, "   \r\n"), 1);
    ck_assert_uint_eq(mm_report_records(r), 6);
    ck_assert_uint_eq(mm_report_decision_count(r, MM_DEC_REJECT), 2);
    ck_assert_uint_eq(mm_report_decision_count(r, MM_DEC_RESIZE), 1);

    o = summary(r, 10);
    ck_assert_int_eq(ival(o, "decisions", "reject"), 2);
    ck_assert_int_eq(ival(o, "decisions", "accept"), 1);
    ck_assert_int_eq(ival(o, "decisions", "warn"), 1);
    ck_assert_int_eq(ival(o, "decisions", "error"), 1);
    ck_assert_int_eq(ival(o, "lines", NULL), 7);
    ck_assert_int_eq(ival(o, "malformed", NULL), 0);
    users = path(o, "users", NULL);
    ck_assert_uint_eq(json_object_array_length(users), 4); /* alice, bob, uid:7, (unknown) */
    u0 = json_object_array_get_idx(users, 0);
    /* alice and bob both have 2; ties sort by name */
    ck_assert_str_eq(json_object_get_string(path(u0, "user", NULL)), "alice");
    ck_assert_int_eq(ival(u0, "reject", NULL), 2);
    ck_assert_int_eq(ival(u0, "total", NULL), 2);
    ck_assert_str_eq(json_object_get_string(path(json_object_array_get_idx(users, 3), "user", NULL)),
                     "uid:7");
    ck_assert_int_eq(ival(o, "users_total", NULL), 4);
    ck_assert_int_eq(ival(o, "models_total", NULL), 3);
    json_object_put(o);

    o = summary(r, 1);
    ck_assert_uint_eq(json_object_array_length(path(o, "users", NULL)), 1);
    json_object_put(o);
    mm_report_free(r);
}
END_TEST

START_TEST(test_malformed)
{
    mm_report *r = mm_report_new();
    json_object *o, *ml, *m0;
    ck_assert_int_eq(add(r, 1, "not json"), -1);
    ck_assert_int_eq(add(r, 2, "[1,2]"), -1);
    ck_assert_int_eq(add(r, 3, "{\"decision\":\"maybe\"}"), -1);
    ck_assert_int_eq(add(r, 4, "{\"decision\":42}"), -1);
    ck_assert_int_eq(add(r, 5, "{\"decision\":\"accept\""), -1);
    ck_assert_int_eq(add(r, 6, "{\"decision\":\"accept\"} {}"), -1);
    ck_assert_int_eq(mm_report_add_line(r, "t.log", 7, "{\"decision\":\"accept\"}\0x", 23), -1);
    ck_assert_int_eq(add(r, 8, "{\"decision\":\"accept\",\"user\":\"\xff\"}"), -1);
    ck_assert_int_eq(add(r, 9, CTLD_REJECT), 0);
    ck_assert_uint_eq(mm_report_malformed(r), 8);
    ck_assert_uint_eq(mm_report_records(r), 1);
    o = summary(r, 0);
    ml = path(o, "malformed_lines", NULL);
    ck_assert_uint_eq(json_object_array_length(ml), 8);
    m0 = json_object_array_get_idx(ml, 2);
    ck_assert_str_eq(json_object_get_string(path(m0, "file", NULL)), "t.log");
    ck_assert_int_eq(ival(m0, "line", NULL), 3);
    ck_assert_ptr_nonnull(strstr(json_object_get_string(path(m0, "error", NULL)), "maybe"));
    json_object_put(o);
    mm_report_free(r);
}
END_TEST

START_TEST(test_malformed_kept_bounded)
{
    mm_report *r = mm_report_new();
    json_object *o;
    for (unsigned long i = 1; i <= MM_REPORT_KEEP_MALFORMED + 50; i++)
        ck_assert_int_eq(add(r, i, "{"), -1);
    ck_assert_uint_eq(mm_report_malformed(r), MM_REPORT_KEEP_MALFORMED + 50);
    o = summary(r, 0);
    ck_assert_uint_eq(json_object_array_length(path(o, "malformed_lines", NULL)),
                      MM_REPORT_KEEP_MALFORMED);
    ck_assert(json_object_get_boolean(path(o, "malformed_lines_truncated", NULL)));
    json_object_put(o);
    mm_report_free(r);
}
END_TEST

START_TEST(test_gpu_hours)
{
    mm_report *r = mm_report_new();
    json_object *o, *by, *row;
    add(r, 1, CTLD_REJECT);                       /* 4 GPUs x 90 min = 6 GPU-h */
    add(r, 2, "{\"decision\":\"reject\",\"gpus\":2,\"time_limit_minutes\":30}");  /* 1 GPU-h */
    add(r, 3, "{\"decision\":\"reject\",\"gpus\":2}");                            /* no time */
    add(r, 4, "{\"decision\":\"reject\",\"source\":\"sbatch\",\"data_parallel\":8}"); /* plugin */
    add(r, 5, "{\"decision\":\"reject\",\"gpus\":null,\"time_limit_minutes\":null}");
    add(r, 6, "{\"decision\":\"accept\",\"gpus\":8,\"time_limit_minutes\":600}");  /* not rejected */
    add(r, 7, "{\"decision\":\"reject\",\"gpus\":2,\"time_limit_minutes\":1e308}"); /* infinite */
    o = summary(r, 0);
    ck_assert_int_eq(ival(o, "rejected_gpu_hours", "jobs"), 6);
    ck_assert_int_eq(ival(o, "rejected_gpu_hours", "known"), 2);
    ck_assert_int_eq(ival(o, "rejected_gpu_hours", "unknown_gpus"), 2);
    ck_assert_int_eq(ival(o, "rejected_gpu_hours", "unknown_time"), 2);
    ck_assert_double_eq_tol(json_object_get_double(path(o, "rejected_gpu_hours", "gpu_hours")), 7.0, 1e-9);
    by = path(o, "rejected_gpu_hours", "by_gpus");
    ck_assert_uint_eq(json_object_array_length(by), 2);
    row = json_object_array_get_idx(by, 0);
    ck_assert_int_eq(ival(row, "gpus", NULL), 2);
    ck_assert_int_eq(ival(row, "jobs", NULL), 3);
    ck_assert_int_eq(ival(row, "unknown_time", NULL), 2);
    ck_assert_double_eq_tol(json_object_get_double(path(row, "gpu_hours", NULL)), 1.0, 1e-9);
    row = json_object_array_get_idx(by, 1);
    ck_assert_int_eq(ival(row, "gpus", NULL), 4);
    ck_assert_double_eq_tol(json_object_get_double(path(row, "gpu_hours", NULL)), 6.0, 1e-9);
    json_object_put(o);
    mm_report_free(r);
}
END_TEST

START_TEST(test_ratio_and_specs)
{
    mm_report *r = mm_report_new();
    json_object *o, *bins, *specs, *s0;
    add(r, 1, "{\"decision\":\"accept\",\"peak_bytes\":100,\"usable_bytes\":100}"); /* 1.0 fits */
    add(r, 2, "{\"decision\":\"accept\",\"peak_bytes\":10,\"usable_bytes\":100}");  /* 0.1 */
    add(r, 3, CTLD_REJECT);                                                          /* 1.5 */
    add(r, 4, CTLD_REJECT);
    add(r, 5, "{\"decision\":\"reject\",\"spec\":\"/s/b.yaml\",\"spec_sha256\":\"bb22\","
              "\"model\":\"m2\",\"peak_bytes\":300,\"usable_bytes\":100}");         /* 3.0 */
    add(r, 6, "{\"decision\":\"warn\",\"peak_bytes\":100}");                          /* unknown */
    add(r, 7, "{\"decision\":\"warn\",\"peak_bytes\":100,\"usable_bytes\":0}");       /* unknown */
    o = summary(r, 0);
    ck_assert_int_eq(ival(o, "peak_usable_ratio", "records"), 5);
    ck_assert_int_eq(ival(o, "peak_usable_ratio", "unknown"), 2);
    bins = path(o, "peak_usable_ratio", "bins");
    ck_assert_uint_eq(json_object_array_length(bins), 9);
    ck_assert_int_eq(ival(json_object_array_get_idx(bins, 0), "count", NULL), 1); /* <= 0.5 */
    ck_assert_int_eq(ival(json_object_array_get_idx(bins, 3), "count", NULL), 1); /* 0.9-1.0 */
    ck_assert_str_eq(json_object_get_string(path(json_object_array_get_idx(bins, 3), "bin", NULL)),
                     "0.90-1.00");
    ck_assert_int_eq(ival(json_object_array_get_idx(bins, 6), "count", NULL), 2); /* 1.25-1.5 */
    ck_assert_int_eq(ival(json_object_array_get_idx(bins, 8), "count", NULL), 1); /* > 2 */
    ck_assert_double_eq_tol(json_object_get_double(path(o, "peak_usable_ratio", "max")), 3.0, 1e-9);
    specs = path(o, "top_rejected_specs", NULL);
    ck_assert_uint_eq(json_object_array_length(specs), 2);
    s0 = json_object_array_get_idx(specs, 0);
    ck_assert_str_eq(json_object_get_string(path(s0, "spec_sha256", NULL)), "aa11");
    ck_assert_str_eq(json_object_get_string(path(s0, "spec", NULL)), "/s/a.yaml");
    ck_assert_str_eq(json_object_get_string(path(s0, "model", NULL)), "llava");
    ck_assert_int_eq(ival(s0, "rejects", NULL), 2);
    json_object_put(o);
    mm_report_free(r);
}
END_TEST

START_TEST(test_stream_and_text)
{
    static const char logtext[] =
        "{\"decision\":\"reject\",\"user\":\"eve\\u001b[31m\",\"gpus\":1,\"time_limit_minutes\":60}\n"
        "\n"
        "oops\n"
        "{\"decision\":\"accept\",\"user\":\"eve\"}";       /* no final newline */
    char buf[sizeof(logtext)];
    FILE *f;
    mm_report *r = mm_report_new();
    mm_error err;
    char *text;
    memcpy(buf, logtext, sizeof(buf));
    f = fmemopen(buf, sizeof(logtext) - 1, "r");
    ck_assert_ptr_nonnull(f);
    memset(&err, 0, sizeof(err));
    ck_assert_int_eq(mm_report_add_stream(r, f, "mem.log", &err), 0);
    fclose(f);
    ck_assert_uint_eq(mm_report_records(r), 2);
    ck_assert_uint_eq(mm_report_malformed(r), 1);
    text = mm_report_text(r, 0);
    ck_assert_ptr_nonnull(text);
    ck_assert_ptr_nonnull(strstr(text, "mem.log:3: invalid JSON"));
    ck_assert_ptr_nonnull(strstr(text, "eve?[31m"));     /* escape byte neutralised */
    ck_assert_ptr_null(strchr(text, '\x1b'));
    ck_assert_ptr_nonnull(strstr(text, "1.0 GPU-hours over 1 of 1 rejected"));
    ck_assert_ptr_nonnull(strstr(text, "Most-rejected specs"));
    free(text);
    ck_assert_int_eq(mm_report_add_file(r, "/", &err), -1);
    ck_assert_ptr_nonnull(strstr(err.msg, "directory"));
    ck_assert_int_eq(mm_report_add_file(r, "/nonexistent/mmguard.log", &err), -1);
    mm_report_free(r);
}
END_TEST

START_TEST(test_many_groups)
{
    /* the hash set grows; every user is counted once */
    mm_report *r = mm_report_new();
    char line[128];
    json_object *o;
    for (int i = 0; i < 5000; i++) {
        snprintf(line, sizeof(line), "{\"decision\":\"accept\",\"user\":\"u%d\"}", i % 1000);
        ck_assert_int_eq(add(r, (unsigned long)i + 1, line), 0);
    }
    o = summary(r, 3);
    ck_assert_int_eq(ival(o, "users_total", NULL), 1000);
    ck_assert_int_eq(ival(json_object_array_get_idx(path(o, "users", NULL), 0), "total", NULL), 5);
    json_object_put(o);
    mm_report_free(r);
}
END_TEST

Suite *report_suite(void)
{
    Suite *s = suite_create("report");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_counts);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_malformed_kept_bounded);
    tcase_add_test(tc, test_gpu_hours);
    tcase_add_test(tc, test_ratio_and_specs);
    tcase_add_test(tc, test_stream_and_text);
    tcase_add_test(tc, test_many_groups);
    suite_add_tcase(s, tc);
    return s;
}
