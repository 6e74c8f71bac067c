/* test_spec.c - loading specs (YAML and JSON) and every class of bad input:
 * each error must name file:line:col and the key, and nothing may leak. */
#include "unit.h"
#include "mmguard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A small valid spec; tests replace one line of it. */
static const char *BASE =
    "name: tiny\n"                          /* 1 */
    "modules:\n"                            /* 2 */
    "  - name: vision\n"                    /* 3 */
    "    type: vit\n"                       /* 4 */
    "    hidden_size: 64\n"                 /* 5 */
    "    num_hidden_layers: 2\n"            /* 6 */
    "    num_attention_heads: 4\n"          /* 7 */
    "    intermediate_size: 128\n"          /* 8 */
    "    image_size: 32\n"                  /* 9 */
    "    patch_size: 8\n"                   /* 10 */
    "    trainable: false\n"                /* 11 */
    "  - name: proj\n"                      /* 12 */
    "    type: mlp\n"                       /* 13 */
    "    input_size: 64\n"                  /* 14 */
    "    hidden_size: 96\n"                 /* 15 */
    "  - name: llm\n"                       /* 16 */
    "    type: llama\n"                     /* 17 */
    "    hidden_size: 96\n"                 /* 18 */
    "    num_hidden_layers: 2\n"            /* 19 */
    "    num_attention_heads: 4\n"          /* 20 */
    "    num_key_value_heads: 2\n"          /* 21 */
    "    intermediate_size: 160\n"          /* 22 */
    "    vocab_size: 1000\n"                /* 23 */
    "training:\n"                           /* 24 */
    "  micro_batch_size: 2\n"               /* 25 */
    "  seq_len: 64\n"                       /* 26 */
    "  precision: bf16\n"                   /* 27 */
    "  attention: sdpa\n";                  /* 28 */

/* BASE with line `ln` (1-based) replaced by `repl` (may hold several lines) */
static char *with_line(int ln, const char *repl)
{
    static char buf[8192];
    const char *p = BASE;
    size_t o = 0;
    for (int l = 1; *p; l++) {
        const char *e = strchr(p, '\n');
        size_t n = (size_t)(e - p) + 1;
        if (l == ln) {
            o += (size_t)snprintf(buf + o, sizeof buf - o, "%s\n", repl);
        } else {
            memcpy(buf + o, p, n);
            o += n;
        }
        p += n;
    }
    buf[o] = '\0';
    return buf;
}

static void expect_error(const char *text, const char *want1, const char *want2)
{
    mm_error e = {{0}};
    mm_spec *s = mm_spec_load_buffer(text, strlen(text), "t.yaml", MM_FMT_YAML, &e);
    ck_assert_msg(s == NULL, "accepted:\n%s", text);
    ck_assert_msg(strstr(e.msg, want1) != NULL, "'%s' not in '%s'", want1, e.msg);
    if (want2)
        ck_assert_msg(strstr(e.msg, want2) != NULL, "'%s' not in '%s'", want2, e.msg);
}

START_TEST(base_loads)
{
    mm_error e;
    mm_spec *s = mm_spec_load_buffer(BASE, strlen(BASE), "t.yaml", MM_FMT_YAML, &e);
    ck_assert_msg(s != NULL, "%s", e.msg);
    ck_assert_str_eq(mm_spec_name(s), "tiny");
    ck_assert_uint_eq(mm_spec_micro_batch(s), 2);
    ck_assert_uint_eq(mm_spec_data_parallel(s), 1);
    ck_assert_int_eq(strlen(mm_spec_digest(s)), 64);
    mm_spec_free(s);
}
END_TEST

START_TEST(contrib_specs_load)
{
    const char *names[] = {"7b-pretrain", "7b-finetune", "7b-lora",
                           "13b-pretrain", "13b-finetune", "13b-lora"};
    for (size_t i = 0; i < 6; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/contrib/models/llava-1.5-%s.yaml", SRCDIR, names[i]);
        mm_error e;
        mm_spec *s = mm_spec_load_file(path, &e);
        ck_assert_msg(s != NULL, "%s", e.msg);
        mm_spec_free(s);
    }
}
END_TEST

