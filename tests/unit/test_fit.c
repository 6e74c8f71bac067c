/* test_fit.c - the data-parallel model and fit's searches against direct
 * predictions.  mm_peak_for_dp() at a degree the allocator was replayed at
 * must be the peak a prediction made at that degree gives (ZeRO 0-3, FSDP,
 * LoRA, offload, paged states, accumulation); the shortcuts a prediction
 * takes (one simulated step for every N, the peak without its breakdown)
 * must not change a byte; fit's GPU count is the smallest one a prediction
 * at that count fits.  tests/dp/dp_exact.c does the same for every N up to
 * 4096 (make check-dp). */
#include "dp.h"
#include "predict.h"
#include "unit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mm_spec *load(const char *rel)
{
    char path[512];
    mm_error e;
    snprintf(path, sizeof path, "%s/%s", SRCDIR, rel);
    mm_spec *s = mm_spec_load_file(path, &e);
    ck_assert_msg(s != NULL, "%s", e.msg);
    return s;
}

static void set(mm_spec *s, const char *kv)
{
    mm_error e;
    ck_assert_msg(kv == NULL || mm_spec_set(s, kv, &e) == 0, "%s: %s", kv, e.msg);
}

static mm_prediction predict_at(const mm_spec *s, uint32_t n, unsigned flags)
{
    mm_spec *c = mm_spec_clone(s);
    char kv[48];
    mm_prediction p;
    mm_error e;
    snprintf(kv, sizeof kv, "training.data_parallel=%u", n);
    set(c, kv);
    ck_assert_msg(mm_predict_ex(c, &p, &e, flags) == 0, "%s", e.msg);
    mm_spec_free(c);
    return p;
}

/* the strategies whose peak depends on N in different ways */
static const char *const variants[][3] = {
    {"training.zero_stage=0", NULL, NULL},   /* DDP: buckets only when N > 1 */
    {"training.zero_stage=1", NULL, NULL},
    {"training.zero_stage=2", NULL, NULL},
    {"training.zero_stage=3", NULL, NULL},
    {"training.zero_stage=0", "fsdp.version=1", NULL},
    {"training.zero_stage=0", "fsdp.version=2", NULL},
    {"training.zero_stage=3", "deepspeed.offload_param=cpu", "deepspeed.offload_optimizer=cpu"},
    {"training.zero_stage=2", "training.optimizer=paged_adamw_8bit", NULL}, /* paged / N */
    {"training.zero_stage=1", "training.gradient_accumulation_steps=4", NULL},
};
#define NVARIANTS (sizeof variants / sizeof variants[0])

/* a fine-tune and a LoRA run, cut to 4 + 4 layers so that a prediction is quick */
static mm_spec *small(int lora, size_t v)
{
    mm_spec *s = load(lora ? "contrib/models/llava-1.5-7b-lora.yaml"
                           : "contrib/models/llava-1.5-7b-finetune.yaml");
    set(s, "language_model.num_hidden_layers=4");
    set(s, "vision_tower.num_hidden_layers=4");
    set(s, "training.micro_batch_size=2");
    for (int k = 0; k < 3; k++)
        set(s, variants[v][k]);
    return s;
}

static const uint32_t degrees[] = {1,  2,  3,  4,  5,  6,  7,  8,  9,   10,  11,   12,   13,  16,
                                   17, 24, 31, 32, 33, 48, 64, 65, 100, 257, 1000, 4095, 4096};
#define NDEGREES (sizeof degrees / sizeof degrees[0])

START_TEST(dp_model_equals_direct_predictions)
{
    mm_error e;
    for (int lora = 0; lora <= 1; lora++) {
        for (size_t v = 0; v < NVARIANTS; v++) {
            mm_spec *s = small(lora, v);
            mm_prediction p;
            ck_assert_msg(mm_predict(s, &p, &e) == 0, "%s", e.msg);
            ck_assert(p.terms_exact);
            ck_assert_uint_eq(mm_peak_for_dp(&p, p.data_parallel), p.peak_bytes);
            ck_assert_int_eq(mm_dp_cover(s, &p, degrees, NDEGREES, &e), 0);
            for (size_t i = 0; i < NDEGREES; i++) {
                uint32_t n = degrees[i];
                mm_prediction q = predict_at(s, n, 0);
                ck_assert_msg(mm_peak_for_dp(&p, n) == q.peak_bytes,
                              "lora %d variant %zu N=%u: model %llu, prediction %llu", lora, v, n,
                              (unsigned long long)mm_peak_for_dp(&p, n),
                              (unsigned long long)q.peak_bytes);
                ck_assert_uint_eq(dp_allocated(&p, n), q.allocated_peak_bytes);
                mm_prediction_free(&q);
            }
            mm_prediction_free(&p);
            mm_spec_free(s);
        }
    }
}
END_TEST

