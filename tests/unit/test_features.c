/* test_features.c - training features beyond the plain step (issue 14): each
 * changes what it claims, checked against quantities computed here. */
#include "predict.h"
#include "unit.h"
#include "mmguard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set(mm_spec *s, const char *kv)
{
    mm_error e;
    ck_assert_msg(mm_spec_set(s, kv, &e) == 0, "%s: %s", kv, e.msg);
}

/* torchtune/TRL activation offloading: what leaves the device waits on the
 * host (host_peak_bytes), and the device peak drops by no more than that */
START_TEST(offloaded_activations_wait_on_the_host)
{
    const char *names[] = {"llama-3.1-8b-full", "qwen2.5-vl-7b-lora", "llava-1.5-7b-finetune"};
    for (size_t i = 0; i < 3; i++) {
        mm_error e;
        mm_prediction a, b;
        mm_spec *s = unit_preset(names[i]);
        ck_assert(mm_spec_set(s, "training.gradient_checkpointing=false", &e) == 0);
        ck_assert_msg(mm_predict(s, &a, &e) == 0, "%s", e.msg);
        ck_assert(mm_spec_set(s, "training.activation_offloading=true", &e) == 0);
        ck_assert_msg(mm_predict(s, &b, &e) == 0, "%s", e.msg);
        ck_assert_msg(b.allocated_peak_bytes < a.allocated_peak_bytes, "%s: offloading did not "
                      "lower the device peak", names[i]);
        ck_assert_msg(b.host_peak_bytes > a.host_peak_bytes &&
                      b.host_peak_bytes - a.host_peak_bytes >=
                          a.allocated_peak_bytes - b.allocated_peak_bytes,
                      "%s: %llu bytes left the device but only %llu arrived on the host",
                      names[i], (unsigned long long)(a.allocated_peak_bytes - b.allocated_peak_bytes),
                      (unsigned long long)(b.host_peak_bytes - a.host_peak_bytes));
        mm_prediction_free(&a);
        mm_prediction_free(&b);
        mm_spec_free(s);
    }
}
END_TEST

/* PEFT modules_to_save: trainable copies beside the frozen originals; a tied
 * lm_head's copy is its own (V x h) */
START_TEST(modules_to_save_adds_trainable_copies)
{
    mm_spec *s = unit_preset("qwen2.5-vl-7b-lora");
    mm_prediction a = unit_predict(s);
    set(s, "language_model.lora={r: 8, lora_alpha: 16, lora_dropout: 0, target_modules: "
           "all-linear, modules_to_save: [embed_tokens, lm_head]}");
    mm_prediction b = unit_predict(s);
    uint64_t vh = 152064ull * 3584; /* Qwen2.5-VL-7B: vocab x hidden, untied */
    ck_assert_uint_eq(b.parameters_count, a.parameters_count + 2 * vh);
    ck_assert_uint_eq(b.trainable_count, a.trainable_count + 2 * vh);
    /* their gradients and AdamW states (3 x 2 bytes in pure bf16) are on the GPU */
    ck_assert_uint_gt(b.phase_peak[MM_PHASE_OPTIMIZER],
                      a.phase_peak[MM_PHASE_OPTIMIZER] + 2 * vh * 2 * 3);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
    mm_error e;
    ck_assert(mm_spec_set(s, "language_model.lora={r: 8, target_modules: all-linear, "
                             "modules_to_save: [lm_haed]}", &e) != 0);
    ck_assert_msg(strstr(e.msg, "did you mean 'lm_head'") != NULL, "%s", e.msg);
    ck_assert(mm_spec_set(s, "vision_tower.lora={r: 8, target_modules: all-linear, "
                             "modules_to_save: [lm_head]}", &e) != 0);
    ck_assert_msg(strstr(e.msg, "only the language model") != NULL, "%s", e.msg);
    mm_spec_free(s);
}
END_TEST

Suite *features_suite(void)
{
    Suite *s = suite_create("features");
    TCase *tc = tcase_create("features");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, offloaded_activations_wait_on_the_host);
    tcase_add_test(tc, modules_to_save_adds_trainable_copies);
    suite_add_tcase(s, tc);
    return s;
}
