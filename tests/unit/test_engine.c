/* test_engine.c - the timeline engine's own invariants, for every spec the
 * project ships (the .yaml files of contrib/models and tests/import/specs) and the
 * training variants that change what lives when: after backward nothing of the
 * step but the batch is alive (a leak is a formula that never releases a
 * tensor, or a gradient no node consumes), with layer folding and without; and
 * the breakdown at the peak that a run keeps while it goes (sim_peak_snapshot:
 * the end state with every change since the peak undone) is the one a second
 * run stopped at the peak event takes; and the counting pass that folds layers
 * (stack.c) registers what the one that runs every layer does. */
#include "dp.h"
#include "unit.h"
#include "mmguard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const variants[][3] = {
    {NULL, NULL, NULL},
    {"training.gradient_checkpointing=false", NULL, NULL},
    {"training.gradient_checkpointing=true", "training.precision=fp32", NULL},
    {"training.attention=eager", "training.seq_len=300", NULL},
    {"training.attention=sdpa", "training.precision=bf16", "training.master_weights=fp32"},
    {"training.zero_stage=0", "training.data_parallel=1", "training.gradient_accumulation_steps=2"},
    {"training.zero_stage=2", "training.data_parallel=4", NULL},
    {"training.zero_stage=3", "training.data_parallel=8", NULL},
    {"training.activation_offloading=true", "training.gradient_checkpointing=false", NULL},
    {"training.activation_offloading=true", "training.gradient_checkpointing=true", NULL},
    {"training.gradient_checkpointing={enabled: true, offload: true}", NULL, NULL},
};

/* the spec at path with variant v applied, NULL when the spec refuses one of
 * its keys (that variant is skipped) */
static mm_spec *load_variant(const char *path, size_t v)
{
    mm_error e;
    mm_spec *s = mm_spec_load_file(path, &e);
    ck_assert_msg(s != NULL, "%s", e.msg);
    for (size_t k = 0; k < 3 && variants[v][k]; k++)
        if (mm_spec_set(s, variants[v][k], &e) != 0) {
            mm_spec_free(s);
            return NULL;
        }
    return s;
}

static void check_spec(const char *path)
{
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        mm_error e;
        mm_spec *s = load_variant(path, v);
        if (!s)
            continue;
        for (int nofold = 0; nofold < 2; nofold++) {
            sim sm;
            step_cfg cfg = {.dp = s->training.data_parallel, .nofold = nofold};
            int rc = step_run_spec(s, NULL, &sm, &cfg, &e);
            ck_assert_msg(rc == 0, "%s variant %zu: %s", path, v, e.msg);
            ck_assert_msg(sm.leftover == 0, "%s variant %zu%s: %llu bytes of the step still "
                          "alive when the optimizer starts", path, v, nofold ? " (no folding)" : "",
                          (unsigned long long)sm.leftover);
            ck_assert_msg(sm.host_act == 0, "%s variant %zu%s: %llu bytes still on the host "
                          "after backward", path, v, nofold ? " (no folding)" : "",
                          (unsigned long long)sm.host_act);
            sim_free(&sm);
        }
        mm_spec_free(s);
    }
}

/* sim_peak_snapshot against a run stopped at the peak (snap_at), factor by
 * factor and row by row */
static void check_snapshot(const char *path)
{
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        mm_error e;
        mm_spec *s = load_variant(path, v);
        if (!s)
            continue;
        sim a, b;
        step_cfg ca = {.dp = s->training.data_parallel, .symbolic = 1, .track_peak = 1};
        ck_assert_msg(step_run_spec(s, NULL, &a, &ca, &e) == 0, "%s variant %zu: %s", path, v, e.msg);
        ck_assert_msg(sim_peak_snapshot(&a) == 0, "%s variant %zu: no snapshot", path, v);
        step_cfg cb = {.dp = s->training.data_parallel, .snap_at = a.peak_event};
        ck_assert_msg(step_run_spec(s, NULL, &b, &cb, &e) == 0, "%s variant %zu: %s", path, v, e.msg);
        ck_assert_msg(b.snapped, "%s variant %zu: the stopped run took no snapshot", path, v);
        for (int f = 0; f < F_NFACT; f++)
            ck_assert_msg(a.snap_fact[f] == b.snap_fact[f], "%s variant %zu factor %d: %llu "
                          "kept, %llu at the peak event", path, v, f,
                          (unsigned long long)a.snap_fact[f], (unsigned long long)b.snap_fact[f]);
        for (size_t r = 0; r < a.snap_nrows * F_NFACT; r++) {
            uint64_t want = r < b.snap_nrows * F_NFACT ? b.snap_row_fact[r] : 0;
            ck_assert_msg(a.snap_row_fact[r] == want, "%s variant %zu row %s factor %zu: %llu "
                          "kept, %llu at the peak event", path, v, a.rows[r / F_NFACT].name,
                          r % F_NFACT, (unsigned long long)a.snap_row_fact[r],
                          (unsigned long long)want);
        }
        sim_free(&a);
        sim_free(&b);
        mm_spec_free(s);
    }
}

