/* test_import.c - the readers of a job's other files, on buffers: DeepSpeed
 * "auto" resolved as transformers does (h*h, int(0.9*h*h), 10*h, the trainer
 * values) and its refusals, command-line flags split as a shell does, TRL and
 * LLaMA-Factory defaults, the rules for unmapped keys, the catalog. */
#include "unit.h"
#include "import.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static imp_spec *S;
static imp_job J;

/* a text-only model of width h (a LLaMA config.json) */
static void model(uint64_t h)
{
    char cfg[256];
    mm_error e;
    snprintf(cfg, sizeof cfg, "{\"model_type\": \"llama\", \"hidden_size\": %llu, "
             "\"num_attention_heads\": 8, \"intermediate_size\": 64, \"num_hidden_layers\": 2, "
             "\"vocab_size\": 100}", (unsigned long long)h);
    S = calloc(1, sizeof *S);
    ck_assert_ptr_nonnull(S);
    imp_init(S);
    imp_job_init(&J, S);
    ck_assert_msg(imp_hf_buffer(S, cfg, strlen(cfg), "config.json", NULL, 0, NULL, &e) == 0, "%s",
                  e.msg);
    J.have_model = 1;
}

static void done(void)
{
    free(S);
    S = NULL;
}

static const char *ds_key(const char *key)
{
    const char *v = imp_get(&S->deepspeed, key);
    return v ? v : "(absent)";
}

static const char *tr_key(const char *key)
{
    const char *v = imp_get(&S->training, key);
    return v ? v : "(absent)";
}

static int ds(const char *json, mm_error *e)
{
    return imp_deepspeed_buffer(&J, json, strlen(json), "ds.json", e);
}

static const char *Z3AUTO = "{\"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": "
                            "\"auto\", \"stage3_prefetch_bucket_size\": \"auto\", "
                            "\"stage3_param_persistence_threshold\": \"auto\"}}";

START_TEST(ds_auto_hidden)
{
    /* Python: h*h, int(0.9 * h * h), 10 * h */
    static const struct { uint64_t h; const char *rb, *pf, *pt; } c[] = {
        {4096, "16777216", "15099494", "40960"}, {3584, "12845056", "11560550", "35840"},
        {5120, "26214400", "23592960", "51200"}, {8192, "67108864", "60397977", "81920"},
        {1280, "1638400", "1474560", "12800"},   {13, "169", "152", "130"}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        mm_error e;
        model(c[i].h);
        ck_assert_msg(ds(Z3AUTO, &e) == 0, "%s", e.msg);
        ck_assert_str_eq(ds_key("reduce_bucket_size"), c[i].rb);
        ck_assert_str_eq(ds_key("stage3_prefetch_bucket_size"), c[i].pf);
        ck_assert_str_eq(ds_key("stage3_param_persistence_threshold"), c[i].pt);
        ck_assert_str_eq(tr_key("zero_stage"), "3");
        ck_assert_str_eq(ds_key("overlap_comm"), "true"); /* DeepSpeed: true at stage 3 */
        ck_assert_str_eq(ds_key("stage3_max_live_parameters"), "1000000000");
        ck_assert_ptr_null(imp_get(&S->training, "data_parallel"));
        done();
    }
}
END_TEST

