/* test_hardening.c - hostile-input limits of the spec loader and predictor, and
 * regressions for what the fuzzers (tests/fuzz/) found.  Every refusal must be
 * an error that names the file, never a crash, a hang or a wrapped number. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "mmguard.h"

Suite *hardening_suite(void);

/* A small valid spec; %s slots: extra module keys for language_model, training extras. */
#define VALID_FMT                                                                            \
    "name: t\n"                                                                              \
    "modules:\n"                                                                             \
    "  - name: language_model\n"                                                             \
    "    type: llama\n"                                                                      \
    "    hidden_size: %s\n"                                                                  \
    "    num_hidden_layers: %s\n"                                                            \
    "    num_attention_heads: 32\n"                                                          \
    "    intermediate_size: 11008\n"                                                         \
    "    vocab_size: %s\n"                                                                   \
    "training:\n"                                                                            \
    "  micro_batch_size: %s\n"                                                               \
    "  seq_len: %s\n"

static char *fmt_spec(const char *hidden, const char *layers, const char *vocab,
                      const char *mb, const char *seq)
{
    size_t n = strlen(VALID_FMT) + strlen(hidden) + strlen(layers) + strlen(vocab) +
               strlen(mb) + strlen(seq) + 1;
    char *s = malloc(n);
    ck_assert_ptr_nonnull(s);
    snprintf(s, n, VALID_FMT, hidden, layers, vocab, mb, seq);
    return s;
}

/* Load from memory; expect a refusal whose message names the file and contains `what`. */
static void expect_refused(const char *buf, size_t len, const char *name, mm_format fmt,
                           const char *what)
{
    mm_error e;
    memset(&e, 'x', sizeof e);
    mm_spec *s = mm_spec_load_buffer(buf, len, name, fmt, &e);
    if (s)
        mm_spec_free(s);
    ck_assert_msg(s == NULL, "%s was accepted", name);
    ck_assert_msg(memchr(e.msg, '\0', sizeof e.msg) != NULL, "unterminated error");
    ck_assert_msg(strstr(e.msg, name) != NULL, "error does not name the file: %s", e.msg);
    if (what)
        ck_assert_msg(strstr(e.msg, what) != NULL, "expected '%s' in: %s", what, e.msg);
}

static mm_spec *load_ok(const char *buf, const char *name, mm_format fmt)
{
    mm_error e;
    mm_spec *s = mm_spec_load_buffer(buf, strlen(buf), name, fmt, &e);
    ck_assert_msg(s != NULL, "%s refused: %s", name, e.msg);
    return s;
}

/* ---- the baseline is valid -------------------------------------------------- */

START_TEST(test_baseline_valid)
{
    char *y = fmt_spec("4096", "32", "32000", "1", "2048");
    mm_spec *s = load_ok(y, "base.yaml", MM_FMT_YAML);
    mm_prediction p;
    mm_error e;
    ck_assert_int_eq(mm_predict(s, &p, &e), 0);
    ck_assert_uint_gt(p.peak_bytes, 0);
    mm_prediction_free(&p);
    mm_spec_free(s);
    free(y);
}
END_TEST

/* ---- size ------------------------------------------------------------------- */

START_TEST(test_max_spec_bytes_buffer)
{
    /* a valid spec padded with a comment to one byte over the limit */
    size_t n = (size_t)MM_MAX_SPEC_BYTES + 1;
    char *y = fmt_spec("4096", "32", "32000", "1", "2048");
    char *buf = malloc(n);
    ck_assert_ptr_nonnull(buf);
    memset(buf, ' ', n);
    memcpy(buf, y, strlen(y));
    buf[strlen(y)] = '#';
    buf[n - 1] = '\n';
    expect_refused(buf, n, "big.yaml", MM_FMT_YAML, "limit");
    /* exactly at the limit it is not refused for its size */
    mm_error e;
    mm_spec *s = mm_spec_load_buffer(buf, n - 1, "big.yaml", MM_FMT_YAML, &e);
    ck_assert_msg(s != NULL, "a spec of exactly MM_MAX_SPEC_BYTES refused: %s", e.msg);
    mm_spec_free(s);
    free(buf);
    free(y);
}
END_TEST

static char tmpdir[64];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mmguard-hardening-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void rm_tmpdir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

/* mm_spec_load_file in a child, so that a hang fails the test instead of
 * hanging the suite (CK_FORK=no included).  Returns what the child wrote:
 * "OK" or "ERR <message>". */