static void check_snapshot_one(const char *path, void *ctx)
{
    (void)ctx;
    check_snapshot(path);
}

START_TEST(the_kept_peak_breakdown_is_the_stopped_runs)
{
    ck_assert_uint_gt(unit_each_yaml("contrib/models", check_snapshot_one, NULL), 0);
}
END_TEST

static void check_one(const char *path, void *ctx)
{
    (void)ctx;
    check_spec(path);
}

START_TEST(nothing_leaks_into_the_optimizer)
{
    unit_each_yaml("contrib/models", check_one, NULL);
    unit_each_yaml("tests/import/specs", check_one, NULL);
}
END_TEST

/* the row of (module, name) in s, or NULL */
static const sim_row *row_named(const sim *s, uint32_t module, const char *name)
{
    for (size_t r = 0; r < s->nrows; r++)
        if (s->rows[r].module == module && !strcmp(s->rows[r].name, name))
            return &s->rows[r];
    return NULL;
}

/* folded (a) and every layer run (b): the same rows with the same parameters
 * and instances, the same per-layer tables; the folded run's ballast row aside */
static void check_counts(const char *path, size_t v)
{
    mm_error e;
    mm_spec *s = load_variant(path, v);
    if (!s)
        return;
    sim a, b;
    step_cfg ca = {.dp = s->training.data_parallel}, cb = {.dp = s->training.data_parallel,
                                                           .nofold = 1};
    ck_assert_msg(step_run_spec(s, NULL, &a, &ca, &e) == 0, "%s variant %zu: %s", path, v, e.msg);
    ck_assert_msg(step_run_spec(s, NULL, &b, &cb, &e) == 0, "%s variant %zu: %s", path, v, e.msg);
    size_t matched = 0;
    for (size_t r = 0; r < a.nrows; r++) {
        const sim_row *A = &a.rows[r], *B = row_named(&b, A->module, A->name);
        if (!strcmp(A->name, "layers.folded"))
            continue;
        ck_assert_msg(B != NULL, "%s variant %zu: row %s only when folded", path, v, A->name);
        matched++;
        ck_assert_msg(A->params == B->params && A->trainable == B->trainable &&
                          A->count == B->count && A->trainable_count == B->trainable_count &&
                          A->qbytes == B->qbytes && A->mat_rows == B->mat_rows &&
                          A->mat_cols == B->mat_cols && A->pesz == B->pesz,
                      "%s variant %zu row %s: %llu params in %u instances folded, %llu in %u "
                      "run", path, v, A->name, (unsigned long long)A->params, A->count,
                      (unsigned long long)B->params, B->count);
    }
    ck_assert_uint_eq(matched, b.nrows);
    ck_assert_uint_eq(a.layer_stride, b.layer_stride);
    for (uint64_t m = 0; m < MM_MAX_MODULES; m++)
        for (uint64_t l = 0; l < a.layer_stride; l++) {
            int same = sim_layer_get(&a, a.layer_tp, m, l) == sim_layer_get(&b, b.layer_tp, m, l) &&
                       sim_layer_get(&a, a.layer_gb, m, l) == sim_layer_get(&b, b.layer_gb, m, l) &&
                       sim_layer_get(&a, a.layer_p, m, l) == sim_layer_get(&b, b.layer_p, m, l);
            ck_assert_msg(same, "%s variant %zu: layer %llu of module %llu counted apart", path,
                          v, (unsigned long long)l, (unsigned long long)m);
        }
    sim_free(&a);
    sim_free(&b);
    mm_spec_free(s);
}

static void check_counts_one(const char *path, void *ctx)
{
    (void)ctx;
    check_counts(path, 0);
    check_counts(path, 7); /* ZeRO-3 on 8 ranks */
}

START_TEST(the_folded_counting_pass_counts_every_layer)
{
    ck_assert_uint_gt(unit_each_yaml("contrib/models", check_counts_one, NULL), 0);
    unit_each_yaml("tests/import/specs", check_counts_one, NULL);
}
END_TEST

