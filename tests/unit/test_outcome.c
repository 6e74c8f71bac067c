/* test_outcome.c - the job's record (spank_plugin/outcome_rec.c), written by
 * the user and read by root at the step's end: a record the Python recorder
 * wrote reads back; hostile text is refused naming the key; the file reader
 * refuses symlinks, other owners, hard links, FIFOs, oversized files; the
 * outcome line carries job, record and decision. */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>

#include "outcome_rec.h"
#include "unit.h"

static struct mmg_outcome_rec rec;
static char err[512], buf[MMG_OUTCOME_MAX + 2];

static int parse(const char *s)
{
    return mmg_outcome_parse(s, strlen(s), &rec, err, sizeof err);
}

static void read_fixture(const char *name)
{
    char path[1024];
    size_t len;
    snprintf(path, sizeof path, SRCDIR "/tests/fixtures/outcome/%s", name);
    ck_assert_int_eq(mmg_outcome_read(path, getuid(), buf, sizeof buf, &len, err, sizeof err), 0);
    ck_assert_int_eq(mmg_outcome_parse(buf, len, &rec, err, sizeof err), 0);
}

START_TEST(python_cpu_record)
{
    read_fixture("cpu-record.json");
    ck_assert_str_eq(rec.status, "done");
    ck_assert_str_eq(rec.phase, "step");
    ck_assert_uint_eq(rec.steps, 3);
    ck_assert_int_eq(rec.has_micro_batch, 1);
    ck_assert_uint_eq(rec.micro_batch, 4);
    ck_assert_uint_eq(rec.max_seq_len, 16);
    ck_assert_uint_eq(rec.host_peak_rss, 356487168);
    ck_assert_int_eq(rec.cuda, 0);
    ck_assert_int_eq(rec.has_cuda, 0);
    ck_assert_int_eq(rec.has_nvml_peak, 0);
    ck_assert_int_eq(rec.has_oom, 0);
    ck_assert_uint_eq(rec.n_absent, 2);
    ck_assert_str_eq(rec.absent[0], "cuda: no CUDA device");
}
END_TEST

START_TEST(gpu_record_with_oom)
{
    read_fixture("gpu-record.json");
    ck_assert_int_eq(rec.has_cuda, 1);
    ck_assert_uint_eq(rec.max_allocated, 70000000000ull);
    ck_assert_uint_eq(rec.max_reserved, 75000000000ull);
    ck_assert_uint_eq(rec.alloc_retries, 2);
    ck_assert_uint_eq(rec.ooms, 1);
    ck_assert_uint_eq(rec.nvml_peak_used, 77000000000ull);
    ck_assert_int_eq(rec.has_oom, 1);
    ck_assert_str_eq(rec.oom_phase, "backward");
    ck_assert_str_eq(rec.oom_kind, "cuda");
    ck_assert_uint_eq(rec.world_size, 8);
}
END_TEST

#define BASE "\"v\":1,\"status\":\"done\",\"steps\":2,\"host_peak_rss\":1,\"cuda\":false"
START_TEST(hostile_text)
{
    static const struct { const char *text, *why; } bad[] = {
        { "", "not JSON" },
        { "[1]", "not a JSON object" },
        { "{" BASE "} x", "not JSON" },
        { "{" BASE ",\"evil\":1}", "unknown key 'evil'" },
        { "{\"v\":1,\"status\":\"done\",\"steps\":2,\"cuda\":false}", "host_peak_rss: missing" },
        { "{" BASE ",\"v\":2}", "version 2" },
        { "{\"v\":1,\"status\":\"won\",\"steps\":2,\"host_peak_rss\":1,\"cuda\":false}", "status: unknown value" },
        { "{\"v\":1,\"status\":\"done\",\"steps\":-1,\"host_peak_rss\":1,\"cuda\":false}", "steps: out of range" },
        { "{\"v\":1,\"status\":\"done\",\"steps\":2,\"host_peak_rss\":1.5,\"cuda\":false}", "host_peak_rss: not an integer" },
        { "{\"v\":1,\"status\":\"done\",\"steps\":2,\"host_peak_rss\":99999999999999999999,\"cuda\":false}", "host_peak_rss" },
        { "{" BASE ",\"device\":\"a\\u001b[2Jb\"}", "device: not printable ASCII" },
        { "{" BASE ",\"max_allocated\":5}", "all or none" },
        { "{" BASE ",\"oom\":{\"phase\":\"forward\"}}", "oom: not an object" },
        { "{" BASE ",\"oom\":{\"phase\":\"x\",\"kind\":\"cuda\",\"message\":\"\"}}", "oom.phase: unknown" },
        { "{" BASE ",\"absent\":[1]}", "absent[]: not a string" },
        { "{" BASE ",\"cuda\":1}", "cuda: not true or false" },
        { "{" BASE ",\"steps\":null}", "steps: null" },
        { "{" BASE ",\"absent\":[[[[[[1]]]]]]}", "not JSON" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(parse(bad[i].text) == -1, "accepted: %s", bad[i].text);
        ck_assert_msg(strstr(err, bad[i].why) != NULL, "%s: '%s' lacks '%s'", bad[i].text, err, bad[i].why);
    }
    ck_assert_int_eq(parse("{" BASE "}\n"), 0);
    ck_assert_int_eq(mmg_outcome_parse("{" BASE "}\0", sizeof("{" BASE "}"), &rec, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "NUL"));
}
END_TEST

static void write_file(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(text, 1, len, f), len);
    fclose(f);
}