static int child_is_config;

static void load_file_child(const char *path, char *out, size_t n)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        char msg[1200];
        int len;
        if (child_is_config) {
            struct mmg_config c;
            char cerr[1024] = "";
            mmg_config_defaults(&c);
            int rc = mmg_config_load_file(&c, path, cerr, sizeof cerr);
            len = snprintf(msg, sizeof msg, "%s %s", rc == 0 ? "OK" : "ERR", rc == 0 ? "" : cerr);
        } else {
            mm_error e;
            mm_spec *s = mm_spec_load_file(path, &e);
            len = snprintf(msg, sizeof msg, "%s %s", s ? "OK" : "ERR", s ? "" : e.msg);
            mm_spec_free(s);
        }
        if (len < 0 || write(fds[1], msg, (size_t)len) != len)
            _exit(3);
        _exit(0);
    }
    close(fds[1]);
    int status = 0, done = 0;
    for (int i = 0; i < 500 && !done; i++) { /* 5 s */
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            done = 1;
        else {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    if (!done) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        close(fds[0]);
        ck_abort_msg("loading %s hung", path);
    }
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child died on %s", path);
    ssize_t r = read(fds[0], out, n - 1);
    close(fds[0]);
    ck_assert_int_gt(r, 0);
    out[r] = '\0';
}

static void expect_file_refused(const char *path, const char *what)
{
    char out[1024];
    load_file_child(path, out, sizeof out);
    ck_assert_msg(strncmp(out, "ERR ", 4) == 0, "%s was accepted", path);
    ck_assert_msg(strstr(out, path) != NULL, "error does not name the file: %s", out);
    if (what)
        ck_assert_msg(strstr(out, what) != NULL, "expected '%s' in: %s", what, out);
}