START_TEST(json_equals_yaml)
{
    const char *json =
        "{\"name\": \"tiny\", \"modules\": [\n"
        " {\"name\": \"vision\", \"type\": \"vit\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
        "  \"num_attention_heads\": 4, \"intermediate_size\": 128, \"image_size\": 32,"
        "  \"patch_size\": 8, \"trainable\": false},\n"
        " {\"name\": \"proj\", \"type\": \"mlp\", \"input_size\": 64, \"hidden_size\": 96},\n"
        " {\"name\": \"llm\", \"type\": \"llama\", \"hidden_size\": 96, \"num_hidden_layers\": 2,"
        "  \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 160,"
        "  \"vocab_size\": 1000}],\n"
        " \"training\": {\"micro_batch_size\": 2, \"seq_len\": 64, \"precision\": \"bf16\","
        "  \"attention\": \"sdpa\"}}\n";
    mm_error e;
    mm_spec *a = mm_spec_load_buffer(json, strlen(json), "t.json", MM_FMT_AUTO, &e);
    ck_assert_msg(a != NULL, "%s", e.msg);
    mm_spec *b = mm_spec_load_buffer(BASE, strlen(BASE), "t.yaml", MM_FMT_AUTO, &e);
    ck_assert_msg(b != NULL, "%s", e.msg);
    mm_prediction pa, pb;
    ck_assert_int_eq(mm_predict(a, &pa, &e), 0);
    ck_assert_int_eq(mm_predict(b, &pb, &e), 0);
    ck_assert_uint_eq(pa.allocated_peak_bytes, pb.allocated_peak_bytes);
    ck_assert_uint_eq(pa.peak_bytes, pb.peak_bytes);
    mm_prediction_free(&pa);
    mm_prediction_free(&pb);
    mm_spec_free(a);
    mm_spec_free(b);
}
END_TEST

START_TEST(json_errors)
{
    mm_error e;
    const char *dup = "{\"name\": \"a\",\n \"name\": \"b\"}";
    ck_assert_ptr_null(mm_spec_load_buffer(dup, strlen(dup), "d.json", MM_FMT_JSON, &e));
    ck_assert_msg(strstr(e.msg, "d.json:2:2: name: duplicate key"), "%s", e.msg);
    const char *bad = "{\"name\": \"a\",\n \"modules\": [1, 2,]}";
    ck_assert_ptr_null(mm_spec_load_buffer(bad, strlen(bad), "b.json", MM_FMT_JSON, &e));
    ck_assert_msg(strstr(e.msg, "b.json:2:") && strstr(e.msg, "malformed JSON"), "%s", e.msg);
    const char *type = "{\"name\": \"a\", \"modules\": [{\"name\": \"l\", \"type\": \"llama\","
                       "\n \"hidden_size\": \"64\"}], \"training\": {}}";
    ck_assert_ptr_null(mm_spec_load_buffer(type, strlen(type), "t.json", MM_FMT_JSON, &e));
    ck_assert_msg(strstr(e.msg, "t.json:2:17: l.hidden_size: expected an integer"), "%s", e.msg);
}
END_TEST

