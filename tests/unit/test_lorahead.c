/* test_lorahead.c - LoRA on the decoder's lm_head and embed_tokens (issue 23):
 * each target adds PEFT's adapters (counted exactly here) and the tensors of
 * their forward and backward; the combinations PEFT would not train are refused. */
#include "predict.h"
#include "unit.h"
#include "mmguard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Qwen2.5-VL-7B's language model (contrib/models/qwen2.5-vl-7b-lora.yaml):
 * vocabulary, width, tokens per step (micro batch 1 x seq_len 2048) */
#define V 152064ull
#define H 3584ull
#define T 2048ull
#define LIN "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"

static mm_spec *load(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/contrib/models/qwen2.5-vl-7b-lora.yaml", SRCDIR);
    mm_error e;
    mm_spec *s = mm_spec_load_file(path, &e);
    ck_assert_msg(s != NULL, "%s", e.msg);
    return s;
}

/* the prediction with LoRA r8 on `targets` of the language model */
static mm_prediction with_targets(mm_spec *s, const char *targets)
{
    char kv[512];
    snprintf(kv, sizeof kv, "language_model.lora={r: 8, lora_alpha: 16, lora_dropout: 0, "
                            "target_modules: %s}", targets);
    return unit_set_predict(s, kv);
}

/* lm_head: lora_A (r x h) and lora_B (V x r) train; all-linear leaves the head
 * out, as PEFT's does.  The fp32 adapters (PEFT's autocast_adapter_dtype on the
 * bf16 model) keep the head input's fp32 copy (_cast_input_dtype, saved by
 * lora_A) through the loss's backward, where this job peaks: the peak rises by
 * at least that copy and the adapters' fp32 weights */
START_TEST(lora_on_lm_head_trains_the_adapters)
{
    mm_spec *s = load();
    mm_prediction all = with_targets(s, "all-linear");
    mm_prediction a = with_targets(s, "[" LIN "]");
    mm_prediction b = with_targets(s, "[" LIN ", lm_head]");
    ck_assert_uint_eq(all.trainable_count, a.trainable_count);
    ck_assert_uint_eq(b.trainable_count, a.trainable_count + 8 * (H + V));
    ck_assert_uint_eq(b.parameters_count, a.parameters_count + 8 * (H + V));
    ck_assert_uint_ge(b.allocated_peak_bytes, a.allocated_peak_bytes + T * H * 4 + 8 * (H + V) * 4);
    mm_prediction_free(&all);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
    mm_spec_free(s);
}
END_TEST

/* embed_tokens: lora_embedding_A (r x V) and B (h x r); their output and the
 * sum are T x h tensors, the peak rises by at least the fp32 adapters */
START_TEST(lora_on_embed_tokens_trains_the_adapters)
{
    mm_spec *s = load();
    mm_prediction a = with_targets(s, "[" LIN "]");
    mm_prediction b = with_targets(s, "[" LIN ", embed_tokens]");
    ck_assert_uint_eq(b.trainable_count, a.trainable_count + 8 * (H + V));
    ck_assert_uint_eq(b.parameters_count, a.parameters_count + 8 * (H + V));
    ck_assert_uint_ge(b.allocated_peak_bytes, a.allocated_peak_bytes + 8 * (H + V) * 4);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
    mm_spec_free(s);
}
END_TEST

/* a tied embedding: PEFT wraps each named module on its own (ensure_weight_tying
 * false, its default); the shared V x h weight stays one, each adapter is its own */
START_TEST(tied_head_and_embedding_get_their_own_adapters)
{
    mm_spec *s = load();
    mm_error e;
    ck_assert(mm_spec_set(s, "language_model.tie_word_embeddings=true", &e) == 0);
    mm_prediction a = with_targets(s, "[" LIN "]");
    mm_prediction b = with_targets(s, "[" LIN ", lm_head]");
    mm_prediction c = with_targets(s, "[" LIN ", lm_head, embed_tokens]");
    ck_assert_uint_eq(b.parameters_count, a.parameters_count + 8 * (H + V));
    ck_assert_uint_eq(c.parameters_count, a.parameters_count + 2 * 8 * (H + V));
    ck_assert_uint_eq(c.trainable_count, a.trainable_count + 2 * 8 * (H + V));
    ck_assert_uint_gt(c.allocated_peak_bytes, b.allocated_peak_bytes);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
    mm_prediction_free(&c);
    mm_spec_free(s);
}
END_TEST

static void refused(mm_spec *s, const char *kv, const char *want)
{
    mm_error e;
    ck_assert_msg(mm_spec_set(s, kv, &e) != 0, "%s accepted", kv);
    ck_assert_msg(strstr(e.msg, want) != NULL, "%s: %s", kv, e.msg);
}

/* what PEFT would not train is refused, with the reason */
START_TEST(untrainable_head_targets_are_refused)
{
    mm_spec *s = load();
    refused(s, "language_model.lora={r: 8, target_modules: [lm_head], modules_to_save: [lm_head]}",
            "modules_to_save wins");
    refused(s, "language_model.lora={r: 8, target_modules: [embed_tokens], "
               "modules_to_save: [embed_tokens, lm_head]}", "embed_tokens is in modules_to_save");
    mm_error e;
    ck_assert(mm_spec_set(s, "training.loss=fused_linear", &e) == 0);
    refused(s, "language_model.lora={r: 8, target_modules: [lm_head]}", "needs loss: standard");
    refused(s, "vision_tower.lora={r: 8, target_modules: [embed_tokens]}",
            "not a linear layer of this vision module");
    refused(s, "language_model.lora={r: 8, target_modules: [lm_heads]}", "did you mean 'lm_head'");
    mm_spec_free(s);
}
END_TEST

Suite *lorahead_suite(void)
{
    Suite *s = suite_create("lorahead");
    TCase *tc = tcase_create("lorahead");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, lora_on_lm_head_trains_the_adapters);
    tcase_add_test(tc, lora_on_embed_tokens_trains_the_adapters);
    tcase_add_test(tc, tied_head_and_embedding_get_their_own_adapters);
    tcase_add_test(tc, untrainable_head_targets_are_refused);
    suite_add_tcase(s, tc);
    return s;
}
