/* test_engine.c - the timeline engine's own invariants, for every spec the
 * project ships (the .yaml files of contrib/models and tests/import/specs) and the
 * training variants that change what lives when: after backward nothing of the
 * step but the batch is alive (a leak is a formula that never releases a
 * tensor, or a gradient no node consumes), with layer folding and without; and
 * the breakdown at the peak that a run keeps while it goes (sim_peak_snapshot:
 * the end state with every change since the peak undone) is the one a second
 * run stopped at the peak event takes. */
#include "step.h"
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
            int rc = step_run(s, &sm, &cfg, &e);
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
        ck_assert_msg(step_run(s, &a, &ca, &e) == 0, "%s variant %zu: %s", path, v, e.msg);
        ck_assert_msg(sim_peak_snapshot(&a) == 0, "%s variant %zu: no snapshot", path, v);
        step_cfg cb = {.dp = s->training.data_parallel, .snap_at = a.peak_event};
        ck_assert_msg(step_run(s, &b, &cb, &e) == 0, "%s variant %zu: %s", path, v, e.msg);
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

Suite *engine_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("leaks");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, nothing_leaks_into_the_optimizer);
    tcase_add_test(tc, the_kept_peak_breakdown_is_the_stopped_runs);
    suite_add_tcase(s, tc);
    return s;
}