/* What a prediction covers by itself: its own N, and every N >= 2 when no
 * tensor is sharded over N (the replay is then the same); a sharded spec
 * says "unknown" for an N it was not replayed at, never a guess. */
START_TEST(dp_model_covers_only_what_was_replayed)
{
    mm_spec *ddp = small(0, 0), *z3 = small(0, 3);
    set(ddp, "training.data_parallel=8");
    set(z3, "training.data_parallel=8");
    mm_prediction a = predict_at(ddp, 8, 0), b = predict_at(z3, 8, 0);
    ck_assert_uint_eq(a.n_dp_points, 1);
    ck_assert_uint_eq(a.dp_points[0].n_from, 2);
    ck_assert_uint_eq(a.dp_points[0].n_to, UINT32_MAX);
    ck_assert_uint_eq(mm_peak_for_dp(&a, 1), MM_PEAK_UNKNOWN);
    ck_assert_uint_ne(mm_peak_for_dp(&a, 1000000), MM_PEAK_UNKNOWN);
    ck_assert_uint_eq(b.n_dp_points, 1);
    ck_assert_uint_eq(mm_peak_for_dp(&b, 7), MM_PEAK_UNKNOWN);
    ck_assert_uint_eq(mm_peak_for_dp(&b, 9), MM_PEAK_UNKNOWN);
    ck_assert_uint_eq(mm_peak_for_dp(&b, 8), b.peak_bytes);
    /* covering merges equal neighbours and keeps the list ordered */
    mm_error e;
    const uint32_t ns[] = {30, 3, 1, 2, 4000, 3};
    ck_assert_int_eq(mm_dp_cover(z3, &b, ns, 6, &e), 0);
    for (size_t i = 1; i < b.n_dp_points; i++)
        ck_assert_uint_lt(b.dp_points[i - 1].n_to, b.dp_points[i].n_from);
    for (size_t i = 0; i < 6; i++)
        ck_assert_uint_ne(mm_peak_for_dp(&b, ns[i]), MM_PEAK_UNKNOWN);
    ck_assert_uint_eq(mm_peak_for_dp(&b, 5), MM_PEAK_UNKNOWN);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
    mm_spec_free(ddp);
    mm_spec_free(z3);
}
END_TEST

/* The allocator replays one simulated step for every N (sizes taken at N);
 * a step simulated at the spec's own N must give every field, byte for
 * byte; and the peak alone (fit's searches) the same peak. */
static const char *const specs[] = {
    "contrib/models/llava-1.5-7b-finetune.yaml",  "contrib/models/llava-1.5-7b-lora.yaml",
    "contrib/models/llava-1.5-7b-pretrain.yaml",  "contrib/models/llava-1.5-13b-finetune.yaml",
    "contrib/models/llava-1.5-13b-lora.yaml",     "contrib/models/llava-1.5-13b-pretrain.yaml",
    "tests/jobsubmit/specs/fits-h100x1.yaml",     "tests/jobsubmit/specs/resize-h100.yaml",
    "tests/jobsubmit/specs/resize-h200.yaml",     "tests/import/specs/qwen2_5vl_full_sft.yaml",
    "tests/import/specs/llava-1.5-7b-zero3-offload.yaml",
};
static const char *const shapes[][2] = {
    {NULL, NULL},
    {"training.data_parallel=1", NULL},
    {"training.data_parallel=2", "training.zero_stage=0"},
    {"training.data_parallel=1", "training.zero_stage=0"},
    {"training.data_parallel=3", "device.alloc_conf=expandable_segments:True"},
};

