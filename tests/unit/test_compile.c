/* test_compile.c - issue 23: training.torch_compile (judged by the eager
 * prediction as a bound) and op-level selective activation checkpointing
 * (training.gradient_checkpointing.granularity: selective_op).  Each key
 * changes what it claims. */
#include "unit.h"
#include "mmguard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* torch_compile: the peak is the eager prediction, and the prediction (and its
 * JSON) says it is a bound and what shows it */
START_TEST(torch_compile_is_judged_by_the_eager_bound)
{
    mm_prediction a = unit_tiny_predict(""), b = unit_tiny_predict("  torch_compile: true\n");
    ck_assert_str_eq(a.bound, "");
    ck_assert_msg(strstr(b.bound, "torch.compile: eager prediction, an upper bound") != NULL,
                  "bound '%s'", b.bound);
    ck_assert_uint_eq(a.allocated_peak_bytes, b.allocated_peak_bytes);
    char *ja = mm_prediction_json(&a, 0), *jb = mm_prediction_json(&b, 0);
    ck_assert(ja && jb);
    ck_assert(strstr(ja, "\"bound\"") == NULL);
    ck_assert(strstr(jb, "\"bound\":\"torch.compile: eager prediction") != NULL);
    free(ja);
    free(jb);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
}
END_TEST

/* under FSDP2 too (torchtitan's per-block compile, 9 measured rows at or under the eager
 * prediction): the same step as eager, with the bound said */
START_TEST(torch_compile_under_fsdp2_is_judged_by_the_eager_bound)
{
    mm_prediction a = unit_tiny_predict("  data_parallel: 2\nfsdp: {version: 2}\n"),
                  b = unit_tiny_predict("  torch_compile: true\n  data_parallel: 2\n"
                                        "fsdp: {version: 2}\n");
    ck_assert_str_eq(a.bound, "");
    ck_assert_msg(strstr(b.bound, "torch.compile: eager prediction, an upper bound") != NULL,
                  "bound '%s'", b.bound);
    ck_assert_uint_eq(a.allocated_peak_bytes, b.allocated_peak_bytes);
    ck_assert_uint_eq(a.peak_bytes, b.peak_bytes);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
}
END_TEST

/* compiled DDP steps broke the bound in their optimizer phase; ZeRO / FSDP1 and
 * torchtitan's op-level policy compiled were not measured: all are refused with the
 * reason */
START_TEST(torch_compile_refused_where_no_bound_is_shown)
{
    const char *bad[] = {"  torch_compile: true\n  data_parallel: 2\n",
                         "  torch_compile: true\n  zero_stage: 2\n",
                         "  torch_compile: true\n  data_parallel: 2\nfsdp: {version: 1}\n",
                         "  torch_compile: true\n  gradient_checkpointing: {enabled: true, "
                         "use_reentrant: false, granularity: selective_op}\n"};
    const char *why[] = {"DDP is refused", "no bound is shown", "no bound is shown",
                         "selective_op is not measured"};
    for (size_t i = 0; i < 4; i++) {
        mm_error e;
        mm_spec *s = unit_tiny(bad[i], &e);
        ck_assert_msg(s == NULL, "accepted: %s", bad[i]);
        ck_assert_msg(strstr(e.msg, "training.torch_compile") && strstr(e.msg, why[i]), "%s", e.msg);
    }
}
END_TEST

/* granularity selective_op: torchtitan's op policy keeps, per checkpointed layer, the
 * outputs of the 1st, 3rd, 5th, 7th aten.mm (q_proj, v_proj, gate_proj, down_proj of a
 * Llama layer without biases) and of the flash kernel (out, fp32 logsumexp) from the
 * forward to the layer's re-run: the forward peak grows by exactly that over whole-layer
 * checkpointing and stays below no checkpointing */
START_TEST(selective_op_keeps_what_the_policy_saves)
{
    mm_prediction none = unit_tiny_predict(""),
                  full = unit_tiny_predict("  gradient_checkpointing: {enabled: true, use_reentrant: false}\n"),
                  sel = unit_tiny_predict("  gradient_checkpointing: {enabled: true, use_reentrant: false, "
                                "granularity: selective_op}\n");
    uint64_t T = 2 * 512, h = 512, kv = 4 * 64, I = 1376, B = 2, H = 8, S = 512, L = 4;
    uint64_t per_layer = T * h * 2 + T * kv * 2 + T * I * 2 + T * h * 2 /* q, v, gate, down */
                         + T * h * 2 + B * H * S * 4;                 /* flash out, lse */
    uint64_t f_full = full.phase_peak[MM_PHASE_FORWARD], f_sel = sel.phase_peak[MM_PHASE_FORWARD];
    ck_assert_msg(f_sel - f_full == L * per_layer, "forward peak grew by %llu, expected %llu",
                  (unsigned long long)(f_sel - f_full), (unsigned long long)(L * per_layer));
    ck_assert(sel.allocated_peak_bytes > full.allocated_peak_bytes);
    ck_assert(sel.allocated_peak_bytes < none.allocated_peak_bytes);
    mm_prediction_free(&none);
    mm_prediction_free(&full);
    mm_prediction_free(&sel);
}
END_TEST

/* create_selective_checkpoint_contexts needs a non-reentrant checkpoint */
START_TEST(selective_op_refused_with_reentrant_checkpoints)
{
    mm_error e;
    mm_spec *s = unit_tiny("  gradient_checkpointing: {enabled: true, use_reentrant: true, "
                           "granularity: selective_op}\n", &e);
    ck_assert(s == NULL);
    ck_assert_msg(strstr(e.msg, "granularity") && strstr(e.msg, "use_reentrant: false"), "%s", e.msg);
    /* not given: non-reentrant even where transformers 4.x would default to reentrant */
    const char *sel = "  gradient_checkpointing: {granularity: selective_op}\n";
    char old[256];
    snprintf(old, sizeof old, "%sframework: {transformers_version: \"4.46\"}\n", sel);
    mm_prediction a = unit_tiny_predict(sel), b = unit_tiny_predict(old);
    ck_assert_uint_eq(a.allocated_peak_bytes, b.allocated_peak_bytes);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
}
END_TEST

Suite *compile_suite(void)
{
    Suite *s = suite_create("compile");
    TCase *tc = tcase_create("compile");
    tcase_add_test(tc, torch_compile_is_judged_by_the_eager_bound);
    tcase_add_test(tc, torch_compile_under_fsdp2_is_judged_by_the_eager_bound);
    tcase_add_test(tc, torch_compile_refused_where_no_bound_is_shown);
    tcase_add_test(tc, selective_op_keeps_what_the_policy_saves);
    tcase_add_test(tc, selective_op_refused_with_reentrant_checkpoints);
    suite_add_tcase(s, tc);
    return s;
}