static void write_file(const char *path, const char *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

START_TEST(test_max_spec_bytes_file)
{
    char path[128];
    make_tmpdir();
    snprintf(path, sizeof path, "%s/big.yaml", tmpdir);
    size_t n = (size_t)MM_MAX_SPEC_BYTES + 1;
    char *buf = malloc(n);
    ck_assert_ptr_nonnull(buf);
    memset(buf, '#', n);
    buf[n - 1] = '\n';
    write_file(path, buf, n);
    expect_file_refused(path, "limit");
    free(buf);
    rm_tmpdir();
}
END_TEST

START_TEST(test_fifo_refused_without_hanging)
{
    char path[128];
    make_tmpdir();
    snprintf(path, sizeof path, "%s/spec.yaml", tmpdir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    expect_file_refused(path, "not a regular file");
    rm_tmpdir();
}
END_TEST

START_TEST(test_directory_refused)
{
    make_tmpdir();
    expect_file_refused(tmpdir, "not a regular file");
    rm_tmpdir();
}
END_TEST

START_TEST(test_device_refused)
{
    /* an endless character device: refused before any read */
    expect_file_refused("/dev/zero", "not a regular file");
}
END_TEST

START_TEST(test_missing_file)
{
    expect_file_refused("/nonexistent/mmguard/spec.yaml", "cannot open");
}
END_TEST

START_TEST(test_nul_byte_buffer)
{
    char *y = fmt_spec("4096", "32", "32000", "1", "2048");
    size_t n = strlen(y);
    y[10] = '\0';
    expect_refused(y, n, "nul.yaml", MM_FMT_YAML, "NUL");
    expect_refused(y, n, "nul.json", MM_FMT_JSON, "NUL");
    free(y);
}
END_TEST

START_TEST(test_nul_byte_file)
{
    char path[128];
    make_tmpdir();
    snprintf(path, sizeof path, "%s/nul.yaml", tmpdir);
    char *y = fmt_spec("4096", "32", "32000", "1", "2048");
    size_t n = strlen(y);
    y[n - 1] = '\0'; /* a trailing NUL, as in a binary file */
    write_file(path, y, n);
    expect_file_refused(path, "NUL");
    free(y);
    rm_tmpdir();
}
END_TEST

/* ---- structure -------------------------------------------------------------- */

static char *nested(size_t depth, char open, char close, const char *inner)
{
    size_t n = 2 * depth + strlen(inner) + 1;
    char *s = malloc(n);
    ck_assert_ptr_nonnull(s);
    memset(s, open, depth);
    memcpy(s + depth, inner, strlen(inner));
    memset(s + depth + strlen(inner), close, depth);
    s[n - 1] = '\0';
    return s;
}

START_TEST(test_depth_yaml)
{
    char *s = nested(MM_MAX_DEPTH + 8, '[', ']', "1");
    expect_refused(s, strlen(s), "deep.yaml", MM_FMT_YAML, "nesting");
    free(s);
    /* far deeper than any stack-based parser should recurse */
    s = nested(200000, '[', ']', "1");
    expect_refused(s, strlen(s), "deeper.yaml", MM_FMT_YAML, NULL);
    free(s);
    /* block-style nesting (indentation) too */
    char buf[8192] = "";
    size_t off = 0;
    for (int d = 0; d < MM_MAX_DEPTH + 4; d++)
        off += (size_t)snprintf(buf + off, sizeof buf - off, "%*sk%d:\n", 2 * d, "", d);
    snprintf(buf + off, sizeof buf - off, "%*sleaf: 1\n", 2 * (MM_MAX_DEPTH + 4), "");
    expect_refused(buf, strlen(buf), "block.yaml", MM_FMT_YAML, "nesting");
}
END_TEST

START_TEST(test_depth_json)
{
    char *s = nested(MM_MAX_DEPTH + 8, '[', ']', "1");
    expect_refused(s, strlen(s), "deep.json", MM_FMT_JSON, NULL);
    free(s);
    s = nested(200000, '[', ']', "1");
    expect_refused(s, strlen(s), "deeper.json", MM_FMT_JSON, NULL);
    free(s);
    /* objects: {"a":{"a":...}} */
    char buf[4096] = "";
    size_t off = 0;
    for (int d = 0; d < MM_MAX_DEPTH + 4; d++)
        off += (size_t)snprintf(buf + off, sizeof buf - off, "{\"a\":");
    off += (size_t)snprintf(buf + off, sizeof buf - off, "1");
    for (int d = 0; d < MM_MAX_DEPTH + 4; d++)
        off += (size_t)snprintf(buf + off, sizeof buf - off, "}");
    expect_refused(buf, strlen(buf), "obj.json", MM_FMT_JSON, NULL);
}
END_TEST

/* n modules; the schema allows one vit, one mlp, one llama in that order, so
 * only the first n <= 3 form a valid spec; beyond that the count limit
 * (MM_MAX_MODULES) or the type rule refuses it. */
static char *modules_spec(int n)
{
    static const char *const mods[] = {
        "{name: m0, type: vit, hidden_size: 64, num_hidden_layers: 1, num_attention_heads: 4, "
        "intermediate_size: 64, image_size: 28, patch_size: 14}",
        "{name: m1, type: mlp, input_size: 64, hidden_size: 64}",
        "{name: m2, type: llama, hidden_size: 64, num_hidden_layers: 1, num_attention_heads: 4, "
        "intermediate_size: 64, vocab_size: 100}"};
    size_t cap = (size_t)n * 200 + 256, off = 0;
    char *s = malloc(cap);
    ck_assert_ptr_nonnull(s);
    off += (size_t)snprintf(s + off, cap - off, "name: many\nmodules:\n");
    for (int i = 0; i < n; i++)
        off += (size_t)snprintf(s + off, cap - off, "  - %s\n",
                                i < 3 ? mods[i]
                                      : "{name: mx, type: mlp, input_size: 8, hidden_size: 8}");
    snprintf(s + off, cap - off, "training: {micro_batch_size: 1, seq_len: 16}\n");
    return s;
}

START_TEST(test_max_modules)
{
    char *s = modules_spec(3);
    mm_spec *sp = load_ok(s, "three.yaml", MM_FMT_YAML);
    mm_spec_free(sp);
    free(s);
    s = modules_spec(MM_MAX_MODULES + 1);
    expect_refused(s, strlen(s), "four.yaml", MM_FMT_YAML, "at most 3");
    free(s);
    /* three modules, but two connectors */
    const char *two = "name: two\nmodules:\n"
                      "  - {name: a, type: mlp, input_size: 64, hidden_size: 64}\n"
                      "  - {name: b, type: mlp, input_size: 64, hidden_size: 64}\n"
                      "  - {name: l, type: llama, hidden_size: 64, num_hidden_layers: 1, "
                      "num_attention_heads: 4, intermediate_size: 64, vocab_size: 100}\n"
                      "training: {micro_batch_size: 1, seq_len: 16}\n";
    expect_refused(two, strlen(two), "two.yaml", MM_FMT_YAML, "at most one vision encoder");
    s = modules_spec(10000);
    expect_refused(s, strlen(s), "huge.yaml", MM_FMT_YAML, NULL);
    free(s);
}
END_TEST

START_TEST(test_max_layers)
{
    char layers[32];
    snprintf(layers, sizeof layers, "%d", MM_MAX_LAYERS);
    char *y = fmt_spec("64", layers, "1000", "1", "16");
    mm_spec *s = load_ok(y, "layers.yaml", MM_FMT_YAML);
    mm_spec_free(s);
    free(y);
    snprintf(layers, sizeof layers, "%d", MM_MAX_LAYERS + 1);
    y = fmt_spec("64", layers, "1000", "1", "16");
    expect_refused(y, strlen(y), "layers.yaml", MM_FMT_YAML, "num_hidden_layers");
    free(y);
    /* 2^64 + 1 must not wrap to 1 */
    y = fmt_spec("64", "18446744073709551617", "1000", "1", "16");
    expect_refused(y, strlen(y), "wrap.yaml", MM_FMT_YAML, "num_hidden_layers");
    free(y);
    y = fmt_spec("64", "-1", "1000", "1", "16");
    expect_refused(y, strlen(y), "neg.yaml", MM_FMT_YAML, "num_hidden_layers");
    free(y);
}
END_TEST

START_TEST(test_billion_laughs)
{
    static const char lol[] =
        "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
        "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
        "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
        "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
        "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n"
        "h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
        "i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]\n";
    expect_refused(lol, sizeof lol - 1, "lol.yaml", MM_FMT_YAML, "alias");
    /* a single alias inside a valid spec, and a merge key, are refused too */
    static const char one[] =
        "name: t\n"
        "modules:\n"
        "  - &m {name: p, type: mlp, input_size: 8, hidden_size: 8}\n"
        "training: {micro_batch_size: 1, seq_len: 16}\n"
        "device: *m\n";
    expect_refused(one, sizeof one - 1, "alias.yaml", MM_FMT_YAML, "alias");
    static const char merge[] =
        "name: t\n"
        "base: &b {micro_batch_size: 1, seq_len: 16}\n"
        "training: {<<: *b}\n";
    expect_refused(merge, sizeof merge - 1, "merge.yaml", MM_FMT_YAML, NULL);
}
END_TEST

START_TEST(test_node_count)
{
    /* ~500k scalars in < 1 MiB: refused, not built */
    size_t n = (size_t)MM_MAX_SPEC_BYTES - 16, off = 0;
    char *s = malloc(n + 1);
    ck_assert_ptr_nonnull(s);
    s[off++] = '[';
    while (off + 3 < n) {
        s[off++] = '0';
        s[off++] = ',';
    }
    s[off++] = '0';
    s[off++] = ']';
    s[off] = '\0';
    expect_refused(s, off, "wide.yaml", MM_FMT_YAML, NULL);
    expect_refused(s, off, "wide.json", MM_FMT_JSON, NULL);
    free(s);
}
END_TEST

START_TEST(test_long_scalar)
{
    size_t n = 100000;
    char *s = malloc(n + 16);
    ck_assert_ptr_nonnull(s);
    memcpy(s, "name: ", 6);
    memset(s + 6, 'a', n);
    s[6 + n] = '\0';
    expect_refused(s, strlen(s), "long.yaml", MM_FMT_YAML, NULL);
    free(s);
}
END_TEST

START_TEST(test_multi_document)
{
    char *y = fmt_spec("4096", "32", "32000", "1", "2048");
    size_t n = strlen(y);
    char *two = malloc(2 * n + 8);
    ck_assert_ptr_nonnull(two);
    snprintf(two, 2 * n + 8, "%s---\n%s", y, y);
    expect_refused(two, strlen(two), "two.yaml", MM_FMT_YAML, NULL);
    free(two);
    free(y);
}
END_TEST

/* ---- arithmetic ------------------------------------------------------------- */

/* Predict; if it succeeds the numbers must be consistent (no wrap). */
static int predict_checked(const char *y, const char *name, mm_error *e)
{
    mm_spec *s = load_ok(y, name, MM_FMT_YAML);
    mm_prediction p;
    memset(&p, 0, sizeof p);
    int rc = mm_predict(s, &p, e);
    if (rc == 0) {
        ck_assert_uint_ge(p.peak_bytes, p.allocated_peak_bytes);
        uint64_t sum = p.factors.parameters + p.factors.gradients + p.factors.optimizer_states +
                       p.factors.activations + p.factors.temporaries;
        ck_assert_uint_eq(sum, p.allocated_peak_bytes);
        mm_prediction_free(&p);
    } else {
        ck_assert_msg(e->msg[0] != '\0', "mm_predict failed without a message");
    }
    mm_spec_free(s);
    return rc;
}

START_TEST(test_overflow_max_dimensions)
{
    /* every dimension at its schema maximum: the byte counts do not fit 64 bits */
    char *y = fmt_spec("131072", "4096", "16777216", "65536", "4194304");
    mm_error e;
    int rc = predict_checked(y, "huge.yaml", &e);
    ck_assert_msg(rc != 0, "absurd dimensions predicted without an overflow error");
    ck_assert_msg(strstr(e.msg, "overflow") != NULL, "unclear error: %s", e.msg);
    ck_assert_msg(strstr(e.msg, "huge.yaml") != NULL, "error does not name the file: %s", e.msg);
    free(y);
    /* hidden, seq_len and micro-batch at their maximum, one layer: the hidden
     * states alone are 2^17 x 2^22 x 2^16 bf16 = 2^56 bytes, which fits; the
     * prediction is then either an overflow error or at least that, never a
     * wrapped small number */
    static const char *const layers[] = {"1", "2", "32", "4096"};
    for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++) {
        y = fmt_spec("131072", layers[i], "1000", "65536", "4194304");
        mm_spec *s = load_ok(y, "act.yaml", MM_FMT_YAML);
        mm_prediction p;
        memset(&p, 0, sizeof p);
        if (mm_predict(s, &p, &e) == 0) {
            ck_assert_msg(p.allocated_peak_bytes >= (1ull << 56),
                          "layers=%s: wrapped peak %llu", layers[i],
                          (unsigned long long)p.allocated_peak_bytes);
            ck_assert_uint_ge(p.peak_bytes, p.allocated_peak_bytes);
            mm_prediction_free(&p);
        } else {
            ck_assert_msg(strstr(e.msg, "overflow") != NULL, "unclear error: %s", e.msg);
            ck_assert_msg(strstr(e.msg, "act.yaml") != NULL, "error does not name the file: %s",
                          e.msg);
        }
        mm_spec_free(s);
        free(y);
    }
}
END_TEST

START_TEST(test_overflow_via_set)
{
    char *y = fmt_spec("4096", "32", "32000", "1", "2048");
    mm_spec *s = load_ok(y, "set.yaml", MM_FMT_YAML);
    mm_error e;
    ck_assert_int_eq(mm_spec_set(s, "language_model.hidden_size=131072", &e), 0);
    ck_assert_int_eq(mm_spec_set(s, "training.seq_len=4194304", &e), 0);
    ck_assert_int_eq(mm_spec_set(s, "training.micro_batch_size=65536", &e), 0);
    /* beyond the schema maximum: refused, spec unchanged */
    ck_assert_int_ne(mm_spec_set(s, "training.micro_batch_size=18446744073709551616", &e), 0);
    ck_assert_uint_eq(mm_spec_micro_batch(s), 65536);
    mm_prediction p;
    memset(&p, 0, sizeof p);
    ck_assert_int_ne(mm_predict(s, &p, &e), 0);
    ck_assert_msg(strstr(e.msg, "overflow") != NULL, "unclear error: %s", e.msg);
    mm_spec_free(s);
    free(y);
}
END_TEST

START_TEST(test_parse_size_overflow)
{
    uint64_t b = 7;
    mm_error e;
    ck_assert_int_eq(mm_parse_size("18446744073709551615", &b, &e), 0);
    ck_assert_uint_eq(b, UINT64_MAX);
    ck_assert_int_ne(mm_parse_size("18446744073709551616", &b, &e), 0);
    ck_assert_int_ne(mm_parse_size("16777216TiB", &b, &e), 0); /* 2^24 * 2^40 = 2^64 */
    ck_assert_msg(strstr(e.msg, "overflow") != NULL, "unclear error: %s", e.msg);
    ck_assert_int_eq(mm_parse_size("16777215.999TiB", &b, &e), 0);
    ck_assert_uint_lt(b, UINT64_MAX);
    ck_assert_int_ne(mm_parse_size("99999999999999999999999GiB", &b, &e), 0);
    mm_margin m;
    ck_assert_int_ne(mm_parse_margin("100%", &m, &e), 0);
    ck_assert_int_ne(mm_parse_margin("nan%", &m, &e), 0);
    ck_assert_int_ne(mm_parse_margin("1e999%", &m, &e), 0);
    ck_assert_int_ne(mm_parse_margin("-1%", &m, &e), 0);
    ck_assert_int_eq(mm_parse_margin("18446744073709551615", &m, &e), 0);
    ck_assert_uint_eq(mm_usable_bytes(80, &m), 0);
}
END_TEST

/* ---- regressions found by the fuzzers ---------------------------------------- */

/* fuzz_spec_json: json-c (non-strict) accepts a trailing comma in an object and
 * single-quoted strings; the position scanner in node.c then read past the end
 * of the buffer (heap-buffer-overflow in jadv, node.c:344).  Both must be
 * refused with a JSON error naming the file.  The buffers are malloc'd to their
 * exact length so that ASan (make check-asan) sees any overread. */
static void json_exact(const char *text, const char *name)
{
    size_t n = strlen(text);
    char *buf = malloc(n);
    ck_assert_ptr_nonnull(buf);
    memcpy(buf, text, n);
    expect_refused(buf, n, name, MM_FMT_JSON, NULL);
    free(buf);
}

START_TEST(test_regress_json_trailing_comma)
{
    json_exact("{\"name\":1,}", "trailing.json");
    json_exact("{\"name\":\"t\",\"training\":{\"seq_len\":1,}}", "trailing2.json");
}
END_TEST

START_TEST(test_regress_json_single_quotes)
{
    json_exact("{'name':1}", "squote.json");
    json_exact("{\"name\":'t'}", "squote2.json");
}
END_TEST

/* fuzz_spec_yaml/json/set: a negative value for an unsigned key ("input_size: -1")
 * evaluated (uint64_t)(-k->min) = (uint64_t)-1.0 before testing the key kind
 * (spec.c:207, UBSan float-cast-overflow; clang -fsanitize=undefined aborts,
 * gcc's does not check float casts).  Must be a range error naming key and file. */
START_TEST(test_regress_negative_unsigned)
{
    static const char y[] = "name: t\nmodules:\n"
                            "  - {name: p, type: mlp, input_size: -1, hidden_size: 8}\n"
                            "training: {micro_batch_size: 1, seq_len: 16}\n";
    expect_refused(y, sizeof y - 1, "neg.yaml", MM_FMT_YAML, "input_size");
    static const char j[] = "{\"name\":\"t\",\"modules\":[{\"name\":\"l\",\"type\":\"llama\","
                            "\"hidden_size\":64,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                            "\"intermediate_size\":64,\"vocab_size\":100}],"
                            "\"training\":{\"micro_batch_size\":-1,\"seq_len\":16}}";
    expect_refused(j, sizeof j - 1, "neg.json", MM_FMT_JSON, "micro_batch_size");
    char *y2 = fmt_spec("64", "1", "100", "1", "16");
    mm_spec *s = load_ok(y2, "ok.yaml", MM_FMT_YAML);
    free(y2);
    mm_error e;
    ck_assert_int_ne(mm_spec_set(s, "training.seq_len=-5", &e), 0);
    ck_assert_msg(strstr(e.msg, "seq_len") != NULL, "unclear error: %s", e.msg);
    mm_spec_free(s);
}
END_TEST

/* fuzz_spec_yaml (invariant check in tests/fuzz/fuzz_common.h): mmguard.h says
 * parameters + gradients + optimizer_states + activations + temporaries ==
 * allocated bytes, and the module and layer rows add up to the totals.  Found
 * off by one byte (ZeRO-2 shards rounded up per factor, not as a whole):
 * a trainable llama, 6 layers, zero_stage 2, data_parallel 9 gave
 * allocated 25640 but factors summing to 25641. */
static uint64_t fsum(const mm_factors *f)
{
    return f->parameters + f->gradients + f->optimizer_states + f->activations + f->temporaries;
}

static void check_sums(const char *y, const char *name)
{
    mm_spec *s = load_ok(y, name, MM_FMT_YAML);
    mm_prediction p;
    mm_error e;
    ck_assert_msg(mm_predict(s, &p, &e) == 0, "%s: %s", name, e.msg);
    ck_assert_msg(fsum(&p.factors) == p.allocated_peak_bytes,
                  "%s: factors add up to %llu, allocated peak is %llu", name,
                  (unsigned long long)fsum(&p.factors),
                  (unsigned long long)p.allocated_peak_bytes);
    uint64_t mp = 0, mf = 0, rows = 0;
    for (size_t m = 0; m < p.n_modules; m++) {
        const mm_module_result *M = &p.modules[m];
        uint64_t lp = 0, lf = 0;
        for (size_t l = 0; l < M->n_layers; l++) {
            lp += M->layers[l].parameters_count;
            lf += fsum(&M->layers[l].factors);
        }
        /* rows are rounded up separately when ZeRO shards do not divide evenly:
         * allow one byte per factor per row, never more */
        uint64_t slack = 5 * (uint64_t)M->n_layers;
        ck_assert_msg(lp == M->parameters_count, "%s: module %s layer parameters", name, M->name);
        ck_assert_msg(lf <= fsum(&M->factors) + slack && fsum(&M->factors) <= lf + slack,
                      "%s: module %s layers add up to %llu, module %llu", name, M->name,
                      (unsigned long long)lf, (unsigned long long)fsum(&M->factors));
        rows += M->n_layers;
        mp += M->parameters_count;
        mf += fsum(&M->factors);
    }
    ck_assert_msg(mp == p.parameters_count, "%s: module parameters add up to %llu, total %llu",
                  name, (unsigned long long)mp, (unsigned long long)p.parameters_count);
    ck_assert_msg(mf <= p.allocated_peak_bytes + 5 * rows && p.allocated_peak_bytes <= mf + 5 * rows,
                  "%s: module factors add up to %llu, allocated peak is %llu", name,
                  (unsigned long long)mf, (unsigned long long)p.allocated_peak_bytes);
    mm_prediction_free(&p);
    mm_spec_free(s);
}

START_TEST(test_regress_factor_sum_zero_sharding)
{
    static const char *const dps[] = {"1", "2", "3", "7", "9", "1000"};
    for (int z = 0; z <= 3; z++) {
        for (size_t i = 0; i < sizeof dps / sizeof dps[0]; i++) {
            char y[512], name[64];
            snprintf(y, sizeof y,
                     "name: n\nmodules:\n"
                     "  - {name: v, type: llama, hidden_size: 4, num_hidden_layers: 6,\n"
                     "     num_attention_heads: 2, intermediate_size: 8, vocab_size: 3}\n"
                     "training: {micro_batch_size: 3, seq_len: 6, zero_stage: %d,\n"
                     "           data_parallel: %s}\n", z, dps[i]);
            snprintf(name, sizeof name, "zero%d-dp%s.yaml", z, dps[i]);
            check_sums(y, name);
        }
    }
}
END_TEST

/* ---- plugin configuration (spank_plugin/config.c, runs as root) ---------------- */

static void expect_conf_refused(const char *path, const char *what)
{
    child_is_config = 1;
    expect_file_refused(path, what);
    child_is_config = 0;
}

static void conf_file(const char *name, const char *buf, size_t len, char *path, size_t n)
{
    snprintf(path, n, "%s/%s", tmpdir, name);
    write_file(path, buf, len);
}

START_TEST(test_config_special_files)
{
    char path[128];
    make_tmpdir();
    snprintf(path, sizeof path, "%s/mmguard.conf", tmpdir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    expect_conf_refused(path, "not a regular file");
    expect_conf_refused(tmpdir, "not a regular file");
    expect_conf_refused("/dev/zero", "not a regular file");
    expect_conf_refused("relative.conf", "absolute");
    rm_tmpdir();
}
END_TEST

START_TEST(test_config_hostile_content)
{
    char path[128];
    make_tmpdir();
    /* NUL byte */
    static const char nul[] = "action=warn\n\0margin=10%\n";
    conf_file("nul.conf", nul, sizeof nul - 1, path, sizeof path);
    expect_conf_refused(path, "NUL");
    /* one byte over the size limit, made of valid comment lines */
    size_t n = MMG_CONF_MAX_BYTES + 1;
    char *big = malloc(n);
    ck_assert_ptr_nonnull(big);
    memset(big, '#', n);
    for (size_t i = 100; i < n; i += 100)
        big[i] = '\n';
    conf_file("big.conf", big, n, path, sizeof path);
    expect_conf_refused(path, "larger");
    /* exactly at the limit: accepted */
    conf_file("limit.conf", big, n - 1, path, sizeof path);
    char out[1200];
    child_is_config = 1;
    load_file_child(path, out, sizeof out);
    child_is_config = 0;
    ck_assert_msg(strncmp(out, "OK", 2) == 0, "a %u-byte config refused: %s", MMG_CONF_MAX_BYTES,
                  out);
    /* a line over the line limit */
    memset(big, '#', MMG_CONF_MAX_LINE + 10);
    big[MMG_CONF_MAX_LINE + 9] = '\n';
    conf_file("line.conf", big, MMG_CONF_MAX_LINE + 10, path, sizeof path);
    expect_conf_refused(path, "line");
    free(big);
    /* more GPU types than the table holds */
    char gpus[4096] = "";
    size_t off = 0;
    for (int i = 0; i < MMG_MAX_GPU_TYPES + 2; i++)
        off += (size_t)snprintf(gpus + off, sizeof gpus - off, "gpu.g%d=1GiB\n", i);
    conf_file("gpus.conf", gpus, off, path, sizeof path);
    expect_conf_refused(path, "GPU types");
    /* a size that overflows 64 bits */
    static const char ovf[] = "reserve=16777216TiB\n";
    conf_file("ovf.conf", ovf, sizeof ovf - 1, path, sizeof path);
    expect_conf_refused(path, "reserve");
    rm_tmpdir();
}
END_TEST

START_TEST(test_config_long_arguments)
{
    struct mmg_config c;
    char err[256];
    size_t n = 100000;
    char *arg = malloc(n + 1);
    ck_assert_ptr_nonnull(arg);
    memcpy(arg, "log=/", 5);
    memset(arg + 5, 'a', n - 5);
    arg[n] = '\0';
    char *av[] = {arg};
    ck_assert_int_ne(mmg_config_parse_args(&c, 1, av, err, sizeof err), 0);
    ck_assert_msg(memchr(err, '\0', sizeof err) != NULL, "unterminated error");
    /* a path just below the argument limit fits MMG_PATH_MAX exactly, untruncated */
    arg[MMG_CONF_MAX_LINE - 1] = '\0';
    ck_assert_int_eq(mmg_config_parse_args(&c, 1, av, err, sizeof err), 0);
    ck_assert_uint_eq(strlen(c.log_path), MMG_CONF_MAX_LINE - 1 - 4);
    /* gpu.<long name> and default_gpu=<long name> */
    memcpy(arg, "gpu.", 4);
    memset(arg + 4, 'g', 200);
    strcpy(arg + 204, "=80GiB");
    ck_assert_int_ne(mmg_config_parse_args(&c, 1, av, err, sizeof err), 0);
    /* a tiny error buffer is still terminated */
    char small[8];
    ck_assert_int_ne(mmg_config_parse_args(&c, 1, av, small, sizeof small), 0);
    ck_assert_msg(memchr(small, '\0', sizeof small) != NULL, "unterminated error");
    free(arg);
}
END_TEST

Suite *hardening_suite(void)
{
    Suite *s = suite_create("hardening");
    TCase *t = tcase_create("limits");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_baseline_valid);
    tcase_add_test(t, test_max_spec_bytes_buffer);
    tcase_add_test(t, test_max_spec_bytes_file);
    tcase_add_test(t, test_fifo_refused_without_hanging);
    tcase_add_test(t, test_directory_refused);
    tcase_add_test(t, test_device_refused);
    tcase_add_test(t, test_missing_file);
    tcase_add_test(t, test_nul_byte_buffer);
    tcase_add_test(t, test_nul_byte_file);
    tcase_add_test(t, test_depth_yaml);
    tcase_add_test(t, test_depth_json);
    tcase_add_test(t, test_max_modules);
    tcase_add_test(t, test_max_layers);
    tcase_add_test(t, test_billion_laughs);
    tcase_add_test(t, test_node_count);
    tcase_add_test(t, test_long_scalar);
    tcase_add_test(t, test_multi_document);
    tcase_add_test(t, test_overflow_max_dimensions);
    tcase_add_test(t, test_overflow_via_set);
    tcase_add_test(t, test_parse_size_overflow);
    suite_add_tcase(s, t);
    TCase *cf = tcase_create("plugin_config");
    tcase_add_test(cf, test_config_special_files);
    tcase_add_test(cf, test_config_hostile_content);
    tcase_add_test(cf, test_config_long_arguments);
    suite_add_tcase(s, cf);
    TCase *r = tcase_create("fuzz_regressions");
    tcase_add_test(r, test_regress_json_trailing_comma);
    tcase_add_test(r, test_regress_json_single_quotes);
    tcase_add_test(r, test_regress_negative_unsigned);
    tcase_add_test(r, test_regress_factor_sum_zero_sharding);
    suite_add_tcase(s, r);
    return s;
}