START_TEST(shortcuts_change_nothing)
{
    mm_error e;
    int compared = 0;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            mm_spec *s = load(specs[i]);
            if ((shapes[k][0] && mm_spec_set(s, shapes[k][0], &e)) ||
                (shapes[k][1] && mm_spec_set(s, shapes[k][1], &e))) {
                mm_spec_free(s); /* a combination the spec refuses (e.g. offload at ZeRO-0) */
                continue;
            }
            mm_prediction a, b;
            mm_peak_only q;
            ck_assert_msg(mm_predict_ex(s, &a, &e, 0) == 0, "%s", e.msg);
            ck_assert_msg(mm_predict_ex(s, &b, &e, MM_PREDICT_OWN_LOG) == 0, "%s", e.msg);
            char *ja = mm_prediction_json(&a, 0), *jb = mm_prediction_json(&b, 0);
            ck_assert_msg(strcmp(ja, jb) == 0, "%s shape %zu:\n%s\n%s", specs[i], k, ja, jb);
            ck_assert_int_eq(mm_predict_peak(s, &q, 0, &e), 0);
            ck_assert_uint_eq(q.peak, a.peak_bytes);
            ck_assert_uint_eq(q.allocated, a.allocated_peak_bytes);
            ck_assert_uint_le(q.lower, q.peak);
            ck_assert_int_eq(mm_predict_peak(s, &q, 1, &e), 0);
            ck_assert_uint_eq(q.peak, 0);
            ck_assert_uint_le(q.lower, a.peak_bytes);
            /* the replay that may stop early: the peak when it fits, else "above" */
            ck_assert_int_eq(mm_predict_peak_fits(s, &q, a.peak_bytes, &e), 0);
            ck_assert_uint_eq(q.peak, a.peak_bytes);
            ck_assert_int_eq(mm_predict_peak_fits(s, &q, a.peak_bytes - 1, &e), 0);
            ck_assert_uint_eq(q.peak, UINT64_MAX);
            free(ja);
            free(jb);
            mm_prediction_free(&a);
            mm_prediction_free(&b);
            mm_spec_free(s);
            compared++;
        }
    }
    ck_assert_int_ge(compared, 45);
}
END_TEST

/* dp_envelope against brute force: every N up to 5000, lines that win only
 * between the old sample points (2..16, then powers of two) kept, more than
 * MM_MAX_TERMS winners merged into an over-estimate. */
static uint64_t brute(const mm_dp_term *t, size_t n, uint64_t N)
{
    uint64_t best = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = t[i].fixed + (t[i].sharded + N - 1) / N;
        best = v > best ? v : best;
    }
    return best;
}

/* the envelope of pts, evaluated through a prediction, against brute force:
 * equal (exact) or never below */
static size_t check_envelope(const mm_dp_term *pts, size_t n, mm_dp_term *out, int want_exact)
{
    int exact;
    size_t k = dp_envelope(pts, n, out, &exact);
    mm_prediction p;
    memset(&p, 0, sizeof p);
    memcpy(p.terms, out, k * sizeof *out);
    p.n_terms = k;
    ck_assert_int_eq(exact, want_exact);
    for (uint64_t N = 2; N <= 5000; N++) {
        if (want_exact)
            ck_assert_uint_eq(dp_allocated(&p, (uint32_t)N), brute(pts, n, N));
        else
            ck_assert_uint_ge(dp_allocated(&p, (uint32_t)N), brute(pts, n, N));
    }
    return k;
}