/* Each entry: line to replace, replacement, expected substrings. */
static const struct {
    int line;
    const char *repl, *want1, *want2;
} cases[] = {
    {26, "  seq_lenght: 64", "t.yaml:26:3: training.seq_lenght: unknown key", "did you mean 'seq_len'"},
    {5, "    hiden_size: 64", "t.yaml:5:5: vision.hiden_size: unknown key", "'hidden_size'"},
    {25, "  micro_batch_size: two", "t.yaml:25:21: training.micro_batch_size", "expected an integer"},
    {25, "  micro_batch_size: 0", "training.micro_batch_size", "out of range"},
    {25, "  micro_batch_size: -4", "training.micro_batch_size", "out of range"},
    {25, "  micro_batch_size: \"8\"", "expected an integer", NULL},
    {27, "  precision: bf61", "t.yaml:27:14: training.precision: unknown value 'bf61'", "did you mean 'bf16'"},
    {20, "    num_attention_heads: 5", "llm.num_attention_heads", "do not divide hidden_size 96"},
    {21, "    num_key_value_heads: 3", "llm.num_key_value_heads", "must divide"},
    {26, "  seq_len: 10", "training.seq_len", "shorter than the 16 image tokens"},
    {10, "    patch_size: 33", "vision.patch_size", "exceeds image_size 32"},
    {12, "  - name: vision", "vision.name", "duplicate module name"},
    {16, "  - name: training", "reserved", NULL},
    {15, "    hidden_size: 97", "proj.hidden_size", "does not match the decoder's hidden_size 96"},
    {14, "    input_size: 65", "proj.input_size", "does not match the vision output width 64"},
    {23, "    vocab_size: 100000000000", "llm.vocab_size", "out of range"},
    {18, "    hidden_size: 1e400", "expected an integer", NULL},
    {11, "    trainable: maybe", "vision.trainable", "expected true or false"},
    {13, "    type: conv", "proj.type: unknown value 'conv'", NULL},
    {4, "    image_size: 32", "t.yaml:9:5: image_size: duplicate key", NULL},
    {24, "trainin:", "unknown key", "did you mean 'training'"},
    {22, "    vocab_size: 1000", "duplicate key", NULL},
    {22, "    intermediate_size: [1, 2]", "llm.intermediate_size: expected a value, got a list", NULL},
    {18, "    hidden_size: ~", "got null", NULL},
    {5, "    hidden_size: 64\n    vocab_size: 10", "vision.vocab_size: does not apply to a vit module", NULL},
    {17, "    type: llama\n    lora: {r: 8, target_modules: [q_proj]}", "LoRA adapts a frozen base", NULL},
    {17, "    type: llama\n    trainable: false\n    lora: {r: 8, target_modules: [qproj]}",
     "'qproj' is not a linear layer", "did you mean 'q_proj'"},
    {17, "    type: llama\n    trainable: false\n    lora: {target_modules: [q_proj]}",
     "llm.lora.r: required key is missing", NULL},
    {28, "  attention: &x sdpa\n  optimizer: *x", "aliases (*x) are not supported", NULL},
    {28, "  attention: [sdpa", "malformed YAML", NULL},
    {28, "  zero_stage: 4", "training.zero_stage", "out of range"},
};

START_TEST(error_messages)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_error(with_line(cases[i].line, cases[i].repl), cases[i].want1, cases[i].want2);
}
END_TEST

START_TEST(missing_keys)
{
    expect_error("name: x\n", "modules: required key is missing", NULL);
    expect_error("modules: []\n", "name: required key is missing", NULL);
    expect_error("name: x\nmodules: []\ntraining: {}\n", "modules: expected a non-empty list", NULL);
    expect_error(with_line(25, "  images_per_sample: 1"), "training.micro_batch_size: required key is missing", NULL);
    expect_error(with_line(16, "  - tie_word_embeddings: false"), "modules[2]: required key 'name' is missing", NULL);
    expect_error("- a\n- b\n", "a spec is a mapping", NULL);
    expect_error("", "empty document", NULL);
    expect_error("name: x\n---\nname: y\n", "only one YAML document", NULL);
}
END_TEST

START_TEST(module_order)
{
    const char *t = "name: x\nmodules:\n"
                    "  - {name: l, type: llama, hidden_size: 64, num_hidden_layers: 1,"
                    " num_attention_heads: 4, intermediate_size: 64, vocab_size: 100}\n"
                    "  - {name: p, type: mlp, input_size: 64, hidden_size: 64}\n"
                    "training: {micro_batch_size: 1, seq_len: 8, images_per_sample: 0}\n";
    /* the list order is free: the step runs vision -> connector -> decoder */
    mm_error e;
    mm_spec *s = mm_spec_load_buffer(t, strlen(t), "t.yaml", MM_FMT_YAML, &e);
    ck_assert_msg(s != NULL, "%s", e.msg);
    mm_spec_free(s);
    const char *nollm = "name: x\nmodules:\n"
                        "  - {name: p, type: mlp, input_size: 64, hidden_size: 64}\n"
                        "training: {micro_batch_size: 1, seq_len: 8}\n";
    expect_error(nollm, "a decoder (language model) module is required", NULL);
}
END_TEST