/* A tiny checkpointed eager Llama: the order of its first layer's forward.
 * H = 256, 4 heads of 64 (no GQA), S = 128: a (T, H) bf16 tensor is 2*S*H*2 B
 * with B = 2, a (B, heads, S, S) bf16 score 4x that. */
static void eager_log(uint64_t B, sim *s)
{
    char buf[1024];
    snprintf(buf, sizeof buf,
             "name: eager\nmodules:\n"
             "  - {name: llm, type: llama, hidden_size: 256, num_hidden_layers: 2,"
             " num_attention_heads: 4, intermediate_size: 512, vocab_size: 1000}\n"
             "training: {micro_batch_size: %llu, seq_len: 128, attention: eager,"
             " gradient_checkpointing: true, precision: bf16}\n",
             (unsigned long long)B);
    mm_error e;
    mm_spec *sp = mm_spec_load_buffer(buf, strlen(buf), "eager.yaml", MM_FMT_YAML, &e);
    ck_assert_msg(sp != NULL, "%s", e.msg);
    step_cfg cfg = {.dp = 1, .nofold = 1, .log = 1};
    ck_assert_msg(step_run_spec(sp, NULL, s, &cfg, &e) == 0, "%s", e.msg);
    mm_spec_free(sp);
}

static int ev_row(const sim *s, size_t i, const char *row)
{
    return s->ev[i].row < s->nrows && !strcmp(s->rows[s->ev[i].row].name, row);
}

/* torch.matmul copies a (B, heads, S, d) view of a (B, S, heads, d) tensor
 * before its bmm when B and heads do not merge (LinearAlgebra.cpp _matmul_impl):
 * q's and k's copies are the two allocations right before the scores, k's is
 * freed first; with B = 1 the reshape is a view and nothing is copied.  The
 * probabilities `_` of `hidden_states, _ = self.self_attn(...)` outlive the MLP
 * and both residual sums of the layer (the H200 trace
 * trace-llava7b-pretrain-eager-ck16-b16-s1024-ck1 in tests/gpu_data/traces). */
START_TEST(eager_attention_copies_its_operands_and_holds_the_probabilities)
{
    for (uint64_t B = 1; B <= 2; B++) {
        sim s;
        eager_log(B, &s);
        uint64_t th = B * 128 * 256 * 2, ss = B * 4 * 128 * 128 * 2;
        size_t sc = 0, probs = 0, oproj = 0, i;
        for (i = 0; i < s.nev && !sc; i++) /* the first scores */
            if (!s.ev[i].is_free && s.ev[i].bytes == ss && ev_row(&s, i, "layers.self_attn.attention"))
                sc = i;
        ck_assert_uint_gt(sc, 2);
        int copied = !s.ev[sc - 1].is_free && !s.ev[sc - 2].is_free &&
                     s.ev[sc - 1].bytes == th && s.ev[sc - 2].bytes == th &&
                     ev_row(&s, sc - 1, "layers.self_attn.attention") &&
                     ev_row(&s, sc - 2, "layers.self_attn.attention");
        ck_assert_int_eq(copied, B > 1);
        if (B > 1) { /* no autograd in a checkpointed forward: freed k's first, then q's */
            ck_assert(s.ev[sc + 1].is_free && s.ev[sc + 1].id == s.ev[sc - 1].id);
            ck_assert(s.ev[sc + 2].is_free && s.ev[sc + 2].id == s.ev[sc - 2].id);
        }
        for (i = sc; i < s.nev && !oproj; i++) {
            if (!s.ev[i].is_free && s.ev[i].bytes == ss && ev_row(&s, i, "layers.self_attn.attention"))
                probs = i; /* the last (B, heads, S, S) bf16 tensor before o_proj */
            if (!s.ev[i].is_free && ev_row(&s, i, "layers.self_attn.o_proj"))
                oproj = i;
        }
        ck_assert_uint_gt(probs, sc);
        int sums = 0, freed = 0;
        for (i = probs + 1; i < s.nev && !freed; i++) {
            if (!s.ev[i].is_free && ev_row(&s, i, "layers.residual"))
                sums++;
            freed = s.ev[i].is_free && s.ev[i].id == s.ev[probs].id;
        }
        ck_assert(freed);
        ck_assert_int_eq(sums, 2);
        sim_free(&s);
    }
}
END_TEST

Suite *engine_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("leaks");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, nothing_leaks_into_the_optimizer);
    tcase_add_test(tc, the_kept_peak_breakdown_is_the_stopped_runs);
    tcase_add_test(tc, the_folded_counting_pass_counts_every_layer);
    tcase_add_test(tc, eager_attention_copies_its_operands_and_holds_the_probabilities);
    suite_add_tcase(s, tc);
    return s;
}