START_TEST(envelope_is_exact)
{
    /* A wins up to N = 17, C from 19 on, B only at N = 18 (never sampled
     * before); D and E never win, D stays far below (dropped), E within a
     * byte or two of B (kept or not: it changes no maximum) */
    const mm_dp_term pts[] = {{100, 1600}, {190, 0}, {146, 800}, {150, 100}, {145, 799}};
    mm_dp_term out[MM_MAX_TERMS];
    int kept_b = 0, kept_d = 0;
    size_t k = check_envelope(pts, 5, out, 1);
    for (size_t i = 0; i < k; i++) {
        kept_b |= out[i].fixed == 146 && out[i].sharded == 800;
        kept_d |= out[i].fixed == 150 && out[i].sharded == 100;
    }
    ck_assert(kept_b && !kept_d);
    /* seventeen points (the division-per-N path): exact as well */
    mm_dp_term seventeen[17];
    for (int i = 0; i < 17; i++)
        seventeen[i] = (mm_dp_term){.fixed = 1000 + (uint64_t)i * 37 % 101,
                                    .sharded = (uint64_t)(i * 53 % 17) * 1000};
    check_envelope(seventeen, 17, out, 1);
    /* bytes a double does not hold to the byte (absurd, but valid): N by N */
    const mm_dp_term huge[] = {{(1ull << 60) + 1, 3}, {1ull << 60, (1ull << 40) + 7}, {5, 1ull << 61}};
    check_envelope(huge, 3, out, 1);
    /* twelve lines, each the maximum somewhere: merged, never below */
    mm_dp_term many[12];
    for (int i = 0; i < 12; i++)
        many[i] = (mm_dp_term){.fixed = 1000000 - (uint64_t)(12 - i) * (12 - i) * 1000,
                               .sharded = (uint64_t)(12 - i) * 100000};
    ck_assert_uint_eq(check_envelope(many, 12, out, 0), MM_MAX_TERMS);
}
END_TEST

/* ---- fit on a card: every answer is `mmguard check`'s verdict ------------ */

/* The verdict `mmguard check SPEC --gpu-mem GPU --set KV...` gives (the --set
 * path, mm_verdict_for): the oracle of fit's answers, independent of fit's
 * own in-place spec changes and shortcuts. */
static mm_verdict judge_with(const mm_spec *s, uint64_t gpu, uint64_t usable, const char *kv1,
                             const char *kv2)
{
    mm_spec *c = mm_spec_clone(s);
    mm_verdict v;
    mm_error e;
    if (kv1)
        set(c, kv1);
    if (kv2)
        set(c, kv2);
    ck_assert_msg(mm_verdict_for(c, gpu, usable, 0, &v, &e) == 0, "%s", e.msg);
    mm_spec_free(c);
    return v;
}

static mm_verdict_kind kind_at_mb(const mm_spec *s, uint64_t gpu, uint64_t usable, uint64_t mb)
{
    char kv[64];
    snprintf(kv, sizeof kv, "training.micro_batch_size=%llu", (unsigned long long)mb);
    return judge_with(s, gpu, usable, kv, NULL).kind;
}

/* m is the largest micro-batch whose verdict is at most `worst`: it is, and
 * m + 1 is not (m = 0: not even 1; m = 65536: the cap) */
static void assert_largest(const mm_spec *s, uint64_t gpu, uint64_t usable, uint32_t m,
                           mm_verdict_kind worst, const char *what)
{
    if (m)
        ck_assert_msg(kind_at_mb(s, gpu, usable, m) <= worst, "%s: %u does not fit", what, m);
    if (m < 65536)
        ck_assert_msg(kind_at_mb(s, gpu, usable, (uint64_t)m + 1) > worst,
                      "%s: %u + 1 fits too", what, m);
}

/* The judged summary of a suggestion is the verdict of that configuration. */
static void assert_judged(const mm_fit_judged *j, const mm_verdict *v)
{
    ck_assert(j->judged);
    ck_assert_int_eq(j->kind, v->kind);
    ck_assert_uint_eq(j->retries_step, v->retries_step);
    ck_assert_uint_eq(j->retries, v->retries);
    ck_assert_uint_eq(j->live_bytes, v->allocated_peak);
    if (v->kind != MM_VERDICT_OOM)
        ck_assert_uint_eq(j->peak_bytes, v->reserved_peak + v->context_bytes);
}

/* LLaVA-1.5-7B's fine-tune (micro-batch 16, ZeRO-3, 8 GPUs) on a 40 GiB card
 * runs out of memory: fit's largest micro-batch runs and one more does not,
 * the largest without a flush fits and one more flushes or fails; the
 * expandable-segments remedy, checkpointing, the ZeRO stage and the GPU count
 * are each the verdict of that configuration. */