START_TEST(ds_auto_trainer)
{
    mm_error e;
    model(64);
    J.trainer = 1;
    J.micro_batch = 4;
    J.grad_accum = 3;
    J.max_grad_norm = 0.5;
    J.bf16 = 1;
    const char *cfg = "{\"train_micro_batch_size_per_gpu\": \"auto\", \"gradient_accumulation_steps"
                      "\": \"auto\", \"gradient_clipping\": \"auto\", \"bf16\": {\"enabled\": "
                      "\"auto\"}, \"fp16\": {\"enabled\": \"auto\", \"loss_scale\": 0}, "
                      "\"zero_optimization\": {\"stage\": 2}}";
    ck_assert_msg(ds(cfg, &e) == 0, "%s", e.msg);
    ck_assert_str_eq(tr_key("micro_batch_size"), "4");
    ck_assert_str_eq(tr_key("gradient_accumulation_steps"), "3");
    ck_assert_str_eq(tr_key("max_grad_norm"), "0.5");
    ck_assert_str_eq(tr_key("precision"), "bf16");
    ck_assert_str_eq(ds_key("allgather_bucket_size"), "500000000");
    ck_assert_str_eq(ds_key("reduce_bucket_size"), "500000000");
    ck_assert_str_eq(ds_key("overlap_comm"), "false"); /* DeepSpeed: false below stage 3 */
    ck_assert_str_eq(ds_key("stage3_prefetch_bucket_size"), "(absent)");
    done();
}
END_TEST