START_TEST(set_overrides)
{
    mm_error e;
    mm_spec *s = mm_spec_load_buffer(BASE, strlen(BASE), "t.yaml", MM_FMT_YAML, &e);
    ck_assert_ptr_nonnull(s);
    mm_prediction p0, p1;
    ck_assert_int_eq(mm_predict(s, &p0, &e), 0);
    ck_assert_int_eq(mm_spec_set(s, "training.micro_batch_size=8", &e), 0);
    ck_assert_uint_eq(mm_spec_micro_batch(s), 8);
    ck_assert_int_eq(mm_spec_set(s, "llm.num_hidden_layers=6", &e), 0);
    ck_assert_int_eq(mm_predict(s, &p1, &e), 0);
    ck_assert_uint_gt(p1.allocated_peak_bytes, p0.allocated_peak_bytes);
    ck_assert_uint_eq(p1.modules[2].parameters_count - p0.modules[2].parameters_count,
                      4 * (p0.modules[2].parameters_count - 2 * 96 * 1000 - 96) / 2);
    mm_prediction_free(&p0);
    mm_prediction_free(&p1);
    /* lists and new sections */
    ck_assert_int_eq(mm_spec_set(s, "llm.trainable=false", &e), 0);
    ck_assert_msg(mm_spec_set(s, "llm.lora={r: 4, target_modules: [q_proj, v_proj]}", &e) == 0, "%s", e.msg);
    ck_assert_int_eq(mm_spec_set(s, "device.cuda_context=1GiB", &e), 0);
    ck_assert_int_eq(mm_spec_set(s, "deepspeed.reduce_bucket_size=5e8", &e), 0);
    /* errors leave the spec unchanged */
    ck_assert_int_ne(mm_spec_set(s, "training.micro_batch_size=0", &e), 0);
    ck_assert_msg(strstr(e.msg, "--set training.micro_batch_size=0") && strstr(e.msg, "out of range"), "%s", e.msg);
    ck_assert_uint_eq(mm_spec_micro_batch(s), 8);
    ck_assert_int_ne(mm_spec_set(s, "lm.hidden_size=8", &e), 0);
    ck_assert_msg(strstr(e.msg, "did you mean 'llm'"), "%s", e.msg);
    ck_assert_int_ne(mm_spec_set(s, "training.micro_batch=3", &e), 0);
    ck_assert_msg(strstr(e.msg, "did you mean 'micro_batch_size'"), "%s", e.msg);
    ck_assert_int_ne(mm_spec_set(s, "novalue", &e), 0);
    ck_assert_int_ne(mm_spec_set(s, "training.seq_len=", &e), 0);
    ck_assert_int_ne(mm_spec_set(s, "training=3", &e), 0);
    mm_spec *c = mm_spec_clone(s);
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(mm_spec_set(c, "training.micro_batch_size=1", &e), 0);
    ck_assert_uint_eq(mm_spec_micro_batch(s), 8);
    mm_spec_free(c);
    mm_spec_free(s);
}
END_TEST

START_TEST(file_errors)
{
    mm_error e;
    ck_assert_ptr_null(mm_spec_load_file("/nonexistent/spec.yaml", &e));
    ck_assert_msg(strstr(e.msg, "/nonexistent/spec.yaml: cannot open"), "%s", e.msg);
    ck_assert_ptr_null(mm_spec_load_file("/tmp", &e));
    ck_assert_msg(strstr(e.msg, "/tmp: not a regular file"), "%s", e.msg);
    char big[64];
    ck_assert_ptr_null(mm_spec_load_buffer(big, MM_MAX_SPEC_BYTES + 1, "big.yaml", MM_FMT_YAML, &e));
    ck_assert_msg(strstr(e.msg, "big.yaml: spec is") && strstr(e.msg, "limit"), "%s", e.msg);
    ck_assert_ptr_null(mm_spec_load_buffer("name: a\0b", 9, "nul.yaml", MM_FMT_YAML, &e));
    ck_assert_msg(strstr(e.msg, "NUL byte"), "%s", e.msg);
}
END_TEST

Suite *spec_suite(void)
{
    Suite *s = suite_create("spec");
    TCase *tc = tcase_create("spec");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, base_loads);
    tcase_add_test(tc, contrib_specs_load);
    tcase_add_test(tc, json_equals_yaml);
    tcase_add_test(tc, json_errors);
    tcase_add_test(tc, error_messages);
    tcase_add_test(tc, missing_keys);
    tcase_add_test(tc, module_order);
    tcase_add_test(tc, set_overrides);
    tcase_add_test(tc, file_errors);
    suite_add_tcase(s, tc);
    return s;
}