START_TEST(fit_answers_are_verdicts)
{
    const uint64_t gpu = 40ull << 30;
    mm_spec *s = load("contrib/models/llava-1.5-7b-finetune.yaml");
    mm_fit_result f;
    mm_error e;
    ck_assert_int_eq(mm_fit(s, gpu, gpu, 0, &f, &e), 0);
    mm_verdict v = judge_with(s, gpu, gpu, NULL, NULL);
    ck_assert_int_eq(f.verdict.kind, v.kind);
    ck_assert_int_eq(f.fits, v.kind != MM_VERDICT_OOM);
    ck_assert_uint_gt(f.max_micro_batch, 0);
    assert_largest(s, gpu, gpu, f.max_micro_batch, MM_VERDICT_FLUSHES, "runs");
    assert_largest(s, gpu, gpu, f.max_micro_batch_no_flush, MM_VERDICT_FITS, "no flush");
    ck_assert_uint_le(f.max_micro_batch_no_flush, f.max_micro_batch);
    char kv[64];
    snprintf(kv, sizeof kv, "training.micro_batch_size=%u", f.max_micro_batch);
    v = judge_with(s, gpu, gpu, kv, NULL);
    assert_judged(&f.at_max, &v);
    v = judge_with(s, gpu, gpu, "device.alloc_conf=expandable_segments:True", NULL);
    assert_judged(&f.expandable, &v);
    ck_assert_int_eq(f.expandable_helps, !f.fits && v.kind != MM_VERDICT_OOM);
    snprintf(kv, sizeof kv, "training.micro_batch_size=%u", f.max_micro_batch_expandable);
    ck_assert_uint_ge(f.max_micro_batch_expandable, 1);
    ck_assert_int_ne(judge_with(s, gpu, gpu, kv, "device.alloc_conf=expandable_segments:True").kind,
                     MM_VERDICT_OOM);
    ck_assert(!f.ckpt.judged); /* the recipe checkpoints already */
    ck_assert_uint_gt(f.min_data_parallel, 8);
    for (uint32_t n = 8; n <= f.min_data_parallel; n++) {
        snprintf(kv, sizeof kv, "training.data_parallel=%u", n);
        v = judge_with(s, gpu, gpu, kv, NULL);
        ck_assert_msg((v.kind != MM_VERDICT_OOM) == (n == f.min_data_parallel),
                      "N=%u: %s, fit says %u", n, mm_verdict_name(v.kind), f.min_data_parallel);
        if (n == f.min_data_parallel)
            assert_judged(&f.dp, &v);
    }
    /* no_flush (flush=reject): the largest micro-batch is the one without a flush */
    mm_fit_result g;
    ck_assert_int_eq(mm_fit(s, gpu, gpu, 1, &g, &e), 0);
    ck_assert_uint_eq(g.max_micro_batch, f.max_micro_batch_no_flush);
    ck_assert_uint_eq(mm_max_micro_batch(s, gpu, gpu, 1, NULL), g.max_micro_batch);
    mm_spec_free(s);
}
END_TEST

/* mm_max_micro_batch is, by definition, the m whose verdict runs (or fits
 * without a flush) while m + 1's does not: checked with `mmguard check`'s
 * verdict for shipped specs, with and without checkpointing, on cards from
 * "nothing runs" to H200 size; the same with and without the spec's own
 * verdict passed in, and equal to mm_fit's. */