START_TEST(ds_refusals)
{
    static const struct { const char *json, *msg; } c[] = {
        {"{\"train_micro_batch_size_per_gpu\": 2,\n \"zero_optimization\": {\"stage\": 2}}",
         "ds.json:1:2: train_micro_batch_size_per_gpu: 2, but the trainer arguments"},
        {"{\"zero_optimization\": {\"stage\": 3,\n \"offload_optimizer\": {\"device\": \"nvme\"}}}",
         "ds.json:2:24: zero_optimization.offload_optimizer.device: NVMe offload"},
        {"{\"zero_optimization\": {\"stage\": 4}}", "ds.json:1:24: zero_optimization.stage: "},
        {"{\"fp16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 1}}",
         "ds.json:1:11: fp16.enabled: true, but the trainer arguments"},
        {"{\"bf16\": {\"enabled\": false}}", "stage 0"},
        {"{\"zero_optimization\": {\"stage\": 3, \"sub_group_size\": \"auto\"}}",
         "zero_optimization.sub_group_size: transformers fills \"auto\" only in"},
        {"{\"zero_optimization\": {\"stage\": 3, \"mics_shard_size\": 8}}",
         "zero_optimization.mics_shard_size: only -1 (DeepSpeed's default) is modelled"},
        {"{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\", "
         "\"pin_memory\": true}, \"offload_param\": {\"device\": \"cpu\"}}}",
         "offload_param.pin_memory: differs from the other offload's pin_memory"},
        {"[1, 2]", "a DeepSpeed config is a JSON object"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        mm_error e = {{0}};
        model(64);
        J.trainer = 1;
        snprintf(J.trainer_file, sizeof J.trainer_file, "t.json");
        ck_assert_msg(ds(c[i].json, &e) != 0, "accepted: %s", c[i].json);
        ck_assert_msg(strstr(e.msg, c[i].msg) != NULL, "'%s' lacks '%s'", e.msg, c[i].msg);
        done();
    }
}
END_TEST

/* the notes say what was assumed and ignored */
static int noted(const char *text)
{
    for (size_t i = 0; i < S->nnotes; i++)
        if (strstr(S->notes[i], text))
            return 1;
    return 0;
}

START_TEST(ds_defaults_and_notes)
{
    mm_error e;
    model(64);
    const char *cfg = "{\"zero_optimization\": {\"stage\": 3, \"stage3_max_reuse_distance\": "
                      "1000000000, \"round_robin_gradients\": true}, \"train_micro_batch_size_per_gpu\""
                      ": \"auto\", \"steps_per_print\": 10}";
    ck_assert_msg(ds(cfg, &e) == 0, "%s", e.msg);
    ck_assert_str_eq(ds_key("stage3_max_reuse_distance"), "1000000000");
    ck_assert(noted("ignored zero_optimization.round_robin_gradients: only ZeRO stage 2"));
    ck_assert(noted("ignored steps_per_print: logging"));
    ck_assert(noted("assumed train_micro_batch_size_per_gpu \"auto\" = 8"));
    ck_assert_str_eq(tr_key("micro_batch_size"), "8");
    ck_assert_str_eq(tr_key("precision"), "fp32");
    ck_assert_str_eq(ds_key("sub_group_size"), "1000000000");
    done();
}
END_TEST

START_TEST(args_shell_words)
{
    mm_error e;
    model(64);
    const char *a = "torchrun train.py \\\n  --per_device_train_batch_size=3 --bf16 \\\n"
                    "  --max_length '4096' --gradient_checkpointing \"True\" # a comment\n"
                    "  --report_to none --packing";
    ck_assert_msg(imp_args_buffer(&J, a, strlen(a), "run.sh", &e) == 0, "%s", e.msg);
    ck_assert_str_eq(tr_key("micro_batch_size"), "3");
    ck_assert_str_eq(tr_key("precision"), "bf16");
    ck_assert_str_eq(tr_key("seq_len"), "4096");
    ck_assert_str_eq(tr_key("gradient_checkpointing"), "true");
    ck_assert_str_eq(tr_key("packing"), "true");
    ck_assert(J.sft); /* max_length and packing are SFTConfig's */
    ck_assert(noted("ignored the words before the first --flag in run.sh"));
    ck_assert(noted("ignored report_to: logging"));
    done();
    static const struct { const char *args, *msg; } bad[] = {
        {"--bf16 True\n  --per_device_train_batch_size four", "run.sh:2:3: per_device_train_batch_size: expected"},
        {"--bf16 True stray", "run.sh:1:13: 'stray': expected a --flag"},
        {"--optim \"adamw", "unterminated quote"},
        {"--gradient_checkpointing maybe", "run.sh:1:1: gradient_checkpointing: expected true or false"},
        {"--fp16 --bf16", "bf16: bf16 and fp16 are both set"},
        {"--max_length 10 --model_max_length 20", "model_max_length: the sequence length is also given as max_length"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        model(64);
        mm_error e2 = {{0}};
        ck_assert_msg(imp_args_buffer(&J, bad[i].args, strlen(bad[i].args), "run.sh", &e2) != 0,
                      "accepted %s", bad[i].args);
        ck_assert_msg(strstr(e2.msg, bad[i].msg) != NULL, "'%s' lacks '%s'", e2.msg, bad[i].msg);
        done();
    }
}
END_TEST

START_TEST(trainer_defaults)
{
    mm_error e;
    model(64);
    const char *sft = "max_length: 512\nper_device_train_batch_size: 2\n";
    ck_assert_msg(imp_trainer_buffer(&J, sft, strlen(sft), "sft.yaml", 0, &e) == 0, "%s", e.msg);
    ck_assert_str_eq(tr_key("gradient_checkpointing"), "true"); /* SFTConfig's default */
    ck_assert_str_eq(tr_key("precision"), "bf16");              /* bf16 None -> not fp16 */
    ck_assert_str_eq(tr_key("optimizer_impl"), "fused");        /* adamw_torch_fused */
    done();
    model(64);
    const char *hf = "{\"per_device_train_batch_size\": 2, \"optim\": \"adafactor\"}";
    ck_assert_msg(imp_trainer_buffer(&J, hf, strlen(hf), "ta.json", 1, &e) == 0, "%s", e.msg);
    ck_assert_str_eq(tr_key("gradient_checkpointing"), "false");
    ck_assert_str_eq(tr_key("precision"), "fp32");
    ck_assert_str_eq(tr_key("optimizer"), "adafactor");
    ck_assert_str_eq(tr_key("seq_len"), "(absent)"); /* TrainingArguments has none */
    done();
}
END_TEST

START_TEST(llamafactory_defaults)
{
    mm_error e;
    model(64);
    const char *y = "model_name_or_path: ignored/by-have-model\nlora_rank: 4\nbf16: true\n"
                    "per_device_train_batch_size: 1\nmax_length: 99\n";
    ck_assert_msg(imp_llamafactory_buffer(&J, y, strlen(y), "lf.yaml", &e) == 0, "%s", e.msg);
    imp_section *d = &S->mod[0];
    ck_assert_str_eq(imp_get(d, "lora"), "{r: 4, alpha: 8, dropout: 0, target_modules: all-linear}");
    ck_assert_str_eq(imp_get(d, "trainable"), "false");
    ck_assert_str_eq(tr_key("gradient_checkpointing"), "{enabled: true, use_reentrant: true}");
    ck_assert_str_eq(tr_key("seq_len"), "2048"); /* cutoff_len; max_length is generation's */
    ck_assert_str_eq(tr_key("attention"), "sdpa");
    ck_assert(noted("ignored max_length: inference and export only"));
    done();
}
END_TEST

START_TEST(unset_and_catalog)
{
    model(64);
    size_t n0 = S->training.n; /* the model's own (use_cache) */
    imp_set(&S->training, "a", "", "1");
    imp_set(&S->training, "b", "", "2");
    imp_set(&S->training, "c", "", "3");
    imp_unset(&S->training, "b");
    ck_assert_uint_eq(S->training.n, n0 + 2);
    ck_assert_str_eq(imp_get(&S->training, "c"), "3");
    done();
    char dir[] = "/tmp/mmguard-catXXXXXX", path[1100], file[1100];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(file, sizeof file, "%s/catalog.txt", dir);
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fputs("# ids\n\n  org/model-a   a.yaml\norg/model-b /abs/b\n", f);
    fclose(f);
    mm_error e;
    ck_assert_int_eq(imp_catalog_find(dir, "org/model-a", path, sizeof path, &e), 1);
    ck_assert(strstr(path, "/a.yaml") && !strncmp(path, dir, strlen(dir)));
    ck_assert_int_eq(imp_catalog_find(dir, "org/model-b", path, sizeof path, &e), 1);
    ck_assert_str_eq(path, "/abs/b");
    ck_assert_int_eq(imp_catalog_find(dir, "org/model-c", path, sizeof path, &e), 0);
    f = fopen(file, "w");
    fputs("a b c\n", f);
    fclose(f);
    ck_assert_int_eq(imp_catalog_find(dir, "a", path, sizeof path, &e), -1);
    ck_assert(strstr(e.msg, "catalog.txt:1:1: expected 'HF-ID FILE'"));
    unlink(file);
    rmdir(dir);
}
END_TEST

/* LLaVA's published zero3.json, kept in the repository (tests/fixtures/import/SOURCES.md) */
START_TEST(published_zero3)
{
    const char *p = SRCDIR "/tests/fixtures/import/llava-scripts/zero3.json";
    ck_assert_msg(access(p, R_OK) == 0, "%s missing", p);
    mm_error e;
    model(4096);
    J.trainer = 1;
    J.micro_batch = 16;
    J.bf16 = 1;
    ck_assert_msg(imp_deepspeed(&J, p, &e) == 0, "%s", e.msg);
    ck_assert_str_eq(ds_key("reduce_bucket_size"), "16777216");
    ck_assert_str_eq(ds_key("stage3_prefetch_bucket_size"), "15099494");
    ck_assert_str_eq(tr_key("micro_batch_size"), "16");
    ck_assert_str_eq(tr_key("precision"), "bf16");
    done();
}
END_TEST

Suite *import_suite(void)
{
    Suite *s = suite_create("import");
    TCase *tc = tcase_create("readers");
    tcase_add_test(tc, ds_auto_hidden);
    tcase_add_test(tc, ds_auto_trainer);
    tcase_add_test(tc, ds_refusals);
    tcase_add_test(tc, ds_defaults_and_notes);
    tcase_add_test(tc, args_shell_words);
    tcase_add_test(tc, trainer_defaults);
    tcase_add_test(tc, llamafactory_defaults);
    tcase_add_test(tc, unset_and_catalog);
    tcase_add_test(tc, published_zero3);
    suite_add_tcase(s, tc);
    return s;
}