START_TEST(file_refusals)
{
    char dir[] = "/tmp/mmg-outcome-XXXXXX", p[256], q[256], *big;
    size_t len;
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/rec.json", dir);
    snprintf(q, sizeof q, "%s/link.json", dir);
    ck_assert_int_eq(mmg_outcome_read(p, getuid(), buf, sizeof buf, &len, err, sizeof err), 1);
    write_file(p, "{" BASE "}", strlen("{" BASE "}"));
    ck_assert_int_eq(mmg_outcome_read(p, getuid(), buf, sizeof buf, &len, err, sizeof err), 0);
    ck_assert_uint_eq(len, strlen("{" BASE "}"));
    ck_assert_int_eq(mmg_outcome_read(p, getuid() + 1, buf, sizeof buf, &len, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "not the job's user"));
    ck_assert_int_eq(symlink(p, q), 0);
    ck_assert_int_eq(mmg_outcome_read(q, getuid(), buf, sizeof buf, &len, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "symbolic link"));
    unlink(q);
    ck_assert_int_eq(link(p, q), 0);
    ck_assert_int_eq(mmg_outcome_read(p, getuid(), buf, sizeof buf, &len, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "hard links"));
    unlink(q);
    ck_assert_int_eq(mkfifo(q, 0600), 0);
    ck_assert_int_eq(mmg_outcome_read(q, getuid(), buf, sizeof buf, &len, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "not a regular file"));
    unlink(q);
    big = calloc(1, MMG_OUTCOME_MAX + 10);
    memset(big, ' ', MMG_OUTCOME_MAX + 9);
    write_file(p, big, MMG_OUTCOME_MAX + 9);
    free(big);
    ck_assert_int_eq(mmg_outcome_read(p, getuid(), buf, sizeof buf, &len, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "larger than"));
    unlink(p);
    rmdir(dir);
}
END_TEST

START_TEST(path_and_line)
{
    char path[256], *line;
    struct mmg_record pred;
    struct mmg_outcome_job j = { .job_id = 42, .uid = 1000, .record_state = "ok" };
    json_object *o, *m, *v;
    ck_assert_int_eq(mmg_outcome_path(NULL, 42, "batch", path, sizeof path), 0);
    ck_assert_str_eq(path, "/tmp/mmguard-record.42.batch.json");
    ck_assert_int_eq(mmg_outcome_path("/scratch/u/", 7, "0", path, sizeof path), 0);
    ck_assert_str_eq(path, "/scratch/u/mmguard-record.7.0.json");
    ck_assert_int_eq(mmg_outcome_path("rel", 7, "0", path, sizeof path), -1);
    read_fixture("gpu-record.json");
    memset(&pred, 0, sizeof pred);
    snprintf(pred.decision, sizeof pred.decision, "accept");
    snprintf(pred.model, sizeof pred.model, "llava");
    pred.peak = 60000000000ull;
    pred.usable = 76000000000ull;
    snprintf(j.step, sizeof j.step, "batch");
    j.record_path = "/tmp/x.json";
    j.rec = &rec;
    j.pred = &pred;
    line = mmg_outcome_line(&j);
    ck_assert_ptr_nonnull(line);
    ck_assert_ptr_null(strchr(line, '\n'));
    o = json_tokener_parse(line);
    ck_assert_ptr_nonnull(o);
    ck_assert(json_object_object_get_ex(o, "event", &v) && !strcmp(json_object_get_string(v), "outcome"));
    ck_assert(json_object_object_get_ex(o, "job_id", &v) && json_object_get_int64(v) == 42);
    ck_assert(json_object_object_get_ex(o, "measured", &m));
    ck_assert(json_object_object_get_ex(m, "max_reserved_bytes", &v) &&
              json_object_get_int64(v) == 75000000000ll);
    ck_assert(json_object_object_get_ex(o, "predicted", &m));
    ck_assert(json_object_object_get_ex(m, "peak_bytes", &v) && json_object_get_int64(v) == 60000000000ll);
    json_object_put(o);
    free(line);
}
END_TEST

Suite *outcome_suite(void)
{
    Suite *s = suite_create("outcome");
    TCase *tc = tcase_create("outcome");
    tcase_add_test(tc, python_cpu_record);
    tcase_add_test(tc, gpu_record_with_oom);
    tcase_add_test(tc, hostile_text);
    tcase_add_test(tc, file_refusals);
    tcase_add_test(tc, path_and_line);
    suite_add_tcase(s, tc);
    return s;
}