START_TEST(max_micro_batch_is_exact)
{
    const char *names[] = {"llava-1.5-7b-pretrain", "llava-1.5-7b-lora", "llava-1.5-13b-finetune"};
    const uint64_t GiB = 1ull << 30, cards[] = {8 * GiB, 24 * GiB, 40 * GiB, 80 * GiB, 141 * GiB};
    int checked = 0, downward = 0, none = 0;
    for (size_t i = 0; i < 3; i++) {
        for (int ckpt = 0; ckpt <= 1; ckpt++) {
            char path[128];
            snprintf(path, sizeof path, "contrib/models/%s.yaml", names[i]);
            mm_spec *s = load(path);
            set(s, ckpt ? "training.gradient_checkpointing=true"
                        : "training.gradient_checkpointing=false");
            set(s, "training.micro_batch_size=8");
            for (size_t b = 0; b < sizeof cards / sizeof *cards; b++) {
                uint64_t gpu = cards[b];
                mm_verdict own = judge_with(s, gpu, gpu, NULL, NULL);
                for (int nf = 0; nf <= 1; nf++) {
                    uint32_t m = mm_max_micro_batch(s, gpu, gpu, nf, NULL);
                    ck_assert_uint_eq(mm_max_micro_batch(s, gpu, gpu, nf, &own), m);
                    assert_largest(s, gpu, gpu, m, nf ? MM_VERDICT_FITS : MM_VERDICT_FLUSHES,
                                   names[i]);
                    none += m == 0;
                    downward += m && m < 8;
                    checked++;
                }
                mm_fit_result f;
                mm_error e;
                ck_assert_int_eq(mm_fit(s, gpu, gpu, 0, &f, &e), 0);
                ck_assert_uint_eq(f.max_micro_batch, mm_max_micro_batch(s, gpu, gpu, 0, NULL));
                ck_assert_uint_eq(f.max_micro_batch_no_flush,
                                  mm_max_micro_batch(s, gpu, gpu, 1, NULL));
            }
            mm_spec_free(s);
        }
    }
    ck_assert_int_eq(checked, 60);
    ck_assert_int_gt(none, 0);
    ck_assert_int_gt(downward, 0); /* some searches went down to a fit */
}
END_TEST

/* The cap: a model so small that 65536 samples run stops there; on a card
 * just below the one 65536 needs, the answer is the largest that runs. */
START_TEST(max_micro_batch_cap)
{
    mm_spec *s = load("contrib/models/llava-1.5-7b-pretrain.yaml");
    set(s, "language_model.num_hidden_layers=1");
    set(s, "training.images_per_sample=0");
    set(s, "training.seq_len=8");
    set(s, "training.micro_batch_size=65536");
    mm_verdict v;
    mm_error e;
    ck_assert_int_eq(mm_verdict_for(s, 1ull << 40, 1ull << 40, 1, &v, &e), 0);
    ck_assert_int_eq(v.kind, MM_VERDICT_FITS);
    ck_assert_uint_eq(mm_max_micro_batch(s, 1ull << 40, 1ull << 40, 0, NULL), 65536);
    uint64_t card = v.min_usable_runs - 1;
    uint32_t mb = mm_max_micro_batch(s, card, card, 0, NULL);
    ck_assert_uint_lt(mb, 65536);
    ck_assert_uint_gt(mb, 60000);
    assert_largest(s, card, card, mb, MM_VERDICT_FLUSHES, "cap");
    mm_spec_free(s);
}
END_TEST

/* When no GPU count runs without checkpointing (activations are never
 * sharded), fit says which count runs with it on - and no smaller does, by
 * the verdict at each count; a 13B fine-tune at ZeRO-0 finds its count with
 * a ZeRO stage. */
START_TEST(fit_gpu_count_is_direct)
{
    const char *cases[][3] = {
        {"contrib/models/llava-1.5-7b-finetune.yaml", "training.gradient_checkpointing=false",
         "training.data_parallel=8"},
        {"contrib/models/llava-1.5-13b-finetune.yaml", "training.data_parallel=4",
         "training.zero_stage=0"},
    };
    const uint64_t gpu = 81559ull << 20, usable = gpu / 10 * 9;
    for (size_t c = 0; c < 2; c++) {
        mm_spec *s = load(cases[c][0]);
        set(s, cases[c][1]);
        set(s, cases[c][2]);
        mm_fit_result f;
        mm_error e;
        char kv[48];
        ck_assert_int_eq(mm_fit(s, gpu, usable, 0, &f, &e), 0);
        ck_assert(!f.fits);
        ck_assert_uint_gt(f.min_data_parallel, 1);
        ck_assert_int_eq(f.min_data_parallel_ckpt, c == 0);
        if (c == 0)
            set(s, "training.gradient_checkpointing=true");
        snprintf(kv, sizeof kv, "training.zero_stage=%d", f.min_data_parallel_zero);
        set(s, kv);
        for (uint32_t n = 1; n <= f.min_data_parallel; n++) {
            snprintf(kv, sizeof kv, "training.data_parallel=%u", n);
            mm_verdict v = judge_with(s, gpu, usable, kv, NULL);
            ck_assert_msg((v.kind != MM_VERDICT_OOM) == (n == f.min_data_parallel),
                          "case %zu N=%u: %s, fit says %u", c, n, mm_verdict_name(v.kind),
                          f.min_data_parallel);
            if (n == f.min_data_parallel)
                assert_judged(&f.dp, &v);
        }
        mm_spec_free(s);
    }
}
END_TEST


/* mm_predict_verdict (the plugin's one call) gives byte for byte what
 * mm_predict and mm_verdict_for give apart, on every shipped preset, at N = 1
 * and N = 4 with ZeRO-2, with and without expandable segments (the one
 * allocator setting that reads the card's size), on cards from one that holds
 * the uncapped peak to ones that force flushes or an OOM. */
static void shared_matches_apart(const char *path, const char *const *kv)
{
    mm_error e;
    mm_spec *s = mm_spec_load_file(path, &e);
    ck_assert_msg(s != NULL, "%s", e.msg);
    for (; *kv; kv++)
        if (mm_spec_set(s, *kv, &e))
            goto out; /* a setting this spec refuses */
    mm_prediction p1, p2;
    if (mm_predict(s, &p1, &e))
        goto out;
    char *j1 = mm_prediction_json(&p1, 0);
    const uint64_t GiB = 1ull << 30, cards[] = {80 * GiB, 48 * GiB, 24 * GiB};
    const double fr[] = {1.0, 0.9, 0.75, 0.5};
    for (size_t c = 0; c < 3; c++)
        for (size_t f = 0; f < 4; f++) {
            uint64_t usable = (uint64_t)((double)p1.peak_bytes * fr[f]);
            if (usable > cards[c])
                usable = cards[c];
            mm_verdict v1, v2;
            ck_assert_msg(mm_verdict_for(s, cards[c], usable, 0, &v1, &e) == 0, "%s", e.msg);
            ck_assert_msg(mm_predict_verdict(s, cards[c], usable, &p2, &v2, &e) == 0, "%s",
                          e.msg);
            char *j2 = mm_prediction_json(&p2, 0);
            ck_assert_msg(j1 && j2 && strcmp(j1, j2) == 0, "%s: prediction differs", path);
            ck_assert_msg(memcmp(&v1, &v2, sizeof v1) == 0,
                          "%s card %zu usable %llu: verdict differs (%s vs %s, reserved %llu vs "
                          "%llu)", path, c, (unsigned long long)usable,
                          mm_verdict_name(v1.kind), mm_verdict_name(v2.kind),
                          (unsigned long long)v1.reserved_peak,
                          (unsigned long long)v2.reserved_peak);
            free(j2);
            mm_prediction_free(&p2);
        }
    free(j1);
    mm_prediction_free(&p1);
out:
    mm_spec_free(s);
}

/* the three set-ups below, each apart from the shared run */
static void all_setups_apart(const char *path, void *ctx)
{
    (void)ctx;
    static const char *const none[] = {NULL};
    static const char *const dp4[] = {"training.zero_stage=2", "training.data_parallel=4", NULL};
    static const char *const xs[] = {"device.alloc_conf=expandable_segments:True", NULL};
    static const char *const *const setups[] = {none, dp4, xs};
    for (size_t v = 0; v < 3; v++)
        shared_matches_apart(path, setups[v]);
}

START_TEST(predict_verdict_is_both_apart)
{
    unit_each_yaml("contrib/models", all_setups_apart, NULL);
}
END_TEST

Suite *fit_suite(void)
{
    Suite *s = suite_create("fit");
    TCase *tc = tcase_create("dp");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, dp_model_equals_direct_predictions);
    tcase_add_test(tc, dp_model_covers_only_what_was_replayed);
    tcase_add_test(tc, shortcuts_change_nothing);
    tcase_add_test(tc, envelope_is_exact);
    tcase_add_test(tc, fit_gpu_count_is_direct);
    tcase_add_test(tc, fit_answers_are_verdicts);
    tcase_add_test(tc, max_micro_batch_is_exact);
    tcase_add_test(tc, max_micro_batch_cap);
    tcase_add_test(tc, predict_verdict_is_both_apart);
    suite_add_tcase(s, tc);
    return s;
}
